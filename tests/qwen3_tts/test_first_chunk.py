"""The codec stage's first chunk (time to first audio): a fixed size, or chosen by load among sizes such as
[2, 4, 8, 16] frames as each request arrives, or the request's own `first_chunk_frames`, then 25-frame chunks;
a request arriving during a pass speaks after the window in progress; and context-only frames (a cloned
voice's clip codes) are decoded as context and never emitted."""

from __future__ import annotations

import pytest
import torch

from omnistage.stages.base import StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.qwen3_tts.test_codec import FRAME, engine

pytestmark = pytest.mark.engine


def codes(seed: int, frames: int) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


def first_outputs(eng, requests: list[StageRequest]) -> dict[str, int]:
    """Each request's first output, in frames, with 30 frames of each request already arrived."""
    for req in requests:
        eng.add_request(req)
    got: dict[str, int] = {}
    for _ in range(100):
        for out in eng.step():
            got.setdefault(out.request_id, len(out.audio) // FRAME)
        if len(got) == len(requests):
            return got
    raise AssertionError(f"no first output for {set(r.request_id for r in requests) - set(got)}")


def test_first_chunk_follows_load_and_the_request() -> None:
    eng = engine(async_chunk=True, chunk_frames=25, first_chunk_frames=[2, 4, 8, 16])
    assert eng.max_num_seqs == 8
    reqs = [
        StageRequest(f"r{i}", inputs=GenerationInputs(codes(i, 30)), streaming_input=True) for i in range(8)
    ]
    got = first_outputs(eng, reqs)
    # arrival k of 8 (load k/8): 2 frames alone, 4 at a quarter to half, 8 at half, 16 when nearly full
    assert [got[f"r{i}"] for i in range(8)] == [2, 4, 4, 8, 8, 16, 16, 16]
    eng = engine(async_chunk=True, chunk_frames=25, first_chunk_frames=[2, 4, 8, 16])
    asked = [
        StageRequest(
            "three", inputs=GenerationInputs(codes(1, 30), first_chunk_frames=3), streaming_input=True
        ),
        StageRequest(
            "zero", inputs=GenerationInputs(codes(2, 30), first_chunk_frames=0), streaming_input=True
        ),
    ]
    assert first_outputs(eng, asked) == {"three": 3, "zero": 25}


def test_context_frames_are_decoded_never_emitted() -> None:
    """Full handoff: the clip's 12 frames are context for the request's 10 (its audio is that span of the
    one-pass decode of all 22); async chunk: the first chunk's window reaches back into them."""
    clip, new = codes(3, 12), codes(4, 10)
    whole = torch.cat([clip, new])
    full = engine(async_chunk=False)
    with torch.no_grad():
        one_pass = full.generator.codec(whole.T[None])[0, 0]
    full.add_request(StageRequest("r", inputs=GenerationInputs(whole, context_frames=12)))
    (out,) = full.step()
    assert out.finished and out.audio.shape == (10 * FRAME,)
    assert float((out.audio - one_pass[12 * FRAME :]).abs().max()) <= 1e-5
    chunked = engine(async_chunk=True, chunk_frames=25, first_chunk_frames=4, left_context_frames="exact")
    head = GenerationInputs(whole[:16], context_frames=12)
    chunked.add_request(StageRequest("r", inputs=head, streaming_input=True))
    (first,) = chunked.step()
    assert first.audio.shape == (4 * FRAME,)
    assert float((first.audio - one_pass[12 * FRAME : 16 * FRAME]).abs().max()) <= 5e-4


def test_a_new_request_speaks_between_the_windows_of_a_running_pass() -> None:
    """A pass decodes its requests' windows one at a time, each sent when decoded: a request arriving while
    it runs has its first chunk decoded after the window in progress, not after the whole pass."""
    eng = engine(async_chunk=True, chunk_frames=25, first_chunk_frames=1)
    playing = [f"p{i}" for i in range(3)]
    for i, rid in enumerate(playing):
        eng.add_request(StageRequest(rid, inputs=GenerationInputs(codes(i, 1)), streaming_input=True))
    assert sorted(outputs_in_order(eng, 3)) == playing  # their first chunks
    for i, rid in enumerate(playing):  # 25 more frames each: one catch-up pass of three windows
        eng.add_chunk(rid, GenerationInputs(codes(10 + i, 25)), last=False)
    # the pass has decoded its first window, sent at once (not with the pass's last)
    assert [out.request_id for out in eng.step()] == ["p0"]
    eng.add_request(StageRequest("new", inputs=GenerationInputs(codes(9, 1)), streaming_input=True))
    assert outputs_in_order(eng, 3) == ["new", "p1", "p2"]


def outputs_in_order(eng, count: int) -> list[str]:
    order: list[str] = []
    for _ in range(20):
        order += [out.request_id for out in eng.step()]
        if len(order) >= count:
            return order
    raise AssertionError(f"only {order} after 20 steps")
