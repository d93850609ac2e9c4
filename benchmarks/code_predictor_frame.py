"""One code-predictor frame (15 forwards of the small decoder and 15 heads) of the Qwen3-Omni talker, through
the model's own forward with transformers' `DynamicCache` and through the lean decoder over a dense
per-frame cache (what the talker stage runs), with the linears as the engine leaves them (packed where oneDNN
can), one thread, at batch 1 and 8. Prints ms a frame and the ratio, and checks the codes are the same.

    python benchmarks/code_predictor_frame.py [--size bench] [--frames 20]
"""

from __future__ import annotations

import argparse
import time

import torch

from omnistage.families.qwen3_omni.checkpoint import qwen3_omni_dir
from omnistage.families.qwen3_omni.loaders import load_talker
from omnistage.families.shared.depth_codes import residual_codes
from omnistage.stages.ar.cpu.packed_linear import pack_linears, packing_available


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="bench", choices=["tiny", "bench"])
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument(
        "--no-pack", action="store_true", help="plain linears (the engine's cpu_packed_linear off)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_talker(str(qwen3_omni_dir(args.size)), torch.float32, "cpu")
    if packing_available() and not args.no_pack:
        for module in (model.decoder, model.head, *model.step_modules):
            pack_linears(module)
    predictor = model.talker.code_predictor

    def frame(hidden: torch.Tensor, code0: torch.Tensor, lean: bool) -> torch.Tensor:
        return residual_codes(
            predictor.model, predictor.lm_head, predictor.model.codec_embedding, hidden, code0, lean=lean
        )[0]

    with torch.inference_mode():
        for batch in (1, 8):
            hidden = torch.randn(
                batch, model.config.hidden_size, generator=torch.Generator().manual_seed(batch)
            )
            code0 = model.embed(torch.arange(batch))
            same = torch.equal(frame(hidden, code0, True), frame(hidden, code0, False))
            ms = {}
            for lean in (False, True):
                for _ in range(3):
                    frame(hidden, code0, lean)
                start = time.perf_counter()
                for _ in range(args.frames):
                    frame(hidden, code0, lean)
                ms[lean] = 1000 * (time.perf_counter() - start) / args.frames
            print(
                f"batch {batch}: own forward {ms[False]:.1f} ms a frame, lean {ms[True]:.1f} ms "
                f"({ms[True] / ms[False]:.2f}x); same codes: {same}"
            )


if __name__ == "__main__":
    main()
