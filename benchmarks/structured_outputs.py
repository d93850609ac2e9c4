"""What structured outputs cost a decode step: the AR engine decoding 32 sequences at once on the demo chat
model (SmolLM2-135M-Instruct, its 49152-token vocabulary), none constrained against half of them held to a
JSON schema (xgrammar's token bitmask applied to each constrained row every step), greedy, the same prompts
and lengths, alternating for two rounds. Target (issue 59): half constrained ≥ 0.8x the decode tokens per
second of none.

    python benchmarks/structured_outputs.py [--sequences 32] [--output-len 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ar_throughput import make_engine, make_prompts  # noqa: E402

from omnistage.params import SamplingParams, StructuredOutputs  # noqa: E402
from omnistage.stages.base import StageRequest  # noqa: E402

# An array of records with no end the grammar forces: every step of a constrained row is masked.
SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "score": {"type": "integer"}},
        "required": ["name", "score"],
    },
}


def decode(engine, prompts: list[list[int]], output_len: int, constrained: bool) -> tuple[float, int]:
    """Decode tokens per second over the whole run (prefill included, as a server sees it), and how many
    sequences carried a constraint."""
    held = StructuredOutputs(json=SCHEMA)
    t0 = time.perf_counter()
    count = 0
    for i, prompt in enumerate(prompts):
        structured = held if constrained and i % 2 == 0 else None
        count += structured is not None
        params = SamplingParams(
            temperature=0.0, max_tokens=output_len, ignore_eos=True, structured_outputs=structured
        )
        engine.add_request(StageRequest(f"r{i}-{constrained}", prompt, params))
    tokens = 0
    while engine.has_work():
        for out in engine.step():
            if out.error:
                raise RuntimeError(out.error)
            tokens += len(out.token_ids)
    return tokens / (time.perf_counter() - t0), count


def main() -> None:
    from omnistage.demo.smollm import smollm2_dir

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    model_dir = str(smollm2_dir())
    engine = make_engine(model_dir, "float32", max_num_seqs=args.sequences, max_batched=2048)
    prompts = make_prompts(args.sequences, 32)
    decode(engine, prompts[:4], 8, True)  # warm-up: kernels, and the schema compiled once
    print(
        f"demo chat model {model_dir}; {args.sequences} sequences x {args.output_len} tokens, greedy; "
        f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    plain, held = [], []
    for round_ in range(1, args.rounds + 1):
        plain.append(decode(engine, prompts, args.output_len, False)[0])
        rate, count = decode(engine, prompts, args.output_len, True)
        held.append(rate)
        print(
            f"round {round_}: none constrained {plain[-1]:.1f} tok/s; {count} of {args.sequences} "
            f"constrained {held[-1]:.1f} tok/s ({held[-1] / plain[-1]:.3f}x)",
            flush=True,
        )
    ratios = [h / p for h, p in zip(held, plain, strict=True)]
    print(
        f"\nhalf constrained / none: {min(ratios):.3f}x worst round, {max(ratios):.3f}x best "
        f"(target >= 0.8x); load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
