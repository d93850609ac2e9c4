"""Qwen2.5-Omni: thinker (AR) → talker (AR) → code2wav (generation), from one checkpoint directory.

- Stage 0, thinker: the real processor turns text, images, audio and video into token ids, merged
  embeddings and multimodal RoPE positions (in the thinker's process, where its encoders live); it answers
  in text and returns its hidden states for the talker.
- Stage 1, talker: the thinker's prompt and reply become the talker's inputs exactly as
  `Qwen2_5OmniForConditionalGeneration.generate` builds them (talker.py), once the
  thinker has finished (full handoff) or row by row while it writes (async chunk); it samples
  speech codec tokens with the reference's constraints (codec BOS suppressed, codec pad/end stop it) and
  the chosen speaker's text BOS (`prompt["speaker"]`, default Chelsie).
- Stage 2, code2wav: the DiT + BigVGAN vocoder turn codes into 24 kHz audio, in one pass at the end
  (full handoff) or chunk by chunk while the talker is still speaking (async chunk, the default deploy).

`modalities=["text"]` runs the thinker alone. A checkpoint with `enable_audio_output: false` resolves to
the thinker-only pipeline.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec
import torch

from omnistage.config.capabilities import Capabilities
from omnistage.config.pipeline import PipelineSpec
from omnistage.errors import InvalidRequestError
from omnistage.families.resolve import ModelInfo
from omnistage.families.shared.omni_topology import OmniParts, omni_stages, thinker_stage
from omnistage.outputs import StageOutput
from omnistage.params import GenerationParams
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.generation.engine import stream_frames
from omnistage.stages.generation.generation_inputs import GenerationInputs

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py

# Model helpers are imported inside the processors: each stage process imports only what it runs.
_MODELS = "omnistage.families.qwen2_5_omni"
DEFAULT_SPEAKER = "Chelsie"
# The reference's talker sampling (`generate(talker_do_sample=True, ...)` defaults).
TALKER_DEFAULTS = {
    "temperature": 0.9,
    "top_k": 40,
    "top_p": 0.8,
    "repetition_penalty": 1.05,
    "max_tokens": 4096,
}


def speaker_of(prompt: Any) -> str:
    speaker = getattr(prompt, "speaker", None)  # a text, chat or speech prompt's
    return speaker or DEFAULT_SPEAKER


# ---- input processors (each runs in its stage's process, next to the model it feeds) --------------------
def thinker_input(ctx: StageInputContext) -> StageRequest:
    from omnistage.families.qwen2_5_omni.thinker import thinker_prompt

    speakers = ctx.resources.speakers
    if speakers and speaker_of(ctx.prompt) not in speakers:  # fail before any work, not at the talker
        raise InvalidRequestError(
            f"unknown speaker {speaker_of(ctx.prompt)!r}; this model has {speakers}", param="speaker"
        )
    ids, inputs = thinker_prompt(ctx.resources, ctx.prompt)
    return StageRequest(ctx.request_id, prompt=ids, params=ctx.params, inputs=inputs)


def talker_input(ctx: StageInputContext) -> StageRequest:
    return _talker_request(ctx, finished=True)


def _talker_request(ctx: StageInputContext, finished: bool) -> StageRequest:
    from omnistage.families.qwen2_5_omni.talker import talker_prompt

    thinker = ctx.upstream[0]
    ids, inputs = talker_prompt(
        ctx.resources,
        thinker.prompt_token_ids,
        thinker.token_ids,
        thinker.hidden(-1),
        speaker_of(ctx.prompt),
        thinker.data.get("mrope_positions"),
        thinker.data.get("rope_delta", 0),
        finished=finished,
    )
    return StageRequest(ctx.request_id, prompt=ids, params=ctx.params, inputs=inputs)


def talker_chunk(ctx: StageInputContext, chunk: StageOutput, last: bool) -> StageRequest | ARInputs | None:
    """Async chunk: the talker starts once the thinker has two tokens out (its prompt is then fixed) and
    gets each further reply row as the thinker's output determines it."""
    from omnistage.families.qwen2_5_omni.talker import ThinkerReply, new_reply_rows, talker_reply_rows

    thinker = ctx.upstream[0]
    if not ctx.state.get("started"):
        if len(thinker.token_ids) < 2 and not last:
            return None
        request = _talker_request(ctx, finished=last)
        ctx.state["started"] = True
        ctx.state["rows"] = request.inputs.extension.rows.shape[0]
        return request
    start = ctx.state["rows"]
    new_hidden = thinker.hidden_tail(-1, new_reply_rows(len(thinker.token_ids), start))
    rows = talker_reply_rows(ctx.resources, thinker.token_ids, new_hidden, start, finished=last)
    ctx.state["rows"] += rows.shape[0]
    return ARInputs(extension=ThinkerReply(rows)) if rows.shape[0] or last else None


