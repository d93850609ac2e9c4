"""Qwen3-Omni: MoE thinker (AR) → MoE talker + code predictor (AR) → code2wav (generation).

- Stage 0, thinker: the real processor turns text, audio, images and videos into token ids, merged
  embeddings, interleaved multimodal RoPE positions and DeepStack vision features
  (thinker.py); it answers in text and, for a prompt with media, returns its hidden
  layer `accept_hidden_layer` (the talker projects the media positions from it; a text prompt needs none).
- Stage 1, talker: its prompt is cut out of the thinker's prompt and reply exactly as
  `Qwen3OmniMoeForConditionalGeneration.generate` does (talker.py); each step samples
  codebook 0, the post-sample hook runs the code predictor for the other 15 (one frame per step) and the
  step hook adds the next text row. Async chunk: it starts once the thinker has two tokens out.
- Stage 2, code2wav: 16-codebook frames → 24 kHz audio, chunk by chunk with left context (async chunk, the
  default deploy) or in one pass as the reference (full handoff).

`modalities=["text"]` runs the thinker alone. A checkpoint with `enable_audio_output: false` resolves to the
thinker-only pipeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import torch

from omnistage.config.capabilities import Capabilities
from omnistage.config.pipeline import PipelineSpec
from omnistage.families.resolve import ModelInfo
from omnistage.families.shared.omni_topology import OmniParts, omni_stages, thinker_stage
from omnistage.outputs import StageOutput
from omnistage.params import SamplingParams
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.cpu.layer_forms import LayerForm
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.generation.engine import stream_frames
from omnistage.stages.generation.generation_inputs import GenerationInputs

HERE = Path(__file__).parent
# The lean decoder's forms of the talker (multimodal rotary from the model's own rotary_emb; the final norm is
# of the second class, with the same sums) and of its code predictor.
LAYER_FORMS = (
    LayerForm(
        "Qwen3OmniMoeTalkerDecoderLayer",
        "Qwen3OmniMoeThinkerTextAttention",
        ("Qwen3OmniMoeThinkerTextRMSNorm", "Qwen3OmniMoeTextRMSNorm"),
        "Qwen3OmniMoeTalkerTextSparseMoeBlock",
    ),
    LayerForm(
        "Qwen3OmniMoeTalkerCodePredictorDecoderLayer",
        "Qwen3OmniMoeTalkerCodePredictorAttention",
        ("Qwen3OmniMoeRMSNorm",),
    ),
)
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py

_MODELS = "omnistage.families.qwen3_omni"
ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"
CODEC_EOS = 2150
# The reference's talker sampling (`generate(talker_do_sample=True, ...)` defaults); its suppressed ids
# are masked by the talker's head (loaders.TalkerHead).
TALKER_DEFAULTS = {
    "temperature": 0.9,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.05,
    "max_tokens": 4096,
}


def speaker_of(prompt: Any) -> str:
    from omnistage.families.qwen3_omni.talker import DEFAULT_SPEAKER

    speaker = getattr(prompt, "speaker", None)  # a text, chat or speech prompt's
    return speaker or DEFAULT_SPEAKER


# ---- input processors (each runs in its stage's process, next to the model it feeds) --------------------
def thinker_input(ctx: StageInputContext) -> StageRequest:
    from omnistage.errors import InvalidRequestError
    from omnistage.families.qwen3_omni.thinker import thinker_prompt

    loaded = ctx.resources
    speakers = loaded.speakers
    if speakers and speaker_of(ctx.prompt).lower() not in speakers:  # fail before any work
        raise InvalidRequestError(
            f"unknown speaker {speaker_of(ctx.prompt)!r}; this model has {speakers}", param="speaker"
        )
    ids, inputs = thinker_prompt(loaded, ctx.prompt)
    params = ctx.params
    if inputs.inputs_embeds is not None and speakers and isinstance(params, SamplingParams):
        layers = [*params.hidden_state_layers, loaded.accept_hidden_layer]
        params = msgspec.structs.replace(params, hidden_state_layers=layers)
    return StageRequest(ctx.request_id, prompt=ids, params=params, inputs=inputs)


def talker_input(ctx: StageInputContext) -> StageRequest:
    return _talker_request(ctx, finished=True)


def _talker_request(ctx: StageInputContext, finished: bool) -> StageRequest:
    from omnistage.families.qwen3_omni.talker import talker_prompt

    thinker = ctx.upstream[0]
    layer = ctx.resources.talker.config.accept_hidden_layer
    ids, inputs = talker_prompt(
        ctx.resources,
        thinker.prompt_token_ids,
        thinker.token_ids,
        thinker.hidden(layer),
        speaker_of(ctx.prompt),
        thinker.data.get("talker_rope"),
        finished=finished,
    )
    return StageRequest(ctx.request_id, prompt=ids, params=ctx.params, inputs=inputs)


def talker_chunk(ctx: StageInputContext, chunk: StageOutput, last: bool) -> StageRequest | ARInputs | None:
    """Async chunk: the talker starts once the thinker has two tokens out (its prompt is then fixed) and
    gets each further text row as the thinker's output determines it."""
    from omnistage.families.qwen3_omni.talker import text_stream_rows
    from omnistage.families.qwen3_tts.talker_inputs import TalkerText

    thinker = ctx.upstream[0]
    if not ctx.state.get("started"):
        if len(thinker.token_ids) < 2 and not last:
            return None
        request = _talker_request(ctx, finished=last)
        ctx.state["started"] = True
        ctx.state["rows"] = request.inputs.extension.trailing_text.shape[0] - int(last)
        return request
    start = ctx.state["rows"]
    rows = text_stream_rows(ctx.resources, thinker.token_ids, start, finished=last)
    ctx.state["rows"] += rows.shape[0] - int(last)
    return ARInputs(extension=TalkerText(rows)) if rows.shape[0] or last else None


