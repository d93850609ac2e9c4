"""End to end through the public API: a diffusers directory served by `AsyncOmni` with the diffusion engine in
its own stage process. One stage process for the whole file: starting one costs more than the checks."""

from __future__ import annotations

import asyncio

import pytest

from omnistage import AsyncOmni, DiffusionParams
from omnistage.errors import InvalidRequestError, StageError
from omnistage.outputs import Progress
from tests.diffusion.helpers import BASE, model_dir, reference

pytestmark = pytest.mark.e2e
WAN = {**BASE, "num_frames": 5, "num_inference_steps": 3}


def test_async_omni_streams_progress_equals_plain_diffusers_and_reports_bad_input():
    async def collect(omni, prompt, params):
        return [out async for out in omni.generate(prompt, params)]

    async def main():
        async with AsyncOmni(
            model_dir("tiny-wan21-t2v"), dtype="float32", num_threads=1, placement="process"
        ) as omni:
            assert omni.pipeline.modalities == ("video",)
            prompts = ["a cat on a bench", "a red fox in the snow"]
            runs = await asyncio.gather(
                *(collect(omni, p, [DiffusionParams(**WAN, seed=1)]) for p in prompts)  # one entry per stage
            )
            for prompt, updates in zip(prompts, runs, strict=True):
                assert [u.progress for u in updates[:-1]] == [Progress(1, 3), Progress(2, 3)]
                final = updates[-1]
                assert final.finished and final.error is None and final.fps == 16
                expected = reference("tiny-wan21-t2v", prompt, seed=1, num_inference_steps=3)
                assert (final.video - expected).abs().max() <= 1e-4
                assert final.metrics["computed_steps"] == 3
            bad = await collect(omni, "a cat", DiffusionParams(**{**WAN, "height": 36}))
            assert len(bad) == 1 and bad[0].finished and bad[0].finish_reason == "error"
            # The engine names the field; the orchestrator surfaces it as the stage's error.
            assert isinstance(bad[0].error, StageError | InvalidRequestError) and "height" in str(
                bad[0].error
            )

    asyncio.run(main())
