"""Shared helpers of the AR tests: engine factory and driver, transformers references, and the hooks the
tests reference by dotted path ("tests.ar.ar_helpers:name"), as a model family would."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from omnistage.cache import cached_dir
from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageSpec
from omnistage.families.llm.tiny import TINY, TINY_VOCAB, tiny_llm_dir
from omnistage.families.shared.tokenizer import build_tokenizer, generation_eos_ids
from omnistage.outputs import StageOutput, StageResult
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.engine import AREngine, create_engine
from omnistage.stages.ar.loader import LoadedModel, load_causal_lm
from omnistage.stages.ar.post_sample import PostSample, SampledStep
from omnistage.stages.base import EngineContext, StageRequest


def build_tiny_qwen3_moe(path: Path) -> None:
    """A tiny Qwen3-MoE (q/k norm, 4 experts, 2 per token, every layer sparse) with the Qwen tokenizer."""
    from transformers import GenerationConfig, Qwen3MoeConfig, Qwen3MoeForCausalLM

    specials = build_tokenizer(path, "qwen", TINY_VOCAB)
    eos = generation_eos_ids("qwen", specials)
    config = Qwen3MoeConfig(
        **TINY,
        head_dim=TINY["hidden_size"] // TINY["num_attention_heads"],
        vocab_size=TINY_VOCAB,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        decoder_sparse_step=1,
        eos_token_id=eos[-1],
        pad_token_id=eos[-1],
        tie_word_embeddings=False,  # tied, its greedy replies repeat one token: a weak test
    )
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).eval()
    model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=eos[-1], do_sample=False)
    model.save_pretrained(str(path))


def tiny_dir(arch: str) -> Path:
    """The tiny checkpoint of `arch`: the demo's LLMs, and the MoE one only the AR tests use."""
    if arch == "qwen3_moe":
        return cached_dir("tiny-qwen3-moe", "v2", build_tiny_qwen3_moe)
    return tiny_llm_dir(arch)


def make_engine(
    arch: str = "qwen2", model_dir: str | None = None, engine_args: dict | None = None, **deploy: Any
) -> AREngine:
    deploy = {"dtype": "float32", "max_num_seqs": 16, "max_num_batched_tokens": 128, **deploy}
    ctx = EngineContext(
        stage=StageSpec(0, "llm", "ar", final_output=True, output_modality="text"),
        deploy=StageDeploy(stage_id=0, engine_args=dict(engine_args or {}), **deploy),
        model_dir=str(model_dir or tiny_dir(arch)),
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

    return AutoModelForCausalLM.from_pretrained(str(tiny_dir(arch)), dtype=torch.float32).eval()


@functools.cache
def hf_tokenizer(arch: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dir(arch)))


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


@dataclasses.dataclass
class StepRows:
    """The test talker's extension (ARInputs.extension): rows added to generated tokens' embeddings (streamed
    chunks append rows), and whether its hooks should fail."""

    rows: torch.Tensor | None = None
    explode: bool = False


def step_rows(rows: torch.Tensor | None = None, explode: bool = False) -> ARInputs:
    return ARInputs(extension=StepRows(rows, explode))


def add_step_rows(inputs: ARInputs, step: int, embed: torch.Tensor) -> torch.Tensor:
    """Step hook: add row `step` of the StepRows (what a talker does with thinker hidden states)."""
    extension = inputs.extension
    if extension is None or extension.rows is None:
        return embed
    if extension.explode:
        raise ValueError("hook exploded")
    return embed + extension.rows[step].to(embed.dtype)


def step_row_ready(inputs: ARInputs, step: int) -> bool:
    """Step-ready hook for `add_step_rows`: row `step` has arrived, or no more will."""
    return inputs.input_finished or step < inputs.extension.rows.shape[0]


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


CODEBOOKS = 4  # per frame: the sampled token, then three from the code predictor
CODEC_VOCAB = 64


