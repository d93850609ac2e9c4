"""Small real torch modules as stage models, for testing the runtime before (and besides) the real engines.

A token stage (embedding + linear LM, greedy), a mapping stage that turns each incoming token into a code
as chunks arrive (a talker's shape), and a vocoder (embedding + transposed conv) for the generation engine.

A request that must stay in flight while a test acts on it (aborts it, kills a stage under it, fills the
admission queue) names a gate in its prompt, `HOLD:<name>`: it stops before its last output until the file
`<name>` exists in the engine's `gate_dir`. A file is a condition the test controls from any process, so no
engine has to be slowed down by a clock for a request to still be running when the test looks.

A prompt containing `UNREADABLE` makes the token stage's last output carry a `stop_reason` of a type the
message schema does not declare (a float), as a stage with a schema bug would send.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.outputs import StageOutput
from omnistage.prompts import PROMPTS, TextPrompt, prompt_text
from omnistage.stages.base import EngineContext, StageInputContext, StageRequest
from omnistage.stages.engine_args import EngineArgs
from omnistage.stages.generation.engine import GenerationBatch, one_unit

VOCAB = 64
GATE = re.compile(r"HOLD:(\w+)")


def _seeded(module: nn.Module, seed: int) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return module.eval()


class TinyLM(nn.Module):
    def __init__(self, hidden: int = 16):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, hidden)
        self.head = nn.Linear(hidden, VOCAB)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.embed(tokens))
        return self.head(h), h


def plain(prompt: Any) -> Any:
    """A typed prompt as the toys read it: its text (or token ids); engine-level forms as they are."""
    if isinstance(prompt, TextPrompt) and prompt.token_ids is not None:
        return prompt.token_ids
    return prompt_text(prompt) if isinstance(prompt, PROMPTS) else prompt


def gate_of(prompt: Any) -> str | None:
    """The gate a prompt names (`HOLD:<name>`), if any."""
    prompt = plain(prompt)
    match = GATE.search(prompt) if isinstance(prompt, str) else None
    return match.group(1) if match else None


def open_gate(gate_dir: Path, name: str) -> None:
    """Let the requests held at gate `name` finish."""
    (Path(gate_dir) / name).touch()


def prompt_tokens(prompt: Any) -> list[int]:
    prompt = plain(prompt)
    if isinstance(prompt, str):
        return [b % VOCAB for b in prompt.encode()]
    return [int(t) % VOCAB for t in prompt]


class ToyEngineBase:
    """Shared bookkeeping; engine_args: gate_dir (see the module's docstring), fail_marker (a prompt
    containing it raises)."""

    def __init__(self, ctx: EngineContext, seed: int):
        self.model = _seeded(TinyLM(), seed)
        self.gate_dir = ctx.engine_args.get("gate_dir")
        self.fail_marker = ctx.engine_args.get("fail_marker")
        self.requests: dict[str, dict[str, Any]] = {}
        self.started = 0
        self.paused = False

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def sleep(self, level: int = 1) -> None:
        self.paused = True

    def wake_up(self) -> None:
        self.paused = False

    def closed(self, gate: str | None) -> bool:
        """Whether a request at gate `gate` must still wait (a gate without a gate_dir never opens)."""
        return gate is not None and not (self.gate_dir and Path(self.gate_dir, gate).exists())

    def stats(self) -> dict[str, Any]:
        return {"num_requests": len(self.requests), "started": self.started, "pid": os.getpid()}

    def shutdown(self) -> None:
        self.requests.clear()


class ToyAREngine(ToyEngineBase):
    """Greedy decoding with a tiny LM; one token per request per step; hidden rows out."""

    def __init__(self, ctx: EngineContext):
        super().__init__(ctx, seed=1)

    def add_request(self, request: StageRequest) -> None:
        text = plain(request.prompt)
        if self.fail_marker and isinstance(text, str) and self.fail_marker in text:
            raise RuntimeError(f"refusing prompt with {self.fail_marker!r}")
        tokens = prompt_tokens(request.prompt) or [0]
        max_tokens = getattr(request.params, "max_tokens", None) or 8
        gate = gate_of(request.prompt)
        self.requests[request.request_id] = {
            "last": tokens[-1],
            "left": max_tokens,
            "prompt": tokens,
            "gate": gate,
            "unreadable": isinstance(text, str) and "UNREADABLE" in text,
        }
        self.started += 1

    def add_chunk(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        raise NotImplementedError

    def _waiting(self, req: dict[str, Any]) -> bool:
        return req["left"] == 1 and self.closed(req["gate"])

    def has_work(self) -> bool:
        return not self.paused and any(not self._waiting(r) for r in self.requests.values())

    def step(self) -> list[StageOutput]:
        outs = []
        for rid, req in list(self.requests.items()):
            if self._waiting(req):
                continue
            with torch.no_grad():
                logits, hidden = self.model(torch.tensor([req["last"]]))
            token = int(logits.argmax(-1))
            req["last"], req["left"] = token, req["left"] - 1
            prompt_ids = req["prompt"] if "sent" not in req else None
            req["sent"] = True
            done = req["left"] == 0
            outs.append(
                StageOutput(
                    rid,
                    token_ids=[token],
                    text=f"<{token}>",
                    tensors={"hidden": hidden},
                    prompt_token_ids=prompt_ids,
                    stop_reason=0.5 if done and req["unreadable"] else None,  # type: ignore[arg-type]
                    finished=done,
                    finish_reason="length" if done else None,
                )
            )
            if done:
                del self.requests[rid]
        return outs


class ToyMapEngine(ToyEngineBase):
    """Turns each incoming token into one code as input arrives (async chunk), like a talker."""

    def __init__(self, ctx: EngineContext):
        super().__init__(ctx, seed=2)

    def add_request(self, request: StageRequest) -> None:
        pending = list((request.inputs or {}).get("tokens", []))
        if not request.inputs and request.prompt is not None:
            pending = prompt_tokens(request.prompt)
        self.requests[request.request_id] = {"pending": pending, "complete": not request.streaming_input}
        self.started += 1

    def add_chunk(self, request_id: str, inputs: dict[str, Any] | None, last: bool) -> None:
        req = self.requests.get(request_id)
        if req is not None:
            req["pending"].extend((inputs or {}).get("tokens", []))
            req["complete"] = req["complete"] or last

    def has_work(self) -> bool:
        return not self.paused and any(r["pending"] or r["complete"] for r in self.requests.values())

    def step(self) -> list[StageOutput]:
        outs = []
        for rid, req in list(self.requests.items()):
            codes = []
            if req["pending"]:
                with torch.no_grad():
                    logits, _ = self.model(torch.tensor(req["pending"]))
                codes = logits.argmax(-1).tolist()
                req["pending"] = []
            done = req["complete"]
            if codes or done:
                outs.append(
                    StageOutput(rid, token_ids=codes, finished=done, finish_reason="stop" if done else None)
                )
            if done:
                del self.requests[rid]
        return outs


class ToyVocoder(nn.Module):
    """codes → waveform: embedding, a 3-tap conv over frames (needs 1 frame of context each side),
    then a fixed upsampling to `outputs_per_frame` samples per frame."""

    sample_rate = 16000

    def __init__(self, outputs_per_frame: int = 12000):
        super().__init__()
        self.outputs_per_frame = outputs_per_frame
        self.embed = nn.Embedding(VOCAB, 4)
        self.conv = nn.Conv1d(4, 4, kernel_size=3, padding=1)
        self.out = nn.Linear(4, 1)
        _seeded(self, 3)

    def run(self, batch: GenerationBatch) -> Any:
        return one_unit(lambda: self.generate(batch.windows, batch.params))

    def generate(self, windows: list[torch.Tensor], params: list[Any]) -> list[torch.Tensor]:
        outs = []
        for codes in windows:
            x = self.embed(codes.long()).T[None]  # [1, 4, T]
            x = torch.tanh(self.conv(x))[0].T  # [T, 4]
            wave = self.out(x).repeat_interleave(self.outputs_per_frame, dim=0)[:, 0]
            ramp = torch.linspace(0.5, 1.0, self.outputs_per_frame).repeat(len(codes))
            outs.append((wave * ramp).float())
        return outs


def make_ar(ctx: EngineContext) -> ToyAREngine:
    return ToyAREngine(ctx)


def make_map(ctx: EngineContext) -> ToyMapEngine:
    return ToyMapEngine(ctx)


class VocoderArgs(EngineArgs):
    """The toy vocoder's own engine_args (an extension of the generation engine's, as a family's are)."""

    outputs_per_frame: int = 12000


