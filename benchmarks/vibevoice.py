"""VibeVoice serving against its reference, in one run, on a checkpoint with VibeVoice-1.5B's widths and a
quarter of its layers (omnistage/families/vibevoice/tiny.py `BENCH`: a 7-layer, 1536-wide Qwen2 with its
vocabulary, the 4-layer diffusion head, latents of 64 at 3200 samples a frame, acoustic and semantic
tokenizers a quarter as wide; random weights, the LM made to speak until its cap).

The reference (transformers' `VibeVoiceForConditionalGeneration`) speaks each script as its users call it,
one request at a time on every core: `from_pretrained`, `generate(input_ids, max_new_tokens=...)` (the
checkpoint's guidance 1.3 and 10 DPM-Solver steps); it gives no audio before the whole waveform. Its
diffusion noise is replaced by omnistage's per-request, per-step noise (the request's seed), so both sides
make the same frames and the waveforms compare. omnistage serves the same scripts through `AsyncOmni` on the
family's default deployment (LM and audio stage each in its own process, async chunk) and streams. Targets
(issue 56): time to first audio ≤ 0.25x the reference's time to its whole waveform, audio-seconds per second
at concurrency 8 ≥ 3x the reference's.

    python benchmarks/vibevoice.py [--requests 8] [--frames 40] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tts_against_reference import bench_main  # noqa: E402
from omnistage.families.vibevoice.tiny import bench_vibevoice_dir  # noqa: E402
from tests.vibevoice.reference import reference as reference_call  # noqa: E402  (the tests' noise swap)

RATE = 24000
SEED = 0
TEXTS = [
    "Speaker 0: The weather is nice today.\nSpeaker 1: We could take a walk in the park after lunch.",
    "Speaker 0: Please open the door for me. My hands are full of groceries.",
    "Speaker 0: I would like a cup of coffee.\nSpeaker 1: With a little milk and no sugar?",
    "Speaker 0: Turn left at the next corner; the station is on your right.",
    "Speaker 0: Good morning, everyone.\nSpeaker 1: Today we will talk about the printing press.",
    "Speaker 0: The train to the city leaves at seven. Be sure to arrive early.",
    "Speaker 0: She opened the window.\nSpeaker 1: And listened to the rain falling on the roof.",
    "Speaker 0: Thank you for calling. Your order has shipped and should arrive on Friday.",
]


def reference(model_dir: Path, frames: int, dtype: str):
    """One request as the model card calls it (`generate`, its defaults but the length cap), on the prompt
    omnistage builds for the same script."""
    from transformers import AutoTokenizer, VibeVoiceForConditionalGeneration

    from omnistage.families.vibevoice.decoder import marker_ids
    from omnistage.families.vibevoice.prompt import parse_script, prompt_ids

    model = VibeVoiceForConditionalGeneration.from_pretrained(
        str(model_dir), dtype=getattr(torch, dtype)
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = marker_ids(model.config)

    def one(text: str) -> torch.Tensor:
        prompt = prompt_ids(tokenizer, parse_script(text), {}, ids)
        return reference_call(prompt, SEED, "", frames, model=model)[2].float()

    return one


def main() -> None:
    bench_main(
        __doc__,
        "VibeVoice",
        bench_vibevoice_dir,
        reference,
        TEXTS,
        RATE,
        (40, "0.133 s each"),
        sampling={"seed": SEED},
    )


if __name__ == "__main__":
    main()