class ToyCodePredictor(torch.nn.Module):
    """The shape of Qwen3-TTS's code predictor, small: codebook j of a frame is the argmax of a linear over
    the talker's hidden state plus the embeddings of codebooks 0..j-1; the next step's input is the sum of
    all the frame's codebook embeddings."""

    def __init__(self, hidden: int):
        super().__init__()
        others = range(CODEBOOKS - 1)
        with torch.random.fork_rng():  # the same weights every time, the global generator untouched
            torch.manual_seed(1234)
            self.heads = torch.nn.ModuleList(torch.nn.Linear(hidden, CODEC_VOCAB) for _ in others)
            self.embeds = torch.nn.ModuleList(torch.nn.Embedding(CODEC_VOCAB, hidden) for _ in others)
            for embed in self.embeds:
                torch.nn.init.normal_(embed.weight, std=0.1)

    def forward(self, hidden: torch.Tensor, first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [S, H], first [S, H] (codebook 0's embedding) → (codes [S, CODEBOOKS - 1], next input)."""
        x, total, codes = hidden + first, first, []
        for head, embed in zip(self.heads, self.embeds, strict=True):
            code = head(x).argmax(dim=-1)
            codes.append(code)
            x, total = x + embed(code), total + embed(code)
        return torch.stack(codes, dim=1), total


@dataclasses.dataclass
class ToyTalker(LoadedModel):
    code_predictor: torch.nn.Module | None = None


def load_toy_talker(model_dir: str, dtype: torch.dtype, device: str) -> ToyTalker:
    """A `model_loader`: the causal LM plus the code predictor the post-sample hook runs."""
    loaded = load_causal_lm(model_dir, dtype, device)
    fields = {f.name: getattr(loaded, f.name) for f in dataclasses.fields(LoadedModel)}
    predictor = ToyCodePredictor(loaded.config.hidden_size).to(device, dtype).eval()
    return ToyTalker(**fields, code_predictor=predictor)


def predict_codes(model: ToyTalker, step: SampledStep) -> PostSample:
    """Post-sample hook: the frame's other codebooks and the next input, for the whole step at once."""
    if any(inputs.extension is not None and inputs.extension.explode for inputs in step.inputs):
        raise ValueError("code predictor exploded")
    codes, next_embeds = model.code_predictor(step.hidden, model.embed(step.token_ids))
    return PostSample(codes=codes, next_embeds=next_embeds)


def reference_talker(arch: str, prompt: list[int], max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Tokens and frames the toy talker gives through transformers alone: greedy on the full sequence's
    forward each step, fed the code predictor's embeddings."""
    model = hf_model(arch)
    predictor = ToyCodePredictor(model.config.hidden_size).eval()
    embed = model.get_input_embeddings()
    with torch.inference_mode():
        inputs = embed(torch.tensor(prompt))
        tokens, frames = [], []
        for _ in range(max_new_tokens):
            hidden = model.model(inputs_embeds=inputs[None]).last_hidden_state[0, -1:]
            token = model.lm_head(hidden).argmax(dim=-1)
            codes, next_embed = predictor(hidden, embed(token))
            tokens.append(int(token))
            frames.append(torch.cat([token[:, None], codes], dim=1))
            if int(token) in model.generation_config.eos_token_id:
                break
            inputs = torch.cat([inputs, next_embed])
    return tokens, torch.cat(frames)


def use_pointwise(lean: Any, pointwise: str) -> None:
    """Put a lean decoder's pointwise work on torch ops ("torch") or keep it on the native kernels
    ("native"; the test is skipped only where they cannot be built)."""
    import pytest

    from omnistage.stages.ar.cpu import native

    if pointwise == "torch":
        lean.native_ops = None
    elif lean.native_ops is None:
        assert native.kernels() is None  # only where the kernels cannot be built
        pytest.skip("the native kernels are not built on this CPU")
