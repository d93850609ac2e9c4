"""Shared helpers of the AR tests: engine factory and driver, transformers references, and the hooks the
tests reference by dotted path ("tests.ar.ar_helpers:name"), as a model family would."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageSpec
from omnistage.demo.llm import tiny_llm_dir
from omnistage.outputs import StageOutput, StageResult
from omnistage.stages.ar.engine import AREngine, create_engine
from omnistage.stages.base import EngineContext, StageRequest


def make_engine(
    arch: str = "qwen2", model_dir: str | None = None, engine_args: dict | None = None, **deploy: Any
) -> AREngine:
    deploy = {"dtype": "float32", "max_num_seqs": 16, "max_num_batched_tokens": 128, **deploy}
    ctx = EngineContext(
        stage=StageSpec(0, "llm", "ar", final_output=True, output_modality="text"),
        deploy=StageDeploy(stage_id=0, engine_args=dict(engine_args or {}), **deploy),
        model_dir=str(model_dir or tiny_llm_dir(arch)),
    )
    return create_engine(ctx)


def run(
    engine: AREngine,
    requests: Iterable[StageRequest],
    arrival_steps: Iterable[int] | None = None,
    on_step: Callable[[int, AREngine], None] | None = None,
    max_steps: int = 2000,
) -> tuple[dict[str, StageResult], dict[str, list[StageOutput]]]:
    """Drive the engine like the worker loop: add each request at its arrival step, step while there is
    work, collect every request's deltas. Asserts exactly one terminal output per request."""
    requests = list(requests)
    steps = list(arrival_steps) if arrival_steps is not None else [0] * len(requests)
    results: dict[str, StageResult] = {}
    deltas: dict[str, list[StageOutput]] = {}
    step = 0
    while step < max_steps:
        for req, at in zip(requests, steps, strict=True):
            if at == step:
                engine.add_request(req)
        if on_step is not None:
            on_step(step, engine)
        pending = [at for at in steps if at > step]
        if not engine.has_work() and not pending:
            break
        for out in engine.step() if engine.has_work() else []:
            assert not results.get(out.request_id, StageResult(0)).finished, (
                f"{out.request_id} output after end"
            )
            results.setdefault(out.request_id, StageResult(0)).add(out)
            deltas.setdefault(out.request_id, []).append(out)
        step += 1
    assert step < max_steps, "engine did not finish"
    return results, deltas


@functools.cache
def hf_model(arch: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_llm_dir(arch)), dtype=torch.float32).eval()


@functools.cache
def hf_tokenizer(arch: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llm_dir(arch)))


@functools.cache
def hf_greedy(arch: str, prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    """transformers `generate` greedy continuation (EOS from the checkpoint's generation config)."""
    with torch.inference_mode():
        out = hf_model(arch).generate(
            torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, attention_mask=None
        )
    return out[0, len(prompt) :].tolist()


IM_END = 511  # <|im_end|> in the tiny Qwen2 vocabulary (specials sit at the end of its 512 ids)


def boost_im_end(output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    """A logits processor that makes the tiny Qwen2's <|im_end|> (an EOS) overwhelmingly likely."""
    logits = logits.clone()
    logits[IM_END] += 1000.0
    return logits


def failing_processor(output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("processor exploded")


def add_step_rows(inputs: dict, step: int, embed: torch.Tensor) -> torch.Tensor:
    """Step hook: add row `step` of inputs["step_rows"] (what a talker does with thinker hidden states)."""
    rows = inputs.get("step_rows")
    if rows is None:
        return embed
    if inputs.get("explode"):
        raise ValueError("hook exploded")
    return embed + rows[step].to(embed.dtype)


def step_row_ready(inputs: dict, step: int) -> bool:
    """Step-ready hook for `add_step_rows`: row `step` has arrived, or no more will."""
    return inputs.get("input_finished", True) or step < inputs["step_rows"].shape[0]


def build_tiny_qwen2_vl(path) -> None:
    """A tiny Qwen2-VL (3-row multimodal RoPE text stack) — the shape of an omni thinker's decoder."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=512,
        initializer_range=0.1,
        bos_token_id=0,
        eos_token_id=1,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
    )
    vision = dict(depth=1, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2)
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=500,
        video_token_id=501,
        vision_start_token_id=502,
    )
    torch.manual_seed(0)
    Qwen2VLForConditionalGeneration(config).save_pretrained(str(path))


def load_qwen2_vl_text(model_dir: str, dtype: torch.dtype, device: str):
    """A custom `model_loader`: the engine drives only the VL model's text stack."""
    from transformers import Qwen2VLForConditionalGeneration

    from omnistage.stages.ar.attention import ATTENTION_NAME
    from omnistage.stages.ar.loader import LoadedModel

    model = Qwen2VLForConditionalGeneration.from_pretrained(
        model_dir, dtype=dtype, attn_implementation={"text_config": ATTENTION_NAME, "vision_config": "sdpa"}
    ).eval()
    text = model.model.language_model
    return LoadedModel(
        embed=text.embed_tokens, decoder=text, head=model.lm_head, config=text.config, root=model
    )
