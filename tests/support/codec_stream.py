"""Feed code frames into a codec stage's generation engine as its upstream would stream them."""

from __future__ import annotations

import torch

from omnistage.stages.base import StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs


def stream(eng, codes: list[torch.Tensor], piece: int) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """Request `r{i}` gets `codes[i]`'s frames `piece` at a time; step until every request ends. Each
    request's audio, its chunks joined."""
    audio: dict[str, list[torch.Tensor]] = {f"r{i}": [] for i in range(len(codes))}
    for i, c in enumerate(codes):
        eng.add_request(StageRequest(f"r{i}", inputs=GenerationInputs(c[:piece]), streaming_input=True))
    fed, finished = [min(piece, len(c)) for c in codes], set()
    ending = list(range(len(codes)))  # requests whose last chunk is still to come
    for _ in range(10_000):
        for i in list(ending):
            new = codes[i][fed[i] : fed[i] + piece]
            fed[i] += len(new)
            eng.add_chunk(f"r{i}", GenerationInputs(new), last=fed[i] == len(codes[i]))
            if fed[i] == len(codes[i]):
                ending.remove(i)
        for out in eng.step():
            audio[out.request_id].append(out.audio)
            finished |= {out.request_id} if out.finished else set()
        if len(finished) == len(codes):
            return {rid: torch.cat(parts) for rid, parts in audio.items()}
    raise AssertionError(f"requests never finished: {set(audio) - finished}")
