"""Qwen3-Omni through the runtime in one process (the inline deploy): full handoff into code2wav is the
reference's waveform, text-only requests never reach the talker or code2wav, a bad speaker fails its
request naming the field. The default deploy (three processes) runs behind the server (test_serving.py)."""

import pytest

from omnistage import AsyncOmni, SamplingParams
from tests.qwen3_omni.conftest import PROMPTS, greedy_params

pytestmark = pytest.mark.e2e
DEPLOY = "omnistage/families/qwen3_omni/qwen3_omni_inline.yaml"


async def collect(omni, prompt, params=None, modalities=None):
    outs = [out async for out in omni.generate(prompt, params, modalities=modalities)]
    assert sum(o.finished for o in outs) == 1 and outs[-1].finished
    return outs


async def started(omni) -> dict[int, int]:
    totals: dict[int, int] = {}
    for s in (await omni.stats())["stages"]:
        totals[s["stage_id"]] = totals.get(s["stage_id"], 0) + s["result"]["requests_started"]
    return totals


async def test_inline_full_handoff_text_only_and_bad_speaker(omni3_dir, references):
    async with AsyncOmni(str(omni3_dir), DEPLOY, stage_overrides={"2": {"async_chunk": False}}) as omni:
        ref = references["audio"]
        final = (await collect(omni, PROMPTS["audio"], greedy_params()))[-1]
        assert final.error is None and final.token_ids == ref.text_ids
        assert final.sample_rate == 24000 and final.audio.shape == ref.waveform.shape
        assert float((final.audio - ref.waveform).abs().max()) <= 1e-4

        before = await started(omni)
        params = SamplingParams(temperature=0, max_tokens=4)
        final = (await collect(omni, PROMPTS["audio"], params, modalities=["text"]))[-1]
        after = await started(omni)
        assert final.error is None and final.token_ids == ref.text_ids[:4] and final.audio is None
        assert after[0] == before[0] + 1 and (after[1], after[2]) == (before[1], before[2])

        bad = {"messages": [{"role": "user", "content": "Hi"}], "speaker": "Nobody"}
        final = (await collect(omni, bad, greedy_params()))[-1]
        assert final.error is not None and "speaker" in str(final.error)
