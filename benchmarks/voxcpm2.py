"""VoxCPM2 serving against its reference, in one run, on a checkpoint with VoxCPM2's widths and fewer layers
(omnistage/families/voxcpm2/tiny.py `BENCH`: 4 base and 2 residual LM layers, 2 local encoder and DiT
layers, patches of 4 latents of 64; the released VAE's architecture, 16 kHz in, 48 kHz out; random weights).

The reference (the `voxcpm` package's `VoxCPM2Model`) speaks each text as its users call it, one request at a
time on every core: `from_local`, `generate(text, max_len=...)` (guidance 2.0, 10 flow steps: its defaults);
it gives no audio before the whole waveform. Its flow matcher's noise is replaced by omnistage's per-request,
per-step noise (the request's seed), so both sides make the same patches and the waveforms compare. omnistage
serves the same requests through `AsyncOmni` on the family's default deployment (decoder and VAE each in its
own process, async chunk) and streams. Targets (issue 56): time to first audio ≤ 0.25x the reference's time to
its whole waveform, audio-seconds per second at concurrency 8 ≥ 3x the reference's.

    python benchmarks/voxcpm2.py [--requests 8] [--frames 40] [--dtype float32|bfloat16]   # frames: patches
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tts_against_reference import TEXTS, bench_main  # noqa: E402
from omnistage.families.voxcpm2.tiny import bench_voxcpm2_dir  # noqa: E402
from tests.voxcpm2.reference import same_noise  # noqa: E402  (the tests' noise swap, shared)

RATE = 48000
SEED = 0


def reference(model_dir: Path, patches: int, dtype: str):
    """One request as the model card calls it (`generate`, its defaults but the length cap)."""
    from voxcpm.model.voxcpm2 import VoxCPM2Model

    model = VoxCPM2Model.from_local(str(model_dir), optimize=False, device="cpu")
    model = model.to(getattr(torch, dtype))
    model.audio_vae.float()

    def one(text: str) -> torch.Tensor:
        with same_noise(SEED), torch.inference_mode():
            return model.generate(text, max_len=patches)

    return one


def main() -> None:
    bench_main(
        __doc__,
        "VoxCPM2",
        bench_voxcpm2_dir,
        reference,
        TEXTS,
        RATE,
        (40, "patches, 0.16 s each"),
        sampling={"seed": SEED},
    )


if __name__ == "__main__":
    main()
