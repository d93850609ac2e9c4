"""Higgs Audio v2 serving against its reference, in one run, on a checkpoint with the released widths and
fewer layers (omnistage/families/higgs_audio_v2/tiny.py `BENCH`: 3072 wide, 4 of 28 layers, 8 codebooks of
1026 codes; its codec; random weights).

The reference (transformers' `HiggsAudioV2ForConditionalGeneration`) speaks each text as its users call it,
one request at a time on every core: `apply_chat_template`, greedy `generate`, `processor.decode`; it gives
no audio before the whole waveform. omnistage serves the same greedy requests through `AsyncOmni` on the
family's default deployment (talker and codec decoder each in its own process, async chunk) and streams.
Targets (issue 55): time to first audio ≤ 0.25x the reference's time to its whole waveform,
audio-seconds per second at concurrency 8 ≥ 3x the reference's.

    python benchmarks/higgs_audio_v2.py [--requests 8] [--frames 80] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tts_against_reference import TEXTS, bench_main  # noqa: E402
from omnistage.families.higgs_audio_v2.pipeline import SYSTEM  # noqa: E402
from omnistage.families.higgs_audio_v2.tiny import bench_higgs_dir  # noqa: E402

RATE = 24000


def reference(model_dir: Path, frames: int, dtype: str):
    """One request as the model card calls it (greedy)."""
    from transformers import AutoProcessor, HiggsAudioV2ForConditionalGeneration

    processor = AutoProcessor.from_pretrained(str(model_dir))
    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(
        str(model_dir), dtype=getattr(torch, dtype)
    ).eval()

    def one(text: str) -> torch.Tensor:
        messages = [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
            {"role": "user", "content": [{"type": "text", "text": text}]},
        ]
        inputs = processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
        )
        with torch.inference_mode():
            codes = model.generate(**inputs, do_sample=False, max_new_tokens=frames)
            return torch.as_tensor(processor.decode(codes))  # no voice clip: the frames are all generated

    return one


def main() -> None:
    bench_main(__doc__, "Higgs Audio v2", bench_higgs_dir, reference, TEXTS, RATE, (80, "25 a second"))


if __name__ == "__main__":
    main()
