"""How close quantized AR decoding stays to the float model (issue 63): greedy answers to 32 fixed questions.

The demo's chat model (SmolLM2-135M-Instruct, its Q4_1 GGUF dequantized: the real trained weights) answers
each question greedily, `--max-tokens` tokens, on the AR engine in float32 with float weights (the reference,
`quantization: none`), with the file's own blocks (`auto`: Q4_1 decoder, Q8_0 head), with the decoder's
weights as int8 / int4 groups, in bf16, and as the deployment serves it by default (`auto auto dense 16`: bf16
where the CPU computes it natively, the blocks, dense copies for 16 rows or more; the 32 questions run as one
batch, so most steps take the dense copies); with `--llama-python`, llama.cpp answers the same token ids from
the same GGUF. It prints, for each contestant, how many whole answers equal the float32 ones and
llama.cpp's, and the mean length of the prefix shared with float32's.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/quantized_quality.py --llama-python LLAMA_VENV/bin/python
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnistage.config.deploy import StageDeploy  # noqa: E402
from omnistage.config.pipeline import StageSpec  # noqa: E402
from omnistage.demo.smollm import smollm2_dir, smollm2_gguf  # noqa: E402
from omnistage.params import SamplingParams  # noqa: E402
from omnistage.stages.ar.engine import create_engine  # noqa: E402
from omnistage.stages.base import EngineContext, StageRequest  # noqa: E402

QUESTIONS = [
    "What is the capital of France?", "Name three primary colors.", "How many legs does a spider have?",
    "What is 12 times 12?", "Write a haiku about the sea.", "Who wrote Romeo and Juliet?",
    "What is photosynthesis?", "Give me a tip for sleeping better.", "Translate 'good morning' to Spanish.",
    "What is the boiling point of water?", "Why is the sky blue?", "List two uses of a paperclip.",
    "What is a prime number?", "Describe a cat in one sentence.", "What does CPU stand for?",
    "How do bees make honey?", "What is the largest planet?", "Suggest a name for a pet fish.",
    "What is gravity?", "How many days are in a leap year?", "What language is spoken in Brazil?",
    "Explain what a verb is.", "What is the opposite of hot?", "Tell me a fun fact about octopuses.",
    "What is the speed of light?", "How do I make a cup of tea?", "What is an atom?",
    "Who painted the Mona Lisa?", "What are clouds made of?", "Give a synonym for happy.",
    "What is the freezing point of water in Fahrenheit?", "Why do we need sleep?",
]  # fmt: skip
# (dtype, quantization, quantized_dense_rows); "auto auto 16" is the deployment's default (llm.yaml: bf16
# where the CPU computes it natively, the file's blocks, dense copies from 16 rows).
CONTESTANTS = [("float32", "none", 0), ("float32", "auto", 0), ("float32", "int8", 0), ("float32", "int4", 0),
               ("bfloat16", "none", 0), ("bfloat16", "auto", 0), ("bfloat16", "int4", 0),
               ("auto", "auto", 16)]  # fmt: skip

LLAMA_CPP = """
import json, sys
from llama_cpp import Llama
prompts, max_tokens = json.load(open(sys.argv[2])), int(sys.argv[3])
llm = Llama(model_path=sys.argv[1], n_ctx=512, n_threads=2, verbose=False)
answers = []
for p in prompts:
    tokens = []
    for t in llm.generate(p, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        if t == llm.token_eos() or len(tokens) >= max_tokens:
            break
        tokens.append(t)
    answers.append(tokens)
print(json.dumps(answers))
"""


def prompts() -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir()))
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    encoded = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True) for c in chats]
    return [list(e["input_ids"] if hasattr(e, "keys") else e) for e in encoded]  # transformers 5: a mapping


def smollm_engine(dtype: str, quantization: str, dense_rows: int = 0):
    """The demo's SmolLM2 on an AR engine of its own (32 sequences at once)."""
    ctx = EngineContext(
        stage=StageSpec(0, "llm", "ar", final_output=True, output_modality="text"),
        deploy=StageDeploy(
            stage_id=0, dtype=dtype, max_num_seqs=32, max_num_batched_tokens=2048,
            engine_args={"quantization": quantization, "quantized_dense_rows": dense_rows},
        ),
        model_dir=str(smollm2_dir()),
    )  # fmt: skip
    return create_engine(ctx)


def engine_answers(
    dtype: str, quantization: str, dense_rows: int, ids: list[list[int]], max_tokens: int
) -> list[list[int]]:
    engine = smollm_engine(dtype, quantization, dense_rows)
    eos = set(engine.model.eos_token_ids)
    for i, p in enumerate(ids):
        engine.add_request(
            StageRequest(f"q{i}", prompt=p, params=SamplingParams(temperature=0.0, max_tokens=max_tokens))
        )
    answers: dict[str, list[int]] = {}
    while engine.has_work():
        for out in engine.step():
            answers.setdefault(out.request_id, []).extend(out.token_ids or [])
    engine.shutdown()
    return [[t for t in answers[f"q{i}"] if t not in eos] for i in range(len(ids))]


def llama_cpp_answers(python: str, ids: list[list[int]], max_tokens: int) -> list[list[int]]:
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(ids, f)
        f.flush()
        run = subprocess.run(
            [python, "-c", LLAMA_CPP, str(smollm2_gguf()), f.name, str(max_tokens)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    return json.loads(run.stdout.strip().splitlines()[-1])


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--llama-python", help="an interpreter with llama-cpp-python (llama.cpp's answers)")
    args = parser.parse_args()
    ids = prompts()
    answers = {
        f"{d} {q}" + (f" dense {r}" if r else ""): engine_answers(d, q, r, ids, args.max_tokens)
        for d, q, r in CONTESTANTS
    }
    if args.llama_python:
        answers["llama.cpp Q4_1"] = llama_cpp_answers(args.llama_python, ids, args.max_tokens)
    reference, llama = answers["float32 none"], answers.get("llama.cpp Q4_1")
    print(f"{len(ids)} questions, greedy, {args.max_tokens} tokens at most")
    for name, got in answers.items():
        same = sum(a == b for a, b in zip(got, reference, strict=True))
        prefix = sum(common_prefix(a, b) for a, b in zip(got, reference, strict=True)) / len(ids)
        line = f"  {name:<18} equal to float32: {same:2d}/{len(ids)}  mean common prefix {prefix:5.1f}"
        if llama is not None:
            line += (
                f"  equal to llama.cpp: {sum(a == b for a, b in zip(got, llama, strict=True)):2d}/{len(ids)}"
            )
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
