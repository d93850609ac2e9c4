"""Turning a StageRequest into an `ARRequest`: prompt forms, sampling parameters, extra model inputs.

Prompt forms: a typed prompt (omnistage/prompts.py: `TextPrompt` tokenized as is, no chat template, or
its token ids; `ChatPrompt` and a `SpeechPrompt`'s text as a user message, rendered with the tokenizer's
chat template and the generation prompt), or what an input processor makes: `str`, `list[int]`.
`StageRequest.inputs` is an `ARInputs` (ar_inputs.py; a dict of its fields is converted). Every rule
broken raises InvalidRequestError naming the field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omnistage.config.pipeline import load_ref
from omnistage.errors import InvalidRequestError
from omnistage.params import SamplingParams, apply_constraints, layer_params
from omnistage.prompts import ChatPrompt, SpeechPrompt, TextPrompt, as_prompt
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.sequence import ARRequest
from omnistage.stages.base import StageRequest
from omnistage.stages.typed_inputs import inputs_of
from omnistage.tool_prompts import render_chat


@dataclasses.dataclass
class InputRules:
    """What the loaded model accepts."""

    tokenizer: Any | None
    vocab_size: int
    hidden_size: int
    position_rows: int  # 1, or 3 for multimodal RoPE
    max_model_len: int
    dtype: torch.dtype
    default_params: dict[str, Any]
    constraints: dict[str, Any]
    pad_token_id: int = 0
    num_layers: int = 0  # decoder layers: transformers' hidden_states has num_layers + 1 entries
    heads: tuple[str, ...] = ()  # the loaded model's other heads, by name (LoadedModel.heads)
    eos_token_ids: tuple[int, ...] = ()  # the ids that end a sequence (the model's EOS)


def make_params(given: Any, rules: InputRules) -> SamplingParams:
    """A SamplingParams as given: requests through the runtime arrive layered (api.StageParamsResolver:
    defaults < deploy < request), and are not layered again; only a dict of fields (or None), as a
    processor or a direct engine user may give, is layered here, once, the same way. The stage's
    constraints (what the model needs whatever is asked) hold either way."""
    if given is not None and not isinstance(given, dict | SamplingParams):
        raise InvalidRequestError(
            f"params must be SamplingParams for an AR stage, got {type(given).__name__}", param="params"
        )
    params = given
    if not isinstance(params, SamplingParams):
        params = layer_params(SamplingParams, rules.default_params, given)
    if rules.constraints:
        params = apply_constraints(params, rules.constraints)
    bad = [t for t in params.allowed_token_ids or [] if not 0 <= t < rules.vocab_size]
    if bad or params.allowed_token_ids == []:
        raise InvalidRequestError(
            f"allowed_token_ids must be a non-empty list of ids in [0, {rules.vocab_size})",
            param="allowed_token_ids",
        )
    return params


def make_request(req: StageRequest, rules: InputRules) -> ARRequest:
    params = make_params(req.params, rules)
    inputs = dataclasses.replace(inputs_of(ARInputs, req.inputs))  # the request's own: chunks extend it
    embeds = _prompt_embeds(inputs.inputs_embeds, rules)
    # vLLM's prompt dicts, as a direct engine user may give them
    prompt = as_prompt(req.prompt) if isinstance(req.prompt, dict) else req.prompt
    if isinstance(prompt, ChatPrompt | TextPrompt) and prompt.media() and embeds is None:
        raise InvalidRequestError(
            "this stage takes text only; multi_modal_data needs a model whose input processor embeds it",
            param="multi_modal_data",
        )
    token_ids = _prompt_token_ids(prompt, rules, embeds)
    if not token_ids:
        raise InvalidRequestError("the prompt is empty", param="prompt")
    if embeds is not None and embeds.shape[0] != len(token_ids):
        raise InvalidRequestError(
            f"inputs_embeds has {embeds.shape[0]} rows but the prompt has {len(token_ids)} tokens",
            param="inputs_embeds",
        )
    bad = [t for t in token_ids if not 0 <= t < rules.vocab_size]
    if bad:
        raise InvalidRequestError(
            f"prompt token id {bad[0]} is outside the vocabulary [0, {rules.vocab_size})",
            param="prompt_token_ids",
        )
    if len(token_ids) >= rules.max_model_len:
        raise InvalidRequestError(
            f"the prompt has {len(token_ids)} tokens; this model takes at most {rules.max_model_len - 1} "
            f"(max_model_len {rules.max_model_len} includes at least one generated token)",
            param="prompt",
        )
    positions = _positions(inputs.position_ids, len(token_ids), rules)
    if inputs.head is not None and inputs.head not in rules.heads:
        raise InvalidRequestError(
            f"head {inputs.head!r} is not one of this model's ({', '.join(rules.heads) or 'it has one'})",
            param="head",
        )
    processors = [_processor(ref) for ref in params.logits_processors]
    if params.structured_outputs is not None:
        from omnistage.stages.ar.structured import constraint

        stops = (*rules.eos_token_ids, *params.stop_token_ids)
        processors.append(constraint(params.structured_outputs, rules.tokenizer, rules.vocab_size, stops))
    return ARRequest(
        request_id=req.request_id,
        prompt_token_ids=token_ids,
        params=params,
        priority=int(req.priority or 0),
        arrival_time=req.arrival_time,
        inputs=inputs,
        prompt_embeds=embeds,
        positions=positions,
        rope_delta=int(inputs.rope_delta or 0),
        logits_processors=processors,
        hidden_layers=_hidden_layers(params, rules.num_layers),
        token_counts=req.token_counts,
    )


def _hidden_layers(params: SamplingParams, num_layers: int) -> dict[int, int]:
    """Output key → layer index in [0, num_layers] (transformers' `hidden_states` index, negative ones
    counted from the end, -1 the last layer after the final norm)."""
    asked = list(dict.fromkeys([*params.hidden_state_layers, *([-1] if params.return_hidden_states else [])]))
    valid = range(-num_layers - 1, num_layers + 1)
    bad = [k for k in asked if isinstance(k, bool) or not isinstance(k, int) or k not in valid]
    if bad:
        raise InvalidRequestError(
            f"hidden_state_layers: {bad[0]!r} is not a layer index in [{-num_layers - 1}, {num_layers}] "
            f"(this model has {num_layers} layers; 0 is the embeddings, -1 the last layer)",
            param="hidden_state_layers",
        )
    return {k: k % (num_layers + 1) for k in asked}


def _prompt_token_ids(prompt: Any, rules: InputRules, embeds: torch.Tensor | None) -> list[int]:
    if isinstance(prompt, str):
        return _encode(prompt, rules)
    if isinstance(prompt, list | tuple):
        return _int_list(prompt, "prompt")
    if isinstance(prompt, TextPrompt) and prompt.token_ids is not None:
        return _int_list(prompt.token_ids, "prompt_token_ids")
    if isinstance(prompt, TextPrompt) and prompt.text is not None:
        return _encode(prompt.text, rules)
    if isinstance(prompt, ChatPrompt | SpeechPrompt):
        return _chat(prompt.messages, rules, getattr(prompt, "tools", None))
    if prompt is None or isinstance(prompt, TextPrompt):
        if embeds is not None:  # embeddings alone: placeholder ids keep the per-token bookkeeping uniform
            return [rules.pad_token_id] * embeds.shape[0]
        raise InvalidRequestError("the prompt has no text, token ids or messages", param="prompt")
    raise InvalidRequestError(
        f"an AR stage takes text, token ids, chat messages or speech text, got {type(prompt).__name__}",
        param="prompt",
    )


def _int_list(values: Any, field: str) -> list[int]:
    if isinstance(values, torch.Tensor):
        values = values.reshape(-1).tolist()
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InvalidRequestError(f"{field} must be a list of integers", param=field)
    return list(values)


def _need_tokenizer(rules: InputRules, field: str) -> Any:
    if rules.tokenizer is None:
        raise InvalidRequestError(
            f"this stage has no tokenizer; send prompt_token_ids instead of {field}", param=field
        )
    return rules.tokenizer


def _encode(text: Any, rules: InputRules) -> list[int]:
    if not isinstance(text, str):
        raise InvalidRequestError("prompt must be a string", param="prompt")
    return list(_need_tokenizer(rules, "prompt")(text)["input_ids"])


def _chat(messages: Any, rules: InputRules, tools: list[dict[str, Any]] | None = None) -> list[int]:
    tokenizer = _need_tokenizer(rules, "messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequestError("messages must be a list of {role, content} objects", param="messages")
    if getattr(tokenizer, "chat_template", None) is None:
        raise InvalidRequestError("this model's tokenizer has no chat template", param="messages")
    out = render_chat(tokenizer, messages, tools, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if not isinstance(out, list) else out
    return [int(t) for t in ids]


def _prompt_embeds(value: Any, rules: InputRules) -> torch.Tensor | None:
    if value is None:
        return None
    embeds = torch.as_tensor(value)
    if embeds.ndim != 2 or embeds.shape[1] != rules.hidden_size or embeds.shape[0] == 0:
        raise InvalidRequestError(
            f"inputs_embeds must have shape [prompt_len, {rules.hidden_size}], got {list(embeds.shape)}",
            param="inputs_embeds",
        )
    return embeds.to(rules.dtype)


def _positions(value: Any, prompt_len: int, rules: InputRules) -> torch.Tensor | None:
    if value is None:
        return None
    positions = torch.as_tensor(value, dtype=torch.long)
    if positions.ndim == 1:
        positions = positions[None]
    rows = positions.shape[0]
    if positions.ndim != 2 or positions.shape[1] < prompt_len or rows not in (1, rules.position_rows):
        raise InvalidRequestError(
            f"position_ids must have shape [{prompt_len}] or [{rules.position_rows}, {prompt_len}] (or more "
            f"columns, for generated tokens), got {list(positions.shape)}",
            param="position_ids",
        )
    return positions.expand(rules.position_rows, -1).contiguous()


def _processor(ref: Any) -> Any:
    try:
        fn = load_ref(ref)
    except (ImportError, AttributeError, ValueError) as exc:
        raise InvalidRequestError(
            f"logits processor {ref!r} cannot be loaded: {exc}", param="logits_processors"
        ) from exc
    if not callable(fn):
        raise InvalidRequestError(f"logits processor {ref!r} is not callable", param="logits_processors")
    return fn
