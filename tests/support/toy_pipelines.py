"""User-defined pipelines of small real torch modules for the server's end-to-end tests.

They stand in for model families that have not landed yet (the runtime supports user pipelines):
a chat+speech pipeline (the runtime's toy AR stage → code mapper → generation-engine vocoder), and toy
diffusion-kind stages that denoise a latent with a seeded conv for `num_inference_steps` steps, report
progress per step and decode to images or a video. Every output is computed by the modules, never fixed.
A prompt naming a gate (`HOLD:<name>`, tests/support/toy_stages.py) holds its request before its last
output until the test opens the gate: how a server test keeps a request in flight for as long as it needs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.outputs import Progress, StageOutput
from omnistage.params import DiffusionParams
from omnistage.prompts import ChatPrompt, SpeechPrompt, TextPrompt
from omnistage.stages.base import EngineContext, StageInputContext, StageRequest
from tests.support.toy_stages import (
    GEN,
    gate_of,
    make_map,
    make_vocoder,
    plain,
    tokens_chunk,
    tokens_to_map_request,
)
from tests.support.toy_stages import ToyAREngine as _RuntimeToyAR

MAX_MODEL_LEN = 48  # like a real engine's context limit: generation stops there, whatever max_tokens says


def flatten_prompt(prompt: Any) -> Any:
    """A tiny chat template: the typed prompt the server builds, as text (or ids) the toy LM can read."""
    if isinstance(prompt, TextPrompt):
        return prompt.token_ids if prompt.token_ids is not None else prompt.text
    if not isinstance(prompt, ChatPrompt | SpeechPrompt):
        return prompt
    lines = []
    for m in prompt.messages:
        content = m["content"]
        if isinstance(content, list):
            content = "".join(p.get("text", f"<{p['type']}>") for p in content)
        lines.append(f"{m['role']}: {content}")
    media = prompt.media() if isinstance(prompt, ChatPrompt) else {}
    lines += [f"[{kind} x{len(items)}]" for kind, items in media.items()]
    if prompt.speaker:  # the voice changes what the toy says, so tests can see it arrive
        lines.insert(0, f"voice: {prompt.speaker}")
    return "\n".join(lines) + "\nassistant:"


def chat_input(ctx: StageInputContext) -> StageRequest:
    return StageRequest(ctx.request_id, prompt=flatten_prompt(ctx.prompt), params=ctx.params)


class ToyChatEngine(_RuntimeToyAR):
    """The runtime's toy LM with a context limit and prompt truncation, like a real engine."""

    def add_request(self, request: StageRequest) -> None:
        prompt = request.prompt
        if isinstance(prompt, str):
            prompt = prompt[-MAX_MODEL_LEN // 2 :]
        super().add_request(StageRequest(request.request_id, prompt=prompt, params=request.params))
        req = self.requests.get(request.request_id)
        if req is not None:
            req["left"] = max(1, min(req["left"], MAX_MODEL_LEN - len(req["prompt"])))


def make_chat(ctx: EngineContext) -> ToyChatEngine:
    return ToyChatEngine(ctx)


def speech_pipeline(gate_dir: str | None = None) -> PipelineSpec:
    return PipelineSpec(
        name="toy-omni",
        stages=(
            StageSpec(
                0,
                "thinker",
                StageKind.AR,
                final_output=True,
                output_modality="text",
                engine=make_chat,
                input_processor=chat_input,
                engine_args={"gate_dir": gate_dir},
            ),
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
                    "outputs_per_frame": 400,
                },
            ),
        ),
        default_modalities=("text",),
    )


class ToyDenoiser(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, kernel_size=3, padding=1)
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


