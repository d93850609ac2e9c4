"""Qwen2.5-Omni through the runtime: the bundled deployments, streaming audio, text-only requests."""

import pytest

from omnistage import AsyncOmni, SamplingParams
from omnistage.errors import StageError
from tests.qwen2_5_omni.conftest import PROMPTS, assert_async_audio_close, greedy_params

pytestmark = pytest.mark.e2e


async def collect(omni, prompt, params=None, modalities=None):
    outs = [out async for out in omni.generate(prompt, params, modalities=modalities)]
    assert sum(o.finished for o in outs) == 1 and outs[-1].finished
    return outs


async def started(omni) -> dict[int, int]:
    """Requests each stage has started, summed over its replicas."""
    totals: dict[int, int] = {}
    for s in (await omni.stats())["stages"]:
        totals[s["stage_id"]] = totals.get(s["stage_id"], 0) + s["result"]["requests_started"]
    return totals


async def test_default_deploy_streams_audio_and_skips_speech_for_text_only(omni_dir, references):
    """One process per stage replica (code2wav has two), async chunk: audio arrives in pieces while the talker
    still speaks."""
    async with AsyncOmni(str(omni_dir)) as omni:
        stages = omni.health()["stages"]
        assert [s["alive"] for s in stages] == [True, True, True]
        assert [len(s["replicas"]) for s in stages] == [1, 1, 2]
        assert len({r["pid"] for s in stages for r in s["replicas"]}) == 4
        ref = references["text"]
        outs = await collect(omni, PROMPTS["text"], greedy_params())
        final = outs[-1]
        assert final.error is None and final.token_ids == ref.text_ids
        audio_updates = [o for o in outs if o.delta_audio is not None and o.delta_audio.numel()]
        assert len(audio_updates) >= 2 and not audio_updates[0].finished
        assert final.sample_rate == 24000
        assert_async_audio_close(final.audio, ref.waveform, omni_dir)

        before = await started(omni)
        # A long prompt: the thinker's hidden states come back partly through shared memory.
        long_text = "Hello there. " * 30
        text_only = await collect(
            omni, long_text, SamplingParams(temperature=0, max_tokens=4), modalities=["text"]
        )
        after = await started(omni)
        final = text_only[-1]
        assert final.error is None and len(final.token_ids) == 4 and final.audio is None
        assert after[0] == before[0] + 1 and (after[1], after[2]) == (before[1], before[2])


async def test_inline_full_handoff_matches_reference_exactly(omni_dir, references):
    """One process, full handoff: the waveform is the reference's; a bad speaker fails, naming it."""
    deploy = "omnistage/families/qwen2_5_omni/qwen2_5_omni_inline.yaml"
    async with AsyncOmni(str(omni_dir), deploy, stage_overrides={"2": {"async_chunk": False}}) as omni:
        ref = references["image"]
        final = (await collect(omni, PROMPTS["image"], greedy_params()))[-1]
        assert final.error is None and final.token_ids == ref.text_ids
        assert float((final.audio - ref.waveform).abs().max()) <= 1e-4
        bad = (await collect(omni, {"prompt": "Hi", "speaker": "Nobody"}, greedy_params()))[-1]
        assert isinstance(bad.error, StageError) and "speaker" in str(bad.error)