def make_vocoder(ctx: EngineContext) -> ToyVocoder:
    return ToyVocoder(VocoderArgs.of(ctx.engine_args).outputs_per_frame)


make_vocoder.engine_args = VocoderArgs


def tokens_to_map_request(ctx: StageInputContext) -> StageRequest:
    tokens = [t for sid in ctx.stage.inputs for t in ctx.upstream[sid].token_ids]
    return StageRequest(ctx.request_id, params=ctx.params, inputs={"tokens": tokens})


def tokens_chunk(ctx: StageInputContext, chunk: StageOutput, last: bool) -> StageRequest | dict:
    if not ctx.state.get("started"):
        ctx.state["started"] = True
        return StageRequest(
            ctx.request_id, params=ctx.params, inputs={"tokens": list(chunk.token_ids)}, streaming_input=True
        )
    return {"tokens": list(chunk.token_ids)}


GEN = "omnistage.stages.generation.engine"


def speech_pipeline() -> PipelineSpec:
    """thinker-like → talker-like → vocoder, with text and audio outputs."""
    return PipelineSpec(
        name="toy-speech",
        stages=(
            StageSpec(0, "thinker", StageKind.AR, final_output=True, output_modality="text", engine=make_ar),
            StageSpec(
                1,
                "talker",
                StageKind.AR,
                inputs=(0,),
                engine=make_map,
                input_processor=tokens_to_map_request,
                chunk_processor=tokens_chunk,
            ),
            StageSpec(
                2,
                "vocoder",
                StageKind.GENERATION,
                inputs=(1,),
                final_output=True,
                output_modality="audio",
                input_processor=f"{GEN}:tokens_input_processor",
                chunk_processor=f"{GEN}:tokens_chunk_processor",
                engine_args={
                    "generator": make_vocoder,
                    "chunk_size": 2,
                    "left_context": 1,
                    "right_context": 1,
                },
            ),
        ),
        default_modalities=("text", "audio"),
    )


def fan_in_pipeline() -> PipelineSpec:
    """Two entry stages feeding one: the join must run once, after both."""
    return PipelineSpec(
        name="toy-fan-in",
        stages=(
            StageSpec(0, "left", StageKind.AR, engine=make_ar),
            StageSpec(1, "right", StageKind.AR, engine=make_map),
            StageSpec(
                2,
                "join",
                StageKind.AR,
                inputs=(0, 1),
                final_output=True,
                output_modality="text",
                engine=make_map,
                input_processor=tokens_to_map_request,
            ),
        ),
    )
