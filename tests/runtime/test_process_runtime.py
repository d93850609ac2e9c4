"""The stage-graph runtime with process placement: streaming, abort, faults, fan-in, cleanup."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
import torch

from omnistage import AsyncOmni, Omni, SamplingParams
from omnistage.connectors.shm import live_segments
from omnistage.errors import InvalidRequestError, OverloadedError, StageDeadError, StageError
from omnistage.serving.app import create_app
from tests.support.polling import wait_until, wait_until_async
from tests.support.toy_stages import ToyVocoder, fan_in_pipeline, open_gate, speech_pipeline

pytestmark = pytest.mark.e2e


async def collect(omni, prompt, params=None, **kw):
    return [out async for out in omni.generate(prompt, params, **kw)]


async def wait_idle(omni, timeout=60.0):
    """Stage stats once every stage has dropped its requests."""

    async def idle_stats():
        stats = await omni.stats()
        idle = all(
            s["result"]["num_requests"] == 0 and s["result"]["worker_requests"] == 0 for s in stats["stages"]
        )
        return stats if idle else None

    return await wait_until_async(idle_stats, timeout, "every stage idle")


async def test_async_chunk_streams_audio_before_stage0_finishes(speech_omni, gates):
    # The thinker holds its last token at a gate: audio can only reach us before the thinker finishes if
    # it streams; the gate opens once the first audio chunk is here.
    outs = []
    async for out in speech_omni.generate("hello HOLD:order", SamplingParams(max_tokens=12)):
        outs.append(out)
        if out.delta_audio is not None and len([o for o in outs if o.delta_audio is not None]) == 1:
            assert not out.finished and not any(o.stage_id == 0 and o.finished for o in outs)
            open_gate(gates, "order")
    final = outs[-1]
    assert final.finished and final.error is None and sum(o.finished for o in outs) == 1
    audio_updates = [o for o in outs if o.delta_audio is not None]
    assert len(audio_updates) >= 3  # streamed in chunks
    # ordering (not speed): the first audio chunk reached the caller before stage 0 had finished
    assert final.metrics["first_audio_s"] < final.metrics["stage0_done_s"]
    first_audio_index = outs.index(audio_updates[0])
    assert any(o.delta_token_ids and o.stage_id == 0 for o in outs[first_audio_index:])
    # the streamed audio is the vocoder's output for the talker's codes, and big chunks went through shm
    assert len(final.token_ids) == 12 and final.audio.shape == (12 * 12000,)
    assert torch.equal(final.audio, torch.cat([o.delta_audio for o in audio_updates]))
    stats = await speech_omni.stats()
    assert stats["payloads"]["received"] >= len(audio_updates)
    edge = stats["edges"]["0->1"]  # the thinker's hidden rows ride along with each chunk
    assert edge["transfers"] >= 12 and edge["bytes"] >= 12 * 16 * 4
    assert not live_segments(os.getpid())


async def test_text_only_request_never_enters_speech_stages(speech_omni):
    before = {s["stage_id"]: s["result"]["requests_started"] for s in (await speech_omni.stats())["stages"]}
    outs = await collect(speech_omni, "hi", SamplingParams(max_tokens=3), modalities=["text"])
    assert outs[-1].finished and len(outs[-1].token_ids) == 3 and outs[-1].audio is None
    after = {s["stage_id"]: s["result"]["requests_started"] for s in (await speech_omni.stats())["stages"]}
    assert after[0] == before[0] + 1 and after[1] == before[1] and after[2] == before[2]


async def test_abort_mid_flight_leaves_nothing_behind(speech_omni):
    # held at a gate nobody opens: the request is still running whenever the abort arrives
    gen = speech_omni.generate("abort me HOLD:never", SamplingParams(max_tokens=20), request_id="to-abort")
    async for out in gen:
        if out.delta_audio is not None:
            break
    await speech_omni.abort("to-abort")
    rest = [out async for out in gen]
    assert len(rest) >= 1 and rest[-1].finished and rest[-1].finish_reason == "abort"
    assert sum(o.finished for o in rest) == 1
    stats = await wait_idle(speech_omni)
    for stage in stats["stages"]:
        assert stage["result"]["num_requests"] == 0 and stage["result"]["worker_requests"] == 0
    assert stats["requests"]["tracked"] == 0
    assert not live_segments(os.getpid())


async def test_stage_exception_fails_only_its_request(speech_omni):
    good = asyncio.ensure_future(collect(speech_omni, "fine", SamplingParams(max_tokens=5)))
    bad = await collect(speech_omni, "BOOM please", SamplingParams(max_tokens=5))
    assert len(bad) == 1 and bad[0].finished and bad[0].finish_reason == "error"
    assert isinstance(bad[0].error, StageError)
    assert "stage 0 (thinker)" in str(bad[0].error) and "RuntimeError" in str(bad[0].error)
    good_outs = await good
    assert good_outs[-1].error is None and len(good_outs[-1].token_ids) == 5


async def test_an_output_that_breaks_the_message_schema_fails_its_request_and_frees_everything(speech_omni):
    """A stage that sends a value its message does not declare (here a float `stop_reason`; in the field, an
    int one did so) fails that request with the reason, where the message was dropped and the request
    waited forever; the stages go idle, no shared memory is left, and the next request is served."""
    # the bound only turns a regression (a request that waits forever) into a failure
    bad = await asyncio.wait_for(collect(speech_omni, "UNREADABLE please", SamplingParams(max_tokens=4)), 120)
    assert bad[-1].finished and bad[-1].finish_reason == "error" and isinstance(bad[-1].error, StageError)
    assert "stage 0 (thinker)" in str(bad[-1].error) and "stop_reason" in str(bad[-1].error)
    stats = await wait_idle(speech_omni)
    assert stats["requests"]["tracked"] == 0 and not live_segments(os.getpid())
    good = await collect(speech_omni, "fine", SamplingParams(max_tokens=4))
    assert good[-1].error is None and len(good[-1].token_ids) == 4


async def test_disconnecting_caller_aborts_everywhere(speech_omni):
    async def consume_two():
        n = 0
        async for _ in speech_omni.generate("leave early HOLD:never", SamplingParams(max_tokens=20)):
            n += 1
            if n == 2:
                return

    await consume_two()
    stats = await wait_idle(speech_omni)
    assert all(s["result"]["num_requests"] == 0 for s in stats["stages"])
    assert stats["requests"]["tracked"] == 0 and not live_segments(os.getpid())


def test_inline_placement_matches_process_placement(speech_omni):
    params = SamplingParams(max_tokens=6)
    with Omni(speech_pipeline(), placement="inline") as inline:
        inline_out = inline.generate(["same prompt", "another"], params, use_tqdm=False)
    process_out = asyncio.run(collect(speech_omni, "same prompt", params))[-1]
    assert inline_out[0].token_ids == process_out.token_ids
    assert torch.equal(inline_out[0].audio, process_out.audio)
    assert inline_out[1].request_id != inline_out[0].request_id and inline_out[1].error is None


async def test_params_and_admission_validation(speech_omni):
    with pytest.raises(InvalidRequestError, match="3 stages") as err:
        await collect(speech_omni, "x", [SamplingParams()])
    assert err.value.param == "params"
    with pytest.raises(InvalidRequestError, match="prompt"):
        await collect(speech_omni, None)
    with pytest.raises(InvalidRequestError, match="modalities"):
        await collect(speech_omni, "x", modalities=["video"])
    limit = speech_omni.max_queued_requests
    speech_omni.max_queued_requests = 1
    try:
        first = speech_omni.generate("held HOLD:never", SamplingParams(max_tokens=5), request_id="only")
        await first.__anext__()
        with pytest.raises(OverloadedError):
            await collect(speech_omni, "second")
        await first.aclose()
    finally:
        speech_omni.max_queued_requests = limit


async def test_fan_in_stage_runs_once_after_both_inputs():
    async with AsyncOmni(fan_in_pipeline(), placement="process") as omni:
        outs = await collect(omni, "join us", [SamplingParams(max_tokens=4), None, None])
        stats = {s["stage_id"]: s["result"] for s in (await omni.stats())["stages"]}
    final = outs[-1]
    assert final.error is None and stats[2]["requests_started"] == 1
    # the join saw both inputs: 4 tokens from "left" and one code per prompt byte from "right"
    assert len(final.token_ids) == 4 + len("join us")


async def test_killed_stage_fails_its_requests_and_health_turns_503():
    # No gate_dir: a held request is held until it ends otherwise. The vocoder stays dead when it dies
    # (tests/reliability shows a replica restarting on its own).
    omni = AsyncOmni(speech_pipeline(), stage_overrides={"2": {"max_restarts": 0}})
    try:
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app({"toy": omni})), base_url="http://test"
        )
        assert (await client.get("/health")).status_code == 200
        gens = [omni.generate(f"p{i} HOLD:never", SamplingParams(max_tokens=8)) for i in range(3)]
        for gen in gens:
            await gen.__anext__()
        vocoder_pid = omni.health()["stages"][2]["replicas"][0]["pid"]
        os.kill(vocoder_pid, signal.SIGKILL)

        async def last(gen):
            outs = [out async for out in gen]
            return outs[-1]

        finals = await asyncio.wait_for(asyncio.gather(*(last(g) for g in gens)), timeout=60)
        for final in finals:
            assert isinstance(final.error, StageDeadError) and "stage 2 (vocoder)" in str(final.error)
        response = await client.get("/health")
        assert response.status_code == 503
        stages = response.json()["models"]["toy"]["stages"]
        assert [s["alive"] for s in stages] == [True, True, False]
        # the orchestrator keeps serving what does not need the dead stage, and refuses what does
        text = await collect(omni, "still here", SamplingParams(max_tokens=2), modalities=["text"])
        assert text[-1].error is None and len(text[-1].token_ids) == 2
        speech = await collect(omni, "needs audio", SamplingParams(max_tokens=2))
        assert isinstance(speech[-1].error, StageDeadError)
        await client.aclose()
    finally:
        await omni.shutdown()
    assert not live_segments(os.getpid())


def test_killing_the_parent_leaves_no_stage_process(tmp_path: Path):
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(f"""
        import signal, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from omnistage import AsyncOmni
        from tests.support.toy_stages import speech_pipeline
        omni = AsyncOmni(speech_pipeline())
        pids = [r["pid"] for s in omni.health()["stages"] for r in s["replicas"]]
        print(" ".join(map(str, pids)), flush=True)
        signal.pause()  # until killed
    """)
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3 and all(Path(f"/proc/{p}").exists() for p in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_until(lambda: not any(_running(p) for p in pids), what="every stage process gone")
    finally:
        parent.kill()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_vocoder_reference_is_deterministic():
    a, b = ToyVocoder(10), ToyVocoder(10)
    codes = torch.arange(6)
    assert torch.equal(a.generate([codes], [None])[0], b.generate([codes], [None])[0])