def code2wav_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: every code the talker spoke, decoded once."""
    codes = _spoken(ctx, ctx.upstream[1].token_ids)
    return StageRequest(ctx.request_id, params=_code2wav_params(ctx), inputs=GenerationInputs(codes))


def code2wav_chunk(
    ctx: StageInputContext, chunk: StageOutput, last: bool
) -> StageRequest | GenerationInputs | None:
    """Async chunk: each talker delta's codes join the request's code stream."""

    def start(codes: torch.Tensor) -> StageRequest:
        return StageRequest(ctx.request_id, params=_code2wav_params(ctx), inputs=GenerationInputs(codes))

    return stream_frames(ctx, _spoken(ctx, chunk.token_ids), last, start)


def _spoken(ctx: StageInputContext, token_ids: list[int]) -> torch.Tensor:
    stop = set(ctx.resources.stop_codes)
    return torch.tensor([t for t in token_ids if t not in stop], dtype=torch.long)


def _code2wav_params(ctx: StageInputContext) -> GenerationParams:
    """The request's seed (a random one if unset: every window of a request must share its noise) and
    speaker."""
    params = ctx.params if isinstance(ctx.params, GenerationParams) else GenerationParams()
    seed = params.seed if params.seed is not None else random.getrandbits(31)
    extra = {**params.extra, "speaker": speaker_of(ctx.prompt)}
    return msgspec.structs.replace(params, seed=seed, extra=extra)


# ---- topology --------------------------------------------------------------------------------------------


PARTS = OmniParts(
    thinker_input=thinker_input,
    thinker_args={"model_loader": f"{_MODELS}.loaders:load_thinker"},
    thinker_constraints={"return_hidden_states": True},  # the talker is built from its last layer
    talker_input=talker_input,
    talker_chunk=talker_chunk,
    talker_args={
        "model_loader": f"{_MODELS}.loaders:load_talker",
        "step_embed_hook": f"{_MODELS}.talker:add_thinker_reply",
        "step_ready_hook": f"{_MODELS}.talker:thinker_reply_ready",
    },
    talker_defaults=TALKER_DEFAULTS,
    code2wav_input=code2wav_input,
    code2wav_chunk=code2wav_chunk,
    code2wav_engine=f"{_MODELS}.token2wav:create_engine",
)
SPEECH_STAGES = omni_stages(PARTS)

# Request sampling fields drive the thinker (the talker keeps TALKER_DEFAULTS unless `stage_params[1]`
# names a field); the seed reaches code2wav. The speakers are the checkpoint's (checked by the thinker).
SPEECH_CAPABILITIES = Capabilities(
    routes=("chat", "completions", "speech", "realtime"),
    prompt="chat",
    fields={"sampling": (0,), "generation": (2,)},
    voices_of="omnistage.families.qwen2_5_omni.pipeline:checkpoint_speakers",
)


def checkpoint_speakers(model_dir: str) -> list[str]:
    """The speakers of the checkpoint's `spk_dict.pt` (none without one)."""
    from omnistage.families.qwen2_5_omni.loaders import load_speakers

    return sorted(load_speakers(model_dir)) if (Path(model_dir) / "spk_dict.pt").exists() else []


QWEN2_5_OMNI = PipelineSpec(
    name="qwen2_5_omni",
    stages=SPEECH_STAGES,
    default_deploy=str(HERE / "qwen2_5_omni.yaml"),
    family=FAMILY,
    capabilities=SPEECH_CAPABILITIES,
)
QWEN2_5_OMNI_THINKER_ONLY = PipelineSpec(
    name="qwen2_5_omni_thinker_only",
    stages=(thinker_stage(PARTS),),
    family=FAMILY,
    capabilities=Capabilities(routes=("chat", "completions"), prompt="chat", fields={"sampling": (0,)}),
)


def resolve(info: ModelInfo) -> PipelineSpec | None:
    """Qwen2.5-Omni directories; without audio output only the thinker is served."""
    if info.model_type != "qwen2_5_omni" and "Qwen2_5OmniForConditionalGeneration" not in info.architectures:
        return None
    return QWEN2_5_OMNI if (info.config or {}).get("enable_audio_output", True) else QWEN2_5_OMNI_THINKER_ONLY