class ToyDiffusionEngine:
    """Step-wise denoising of seeded latents; progress every step; images or video at the end.
    engine_args: video (bool), gate_dir. A prompt containing FAIL fails that request only; one containing
    MALFORMED sends a first image whose shape its final one does not share (outputs that cannot be joined)."""

    def __init__(self, ctx: EngineContext):
        self.model = ToyDenoiser().eval()
        self.video = bool(ctx.engine_args.get("video", False))
        self.gate_dir = ctx.engine_args.get("gate_dir")
        self.requests: dict[str, dict[str, Any]] = {}

    def add_request(self, request: StageRequest) -> None:
        p = request.params if isinstance(request.params, DiffusionParams) else DiffusionParams()
        width, height = p.width or 32, p.height or 24
        frames = (p.num_frames or 5) if self.video else 1
        gen = torch.Generator().manual_seed(p.seed if p.seed is not None else 0)
        latent = torch.randn(p.num_outputs * frames, 3, height, width, generator=gen)
        if p.image:
            reference = np.asarray(p.image[0].convert("RGB").resize((width, height)), dtype=np.float32)
            latent = 0.5 * latent + torch.from_numpy(reference / 127.5 - 1.0).permute(2, 0, 1)
        self.requests[request.request_id] = {
            "latent": latent,
            "step": 0,
            "total": p.num_inference_steps or 3,
            "outputs": p.num_outputs,
            "fps": p.fps or 8,
            "fail": "FAIL" in str(plain(request.prompt)),
            "malformed": "MALFORMED" in str(plain(request.prompt)),
            "gate": gate_of(request.prompt),
        }

    def add_chunk(self, request_id: str, inputs: dict[str, Any], last: bool) -> None:
        raise NotImplementedError

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)

    def _waiting(self, req: dict[str, Any]) -> bool:
        """Held before its last step at a gate the test has not opened."""
        gate = req["gate"]
        closed = gate is not None and not (self.gate_dir and Path(self.gate_dir, gate).exists())
        return closed and req["step"] == req["total"] - 1

    def has_work(self) -> bool:
        return any(not self._waiting(r) for r in self.requests.values())

    def step(self) -> list[StageOutput]:
        outs = []
        for rid, req in list(self.requests.items()):
            if self._waiting(req):
                continue
            with torch.no_grad():
                req["latent"] = req["latent"] - 0.1 * self.model.conv(req["latent"])
            req["step"] += 1
            progress = Progress(req["step"], req["total"])
            if req["fail"] and req["step"] == req["total"]:
                outs.append(self._failure(rid))
            elif req["step"] < req["total"]:
                outs.append(StageOutput(rid, progress=progress))
            else:
                if req["malformed"]:
                    outs.append(StageOutput(rid, images=torch.zeros(1, 2, 2, 3, dtype=torch.uint8)))
                outs.append(self._decode(rid, req, progress))
            if req["step"] >= req["total"]:
                del self.requests[rid]
        return outs

    def _failure(self, rid: str) -> StageOutput:
        return StageOutput(
            rid,
            finished=True,
            finish_reason="error",
            error="the prompt asked to fail",
            error_type="ValueError",
        )

    def _decode(self, rid: str, req: dict[str, Any], progress: Progress) -> StageOutput:
        pixels = ((torch.tanh(req["latent"]) + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
        pixels = pixels.permute(0, 2, 3, 1).contiguous()  # [N*F, H, W, 3]
        out = StageOutput(rid, progress=progress, finished=True, finish_reason="stop")
        if self.video:
            out.video, out.fps = pixels.reshape(req["outputs"], -1, *pixels.shape[1:]), req["fps"]
        else:
            out.images = pixels
        return out

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"num_requests": len(self.requests), "pid": os.getpid()}

    def shutdown(self) -> None:
        self.requests.clear()


def make_diffusion(ctx: EngineContext) -> ToyDiffusionEngine:
    return ToyDiffusionEngine(ctx)


def image_pipeline(gate_dir: str | None = None) -> PipelineSpec:
    stage = StageSpec(
        0,
        "dit",
        StageKind.DIFFUSION,
        final_output=True,
        output_modality="image",
        engine=make_diffusion,
        engine_args={"gate_dir": gate_dir},
    )
    return PipelineSpec(name="toy-image", stages=(stage,))


def video_pipeline(gate_dir: str | None = None) -> PipelineSpec:
    stage = StageSpec(
        0,
        "dit",
        StageKind.DIFFUSION,
        final_output=True,
        output_modality="video",
        engine=make_diffusion,
        engine_args={"video": True, "gate_dir": gate_dir},
    )
    return PipelineSpec(name="toy-video", stages=(stage,))


def diffusers_pipeline(name: str, modality: str) -> tuple[PipelineSpec, str]:
    """A real tiny diffusers checkpoint on the diffusion engine, as a one-stage user pipeline of the family
    that serves the checkpoint (whose step adapter its stage registers), with the capabilities the
    checkpoint resolves to."""
    from omnistage.families.diffusers.tiny import tiny_pipeline_dir
    from omnistage.families.resolve import resolve_pipeline

    path = tiny_pipeline_dir(name)
    stage = StageSpec(0, "dit", StageKind.DIFFUSION, final_output=True, output_modality=modality)
    resolved = resolve_pipeline(path)[0]
    caps = resolved.capabilities
    return PipelineSpec(name=name, stages=(stage,), family=resolved.family, capabilities=caps), str(path)


PIPELINES = {
    "toy-omni": speech_pipeline,
    "toy-image": image_pipeline,
    "toy-video": video_pipeline,
    "tiny-flux1": lambda gate_dir=None: diffusers_pipeline("tiny-flux1", "image"),
    "tiny-wan21-t2v": lambda gate_dir=None: diffusers_pipeline("tiny-wan21-t2v", "video"),
    "tiny-stable-audio": lambda gate_dir=None: diffusers_pipeline("tiny-stable-audio", "audio"),
}
