"""Sesame CSM serving against its reference, in one run, on a checkpoint with csm-1b's widths and fewer
layers (omnistage/families/csm/tiny.py `BENCH`: backbone 2048 wide, 4 of 16 layers; depth decoder 1024 wide,
2 of 4 layers; 32 codebooks of 2051 codes; the released Mimi's widths; random weights, so no frame is the
all-EOS one and every request speaks its whole frame budget).

The reference (transformers' `CsmForConditionalGeneration`) speaks each text as its users call it, one
request at a time on every core: `AutoProcessor.apply_chat_template`, then greedy `generate(...,
output_audio=True)`; it gives no audio before the whole waveform. omnistage serves the same greedy requests
through `AsyncOmni` on the family's default deployment (backbone and Mimi decoder each in its own process,
async chunk) and streams: time to first audio at concurrency 1, audio-seconds per second at concurrency 8 (a
closed loop of 8 in flight), RTF (a request's latency / its audio length, p50). Targets (issue 55): time to
first audio ≤ 0.25x the reference's time to its whole waveform, audio-seconds per second ≥ 3x the
reference's.

Both sides compute in the same dtype: the checkpoint's (`--dtype`, float32 or bfloat16; bf16 where the CPU
computes it natively, AVX512-BF16 or AMX).

    python benchmarks/csm.py [--requests 8] [--frames 32] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tts_against_reference import TEXTS, bench_main  # noqa: E402
from omnistage.families.csm.tiny import bench_csm_dir  # noqa: E402
from omnistage.prompts import SpeechPrompt  # noqa: E402

RATE = 24000
SPEAKER = 0


def reference(model_dir: Path, frames: int, dtype: str):
    """One request as the model card calls it: the chat template, then greedy `generate(...,
    output_audio=True)`."""
    from transformers import AutoProcessor, CsmForConditionalGeneration

    processor = AutoProcessor.from_pretrained(str(model_dir))
    model = CsmForConditionalGeneration.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).eval()

    def one(text: str) -> torch.Tensor:
        conversation = [{"role": str(SPEAKER), "content": [{"type": "text", "text": text}]}]
        inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
        with torch.inference_mode():
            audio = model.generate(
                **inputs,
                max_new_tokens=frames,
                do_sample=False,
                depth_decoder_do_sample=False,
                output_audio=True,
            )
        return audio[0]

    return one


def main() -> None:
    prompt = lambda text: SpeechPrompt(input=text, speaker=str(SPEAKER))  # noqa: E731
    bench_main(__doc__, "CSM", bench_csm_dir, reference, TEXTS, RATE, (32, "12.5 a second"), prompt)


if __name__ == "__main__":
    main()
