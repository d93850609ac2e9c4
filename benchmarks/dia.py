"""Dia serving against its reference, in one run, on a checkpoint with Dia-1.6B's widths and fewer layers
(omnistage/families/dia/tiny.py `BENCH`: 2 encoder and 4 decoder layers; the 44.1 kHz DAC; random weights).

The reference (transformers' `DiaForConditionalGeneration`) speaks each script as its users call it, one
request at a time on every core: `DiaProcessor`, `generate`, `batch_decode`; it gives no audio before the
whole waveform. Both sides decode greedily with the checkpoint's classifier-free guidance (scale 3.0, its
top-k 45: a request's decoder beside its unconditional twin, twice the decoder rows). omnistage serves the
same requests through `AsyncOmni` on the family's default deployment (decoder and DAC each in its own
process, async chunk) and streams. Targets (issue 55): time to first audio ≤ 0.25x the reference's time to
its whole waveform, audio-seconds per second at concurrency 8 ≥ 3x the reference's.

    python benchmarks/dia.py [--requests 8] [--frames 129] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tts_against_reference import bench_main  # noqa: E402
from omnistage.families.dia.tiny import bench_dia_dir  # noqa: E402

RATE = 44100
TEXTS = [
    "[S1] The weather is nice today. [S2] We could take a walk in the park after lunch.",
    "[S1] Please open the door for me. [S2] My hands are full of groceries.",
    "[S1] I would like a cup of coffee, with a little milk and no sugar.",
    "[S2] Turn left at the next corner; the station is on your right.",
    "[S1] Good morning, everyone. [S2] Today we will talk about the printing press.",
    "[S1] The train to the city leaves at seven. Be sure to arrive early.",
    "[S2] She opened the window and listened to the rain falling on the roof.",
    "[S1] Thank you for calling. [S2] Your order has shipped and should arrive on Friday.",
]


def reference(model_dir: Path, frames: int, dtype: str):
    """One request as the model card calls it (the checkpoint's guidance), greedy."""
    from transformers import DiaForConditionalGeneration, DiaProcessor

    processor = DiaProcessor.from_pretrained(str(model_dir))
    model = DiaForConditionalGeneration.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).eval()

    def one(text: str) -> torch.Tensor:
        inputs = processor(text=[text], padding=True, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=frames, do_sample=False)
            assert model._uses_cfg
            return processor.batch_decode(out)[0]

    return one


def main() -> None:
    # the guidance's top-k is the request's: the checkpoint's, as the reference reads it
    bench_main(
        __doc__,
        "Dia",
        bench_dia_dir,
        reference,
        TEXTS,
        RATE,
        (129, "86 a second"),
        sampling={"top_k": 45},
        rows_per_request=2,
    )


if __name__ == "__main__":
    main()
