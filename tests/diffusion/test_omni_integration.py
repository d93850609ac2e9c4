"""End to end through the public API: a diffusers directory served by `Omni` / `AsyncOmni` with the diffusion
engine in its own stage process."""

from __future__ import annotations

import asyncio

import pytest

from omnistage import AsyncOmni, DiffusionParams, Omni
from omnistage.errors import InvalidRequestError, StageError
from tests.diffusion.helpers import BASE, model_dir, reference

pytestmark = pytest.mark.e2e
WAN = {**BASE, "num_frames": 5}


def test_omni_generate_equals_plain_diffusers():
    with Omni(model_dir("tiny-wan21-t2v"), dtype="float32", num_threads=1, placement="process") as omni:
        assert omni.pipeline.modalities == ("video",)
        outs = omni.generate(
            ["a cat on a bench", "a red fox in the snow"],
            [DiffusionParams(**WAN, seed=1)],  # one entry per stage
            use_tqdm=False,
        )
        assert [o.finished for o in outs] == [True, True]
        for out, prompt in zip(outs, ["a cat on a bench", "a red fox in the snow"], strict=True):
            assert out.error is None and out.fps == 16
            expected = reference("tiny-wan21-t2v", prompt, seed=1)
            assert (out.video - expected).abs().max() <= 1e-4
            assert out.data["metrics"]["computed_steps"] == 2


def test_async_omni_streams_progress_and_reports_bad_input():
    async def main():
        async with AsyncOmni(
            model_dir("tiny-sd3"), dtype="float32", num_threads=1, placement="process"
        ) as omni:
            params = DiffusionParams(**{**BASE, "num_inference_steps": 3, "output_format": "png"}, seed=2)
            updates = [out async for out in omni.generate("a cat", params)]
            assert [u.progress for u in updates[:-1]] == [{"step": 1, "total": 3}, {"step": 2, "total": 3}]
            final = updates[-1]
            assert final.finished and final.error is None and len(final.images) == 1
            assert final.images[0].size == (32, 32)
            bad = [out async for out in omni.generate("a cat", DiffusionParams(**{**BASE, "height": 36}))]
            assert len(bad) == 1 and bad[0].finished and bad[0].finish_reason == "error"
            # The engine names the field; the orchestrator surfaces it as the stage's error.
            assert isinstance(bad[0].error, StageError | InvalidRequestError) and "height" in str(
                bad[0].error
            )

    asyncio.run(main())
