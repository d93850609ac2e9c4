"""Collapsed prompt padding: one Wan transformer forward with diffusers' own cross-attention against the
same forward with omnistage's `PaddedPromptProcessor` (omnistage/families/wan/text_padding.py).

Wan pipelines pad each prompt's embeddings to `max_sequence_length` rows; diffusers attends to all of them in
every block, omnistage to each prompt's rows plus one bias-weighted copy of its padding. The baseline is the
forward a plain diffusers pipeline call runs. Workload: one CFG forward (batch 2: a held-out caption and the
empty negative prompt) of the trained demo model at 33 frames x 32x32, by default, with the pipeline's own
text encoder; the two transformers (same weights) run alternately, and the median of each is reported with
their ratio and the largest difference between their outputs.

    python benchmarks/text_padding.py                    # demo model, 512-row prompts, 20 forwards each
    python benchmarks/text_padding.py --model DIR --msl 226
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a Wan pipeline directory (default: the demo model)")
    parser.add_argument("--msl", type=int, default=512, help="max_sequence_length the prompts are padded to")
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20, help="forwards of each transformer, alternating")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from diffusers import DiffusionPipeline

    from omnistage.demo.evaluate import held_out_scenes
    from omnistage.demo.model import demo_model_dir
    from omnistage.families import wan
    from omnistage.stages.diffusion import text_padding

    wan.register()  # the padding processor for Wan's cross-attention

    model = args.model or str(demo_model_dir())
    pipe = DiffusionPipeline.from_pretrained(model, dtype=torch.float32, local_files_only=True)
    plain = pipe.transformer.eval()
    collapsed = copy.deepcopy(plain)
    installed = text_padding.install(collapsed)
    caption = held_out_scenes(1)[0][0].caption
    with torch.no_grad():
        positive, negative = pipe.encode_prompt(
            caption, negative_prompt="", do_classifier_free_guidance=True, max_sequence_length=args.msl
        )
        text = torch.cat([positive, negative])
        vae_t, vae_s = pipe.vae_scale_factor_temporal, pipe.vae_scale_factor_spatial
        shape = (
            2,
            plain.config.in_channels,
            (args.frames - 1) // vae_t + 1,
            args.size // vae_s,
            args.size // vae_s,
        )
        latents = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        timestep = torch.full((2,), 500.0)

        def forward(transformer: torch.nn.Module) -> tuple[float, torch.Tensor]:
            start = time.perf_counter()
            out = transformer(
                hidden_states=latents, timestep=timestep, encoder_hidden_states=text, return_dict=False
            )
            return time.perf_counter() - start, out[0]

        forward(plain), forward(collapsed)  # warm-up
        times: dict[str, list[float]] = {"plain": [], "collapsed": []}
        outputs: dict[str, torch.Tensor] = {}
        for _ in range(args.repeats):
            for name, transformer in (("plain", plain), ("collapsed", collapsed)):
                elapsed, outputs[name] = forward(transformer)
                times[name].append(elapsed)
        kept = text_padding.collapse_padding(text)[0].shape[1]
    diff = (outputs["plain"] - outputs["collapsed"]).abs().max().item()
    print(f"model {model}; caption {caption!r}; {installed} cross-attentions collapsed")
    print(
        f"batch 2 (caption + empty negative), {args.frames}x{args.size}x{args.size}, prompt rows {args.msl}"
    )
    print(f"keys per cross-attention: {text.shape[1]} plain, {kept} collapsed")
    print(f"torch threads {torch.get_num_threads()}; load average {os.getloadavg()[0]:.2f}")
    plain_ms = statistics.median(times["plain"]) * 1e3
    collapsed_ms = statistics.median(times["collapsed"]) * 1e3
    print(f"plain diffusers forward: median {plain_ms:.1f} ms of {args.repeats}")
    print(f"collapsed padding:       median {collapsed_ms:.1f} ms of {args.repeats}")
    print(f"speedup {plain_ms / collapsed_ms:.2f}x; max abs diff of the outputs {diff:.2e}")


if __name__ == "__main__":
    main()