def _frames(codes: torch.Tensor | None) -> torch.Tensor:
    """The talker's frames without its EOS frame."""
    if codes is None:
        return torch.empty((0, 16), dtype=torch.long)
    return codes[codes[:, 0] != CODEC_EOS]


def code2wav_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: every frame the talker spoke, decoded once."""
    frames = _frames(ctx.upstream[1].codes)
    return StageRequest(ctx.request_id, params=ctx.params, inputs=GenerationInputs(frames))


def code2wav_chunk(
    ctx: StageInputContext, chunk: StageOutput, last: bool
) -> StageRequest | GenerationInputs | None:
    """Async chunk: each talker step's frames join the request's code stream."""
    return stream_frames(ctx, _frames(chunk.codes), last)


# ---- topology --------------------------------------------------------------------------------------------
PARTS = OmniParts(
    thinker_input=thinker_input,
    thinker_args={"model_loader": f"{_MODELS}.loaders:load_thinker"},
    talker_input=talker_input,
    talker_chunk=talker_chunk,
    talker_args={
        "model_loader": f"{_MODELS}.loaders:load_talker",
        "post_sample_hook": f"{_MODELS}.talker:predict_codes",
        "step_embed_hook": f"{_MODELS}.talker:add_text_row",
        "step_ready_hook": f"{_MODELS}.talker:text_row_ready",
    },
    talker_defaults=TALKER_DEFAULTS,
    code2wav_input=code2wav_input,
    code2wav_chunk=code2wav_chunk,
    code2wav_engine=f"{_MODELS}.code2wav:create_engine",
)
SPEECH_STAGES = omni_stages(PARTS)


def checkpoint_speakers(model_dir: str) -> list[str]:
    """The checkpoint's speakers (`talker_config.speaker_id`), as the reference names them."""
    import json
    from pathlib import Path

    config = json.loads((Path(model_dir) / "config.json").read_text())
    return sorted(name.capitalize() for name in (config.get("talker_config", {}).get("speaker_id") or {}))


QWEN3_OMNI = PipelineSpec(
    name="qwen3_omni",
    stages=SPEECH_STAGES,
    default_deploy=str(HERE / "qwen3_omni.yaml"),
    family=FAMILY,
    capabilities=Capabilities(
        routes=("chat", "completions", "speech"),
        prompt="chat",
        fields={"sampling": (0,)},
        voices_of="omnistage.families.qwen3_omni.pipeline:checkpoint_speakers",
    ),
)
QWEN3_OMNI_THINKER_ONLY = PipelineSpec(
    name="qwen3_omni_thinker_only",
    stages=(thinker_stage(PARTS),),
    family=FAMILY,
    capabilities=Capabilities(routes=("chat", "completions"), prompt="chat", fields={"sampling": (0,)}),
)


def resolve(info: ModelInfo) -> PipelineSpec | None:
    """Qwen3-Omni directories; without audio output only the thinker is served."""
    if info.model_type != "qwen3_omni_moe" and ARCHITECTURE not in info.architectures:
        return None
    return QWEN3_OMNI if (info.config or {}).get("enable_audio_output", True) else QWEN3_OMNI_THINKER_ONLY
