"""VoxCPM2: text → the LMs' continuous latent patches (AR, a flow-matching DiT in its post-sample hook) →
the causal AudioVAE's waveform.

Stage 0, the decoder, runs on the AR engine (decoder.py): the input processor builds the base LM's prompt
(text, the audio-start marker, a cloned voice's clip as latent patches) as `VoxCPM2Model._generate` does;
each step emits a patch of latents. Stage 1, the VAE decoder, on the generation engine (vae.py): patches
decoded as they come behind their exact left context (async chunk), or in one pass (full handoff, as the
reference).

A voice is cloned as VoxCPM2 does it: `ref_audio` with its transcript `ref_text` is a clip the model
continues (the reference's `prompt_wav_path` + `prompt_text`: its patches follow the text, and the VAE decodes
the last three as context); `ref_audio` alone is a reference clip kept apart (`reference_wav_path`: between
the reference markers, before the text). An uploaded voice is the same, with its transcript if it has one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import torch

from omnistage.config.capabilities import Capabilities, SpeechOption
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.families.shared.clips import mono_clip
from omnistage.families.shared.speech_fields import speech_fields
from omnistage.outputs import StageOutput, TokenCounts
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.generation.engine import stream_frames
from omnistage.stages.generation.generation_inputs import GenerationInputs

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py
_MODELS = "omnistage.families.voxcpm2"
# `VoxCPM2Model.generate`'s defaults: min_len 2 (a stop is allowed from the patch after it), max_len 2000,
# capped at 6 patches a text token + 10 (its retry_badcase_ratio_threshold)
MIN_LEN, MAX_LEN, RATIO = 2, 2000, 6.0
CONTEXT_PATCHES = 3  # a continued clip's last patches the VAE decodes as context (streaming_prefix_len - 1)
Text = Annotated[str, msgspec.Meta(max_length=4096)]
SPEECH_OPTIONS = (
    SpeechOption("ref_audio", str, "a clip of the voice to clone", media=True),
    SpeechOption("ref_text", Text, "what ref_audio says (the clip is then continued, not only referenced)"),
    SpeechOption(
        "cfg_value",
        Annotated[float, msgspec.Meta(ge=1.0, le=10.0)],
        "the local DiT's classifier-free guidance (default 2.0)",
    ),
    SpeechOption(
        "inference_timesteps",
        Annotated[int, msgspec.Meta(ge=1, le=100)],
        "flow-matching steps a patch (default 10)",
    ),
)


def _clip(loaded: Any, data: Any, param: str, padding: str) -> torch.Tensor:
    """A clip (bytes, or an uploaded voice's file) → its latent patches [T, P, D], as the reference's
    `_encode_wav`: mono at the VAE's input rate, padded to whole patches (`padding` side), VAE-encoded."""
    samples = mono_clip(data, loaded.vox.audio_vae.sample_rate, param)
    return loaded.clip_patches(torch.as_tensor(samples, dtype=torch.float32), padding)


def _voice(loaded: Any, fields: dict[str, Any]) -> dict[str, Any]:
    """The request's clip as decoder_prompt's arguments: a continued clip (with its transcript) or a
    reference clip (without one)."""
    voice, clip, text = fields.get("uploaded_voice"), fields.get("ref_audio"), fields.get("ref_text")
    if voice is not None:
        if clip is not None:
            raise InvalidRequestError(
                "ref_audio: give ref_audio or an uploaded voice, not both", param="ref_audio"
            )
        clip, text, param = voice["path"], text or voice.get("ref_text"), "voice"
    elif clip is None:
        if text is not None:
            raise InvalidRequestError("ref_text: needs its clip (ref_audio)", param="ref_text")
        return {}
    else:
        param = "ref_audio"
        if not isinstance(clip, bytes | bytearray) or not clip:
            raise InvalidRequestError("ref_audio: needs the bytes of an audio clip", param="ref_audio")
    if text:
        return {"prompt_feat": _clip(loaded, clip, param, "left"), "prompt_text": str(text)}
    return {"ref_feat": _clip(loaded, clip, param, "right")}


def speech_input(ctx: StageInputContext) -> StageRequest:
    """The speech route's text → the base LM's prompt (embeddings, audio positions) and the request's
    flow-matching settings; `max_tokens` capped as the reference caps `max_len`."""
    from omnistage.families.voxcpm2.decoder import decoder_prompt

    loaded = ctx.resources
    fields = speech_fields(ctx.prompt)
    text = str(fields.get("input") or "")
    if not text.strip():
        raise InvalidRequestError("input: Input text cannot be empty", param="input")
    if fields.get("instructions"):
        raise InvalidRequestError("instructions: VoxCPM2 takes no instructions", param="instructions")
    params = ctx.params
    if int(getattr(params, "n", 1) or 1) != 1:
        raise InvalidRequestError("n: VoxCPM2 speaks one waveform a request", param="n")
    voice = _voice(loaded, fields)
    ids, inputs = decoder_prompt(
        loaded,
        text,
        params,
        cfg_value=float(fields.get("cfg_value", 2.0)),
        timesteps=int(fields.get("inference_timesteps", 10)),
        **voice,
    )
    limit = min(int(params.max_tokens or MAX_LEN), int(len(loaded.vox.text_tokenizer(text)) * RATIO + 10))
    least = min(max(MIN_LEN + 1, int(params.min_tokens or 0)), limit)
    params = msgspec.structs.replace(params, max_tokens=limit, min_tokens=least)
    audio = int(inputs.extension.audio_mask.sum())
    if "prompt_feat" in voice:  # the VAE decodes the continued clip's last patches as context
        inputs.output_data["context"] = voice["prompt_feat"][-CONTEXT_PATCHES:]
    counts = TokenCounts(input_text_tokens=len(ids) - audio, input_audio_tokens=audio)
    return StageRequest(ctx.request_id, prompt=ids, params=params, inputs=inputs, token_counts=counts)


def _patches(latents: Any) -> torch.Tensor:
    """Stage 0's latent patches [T, P, D] as float32 ([0, 0, 0] for none)."""
    return torch.empty(0, 0, 0) if latents is None else torch.as_tensor(latents, dtype=torch.float32)


def _vae_request(ctx: StageInputContext, patches: torch.Tensor, streaming: bool) -> StageRequest:
    """The VAE's request, a continued clip's context patches first (decoded as context, never emitted)."""
    context = ctx.upstream[0].data.get("context") if ctx.upstream else None
    inputs = GenerationInputs(patches)
    if context is not None and len(context):
        context = torch.as_tensor(context, dtype=torch.float32)
        inputs = GenerationInputs(torch.cat([context, patches.reshape(-1, *context.shape[1:])]), len(context))
    return StageRequest(ctx.request_id, params=ctx.params, inputs=inputs, streaming_input=streaming)


def vae_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: every patch, in one pass (a continued clip's context first)."""
    return _vae_request(ctx, _patches(ctx.upstream[0].tensor("latents")), streaming=False)


def vae_chunk(
    ctx: StageInputContext, chunk: StageOutput, last: bool
) -> StageRequest | GenerationInputs | None:
    """Async chunk: each step's new patch as it comes."""
    patches = _patches(chunk.tensors.get("latents"))
    return stream_frames(ctx, patches, last, lambda part: _vae_request(ctx, part, True))


def resolve(info: Any) -> PipelineSpec | None:
    """A VoxCPM2 directory as `VoxCPM2Model.from_local` reads it: a config with the LMs', the local DiT's
    and encoder's sections, and the AudioVAE's weights beside it."""
    config = info.config or {}
    path = Path(info.path)
    vae = (path / "audiovae.safetensors").exists() or (path / "audiovae.pth").exists()
    if vae and {"lm_config", "dit_config", "encoder_config", "residual_lm_num_layers"} <= set(config):
        return VOXCPM2
    return None


VOXCPM2 = PipelineSpec(
    name="voxcpm2",
    stages=(
        StageSpec(
            stage_id=0,
            name="decoder",
            kind=StageKind.AR,
            input_processor=speech_input,
            # the stop head picks greedily, as the reference's argmax; a request's seed is its noise's
            sampling_constraints={"detokenize": False, "temperature": 0.0},
            engine_args={
                "model_loader": f"{_MODELS}.decoder:load_voxcpm",
                "post_sample_hook": f"{_MODELS}.decoder:voxcpm_patch",
            },
        ),
        StageSpec(
            stage_id=1,
            name="vae",
            kind=StageKind.GENERATION,
            inputs=(0,),
            final_output=True,
            output_modality="audio",
            input_processor=vae_input,
            chunk_processor=vae_chunk,
            engine=f"{_MODELS}.vae:create_engine",
        ),
    ),
    architectures=(),
    default_deploy=str(HERE / "voxcpm2.yaml"),
    family=FAMILY,
    capabilities=Capabilities(
        routes=("speech",),
        prompt="speech",
        fields={"sampling": (0,), "generation": (1,)},
        # one built-in voice (the model's own, unprompted); an uploaded voice is cloned from its clip
        voices=("default",),
        clones_voices=True,
        speech_options=SPEECH_OPTIONS,
    ),
)
