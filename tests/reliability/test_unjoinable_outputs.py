"""A request whose outputs cannot be assembled into its final result (a stage sent image chunks of
different shapes) ends with an error instead of waiting forever, and the engine serves the next request."""

from __future__ import annotations

import asyncio

from omnistage import AsyncOmni
from omnistage.params import DiffusionParams
from tests.support.toy_pipelines import image_pipeline


async def final_of(omni: AsyncOmni, prompt: str, rid: str):
    last = None
    async for out in omni.generate(prompt, [DiffusionParams(num_inference_steps=2)], request_id=rid):
        last = out
    return last


def test_unjoinable_outputs_end_the_request_with_an_error() -> None:
    omni = AsyncOmni(image_pipeline(), placement="inline")

    async def scenario():
        # the guard only bounds a regression (a hang); nothing here depends on how long a step takes
        broken = await asyncio.wait_for(final_of(omni, "MALFORMED please", "broken"), 120)
        fine = await asyncio.wait_for(final_of(omni, "a fine picture", "fine"), 120)
        return broken, fine

    try:
        broken, fine = asyncio.run(scenario())
    finally:
        omni._close()
    assert broken.finished and broken.finish_reason == "error" and broken.error is not None
    assert fine.finished and fine.error is None and len(fine.images) == 1
