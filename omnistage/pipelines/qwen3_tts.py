"""Qwen3-TTS (12 Hz): text → talker codes (16 codebooks a frame) → 24 kHz waveform.

Stage 0, the talker, runs on the AR engine; its code predictor runs in the post-sample hook, batched over
the step's sequences, so each step yields a whole frame (models/qwen3_tts/talker.py). Stage 1, the codec
decoder, runs on the generation engine (models/qwen3_tts/decoder_stage.py): in async chunk it decodes the
frames as they come, in full handoff once the talker is done, exactly as the reference.

Tasks follow the checkpoint's `tts_model_type`: CustomVoice (`custom_voice`: a preset `voice`, optional
`instructions`), VoiceDesign (`voice_design`: `instructions` required, no preset voice), Base (`base`:
voice cloning from an uploaded voice, x-vector-only: the clip's speaker embedding in the preset speaker's
place). In-context cloning (the clip's codes and transcript in the prompt) is not served yet: a Base
request that would need it (`ref_text` without `x_vector_only_mode`) answers 400 saying so. A request
that does not fit the checkpoint's task answers 400 naming the task the checkpoint serves.
"""

from __future__ import annotations

import torch

from omnistage.config.capabilities import Capabilities
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.outputs import StageOutput, TokenCounts
from omnistage.pipelines import registry
from omnistage.stages.base import StageInputContext, StageRequest

_MODELS = "omnistage.models.qwen3_tts"
ARCHITECTURE = "Qwen3TTSForConditionalGeneration"
TASKS = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}
CODEC_EOS, CODEBOOK = 2150, 2048
# The reference generate's defaults (generation_config.json): sampled, repetition penalty 1.05 on the
# generated codes, codes 2048.. suppressed but EOS, at least 2 frames. The code predictor is greedy.
TALKER_DEFAULTS = {
    "temperature": 0.9,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.05,
    "min_tokens": 2,
    "max_tokens": 4095,
    "allowed_token_ids": [*range(CODEBOOK), CODEC_EOS],
}


def speech_input(ctx: StageInputContext) -> StageRequest:
    """The speech route's prompt ({"input", "speaker", "instructions", "language"}) → the talker's prompt."""
    from omnistage.models.qwen3_tts.prompt import talker_prompt

    loaded = ctx.resources
    prompt = ctx.prompt if isinstance(ctx.prompt, dict) else {"input": str(ctx.prompt or "")}
    text = str(prompt.get("input") or "")
    if not text.strip():
        raise InvalidRequestError("input: Input text cannot be empty", param="input")
    task = loaded.tts_config.get("tts_model_type")
    speaker, instructions = prompt.get("speaker"), prompt.get("instructions")
    cloned = prompt.get("uploaded_voice")
    if (cloned is not None) != (task == "base"):
        raise InvalidRequestError(
            f"voice: this checkpoint serves {TASKS.get(task, task)}"
            + (": it clones an uploaded voice" if task == "base" else "; it cannot clone an uploaded voice"),
            param="voice",
        )
    speaker_embed = None
    if cloned is not None:  # the reference's voice clone takes no instructions
        speaker, instructions, speaker_embed = None, None, _x_vector(loaded, cloned, prompt)
    if task == "custom_voice" and not speaker:
        raise InvalidRequestError(
            "voice: CustomVoice needs a voice (one of the model's speakers)", param="voice"
        )
    if task == "voice_design":
        if not instructions:
            raise InvalidRequestError("instructions: VoiceDesign needs instructions", param="instructions")
        speaker = None  # a designed voice has no preset speaker
    tokenizer = loaded.tokenizer
    input_ids = tokenizer(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    instruct_ids = None
    if instructions:
        instruct_ids = tokenizer(f"<|im_start|>user\n{instructions}<|im_end|>\n")["input_ids"]
    language = str(prompt.get("language") or "auto")
    # The reference's defaults: the whole text in the prompt, except Base, which reads a token a frame.
    non_streaming = task != "base"
    ids, inputs = talker_prompt(
        loaded, input_ids, instruct_ids, language, speaker, non_streaming, speaker_embed=speaker_embed
    )
    text_tokens = len(input_ids) + len(instruct_ids or [])
    counts = TokenCounts(input_text_tokens=text_tokens)
    return StageRequest(ctx.request_id, prompt=ids, params=ctx.params, inputs=inputs, token_counts=counts)


def _x_vector(loaded: object, voice: dict, prompt: dict) -> torch.Tensor:
    """An uploaded voice's x-vector, computed once per voice file and kept on the loaded model."""
    import os

    import numpy as np

    from omnistage.media import decode_audio
    from omnistage.models.qwen3_tts.speaker import SAMPLE_RATE

    if voice.get("ref_text") and not prompt.get("x_vector_only_mode", True):
        raise InvalidRequestError(
            "x_vector_only_mode: in-context cloning (with the clip's transcript) is not served yet; set "
            "it to true",
            param="x_vector_only_mode",
        )
    cache = loaded.__dict__.setdefault("x_vectors", {})
    stat = os.stat(voice["path"])
    key = (voice["path"], stat.st_mtime_ns, stat.st_size)
    if key not in cache:
        with open(voice["path"], "rb") as f:
            samples, rate = decode_audio(f.read())
        samples = samples.mean(axis=0) if samples.ndim == 2 else samples
        if rate != SAMPLE_RATE:
            from omnistage.serving.media import resample

            samples = resample(samples, rate, SAMPLE_RATE)
        cache[key] = loaded.speaker_encoder.embed(torch.from_numpy(np.asarray(samples, dtype=np.float32)))
    return cache[key]


def _frames(codes: torch.Tensor | None) -> torch.Tensor:
    """The talker's frames without its EOS frame."""
    if codes is None:
        return torch.empty((0, 16), dtype=torch.long)
    return codes[codes[:, 0] != CODEC_EOS]


def codec_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: the talker's finished frames."""
    return StageRequest(ctx.request_id, params=ctx.params, inputs={"codes": _frames(ctx.upstream[0].codes)})


def codec_chunk(ctx: StageInputContext, chunk: StageOutput, last: bool) -> StageRequest | dict | None:
    """Async chunk: each step's new frames as they come."""
    frames = _frames(chunk.codes)
    if not ctx.state.get("started"):
        ctx.state["started"] = True
        return StageRequest(ctx.request_id, params=ctx.params, inputs={"codes": frames}, streaming_input=True)
    return {"codes": frames} if len(frames) or last else None


def checkpoint_speakers(model_dir: str) -> list[str]:
    """The checkpoint's preset voices (CustomVoice), for the voices list."""
    from omnistage.models.qwen3_tts.talker import read_config

    return sorted((read_config(model_dir)["talker_config"].get("spk_id") or {}).keys())


QWEN3_TTS = registry.register(
    PipelineSpec(
        name="qwen3_tts",
        stages=(
            StageSpec(
                stage_id=0,
                name="talker",
                kind=StageKind.AR,
                input_processor=speech_input,
                sampling_constraints={"detokenize": False},
                default_params=TALKER_DEFAULTS,
                engine_args={
                    "model_loader": f"{_MODELS}.talker:load_talker",
                    "post_sample_hook": f"{_MODELS}.talker:predict_codes",
                },
            ),
            StageSpec(
                stage_id=1,
                name="codec",
                kind=StageKind.GENERATION,
                inputs=(0,),
                final_output=True,
                output_modality="audio",
                input_processor=codec_input,
                chunk_processor=codec_chunk,
                engine=f"{_MODELS}.decoder_stage:create_engine",
            ),
        ),
        architectures=(ARCHITECTURE,),
        default_deploy="qwen3_tts.yaml",
        capabilities=Capabilities(
            routes=("speech",),
            prompt="speech",
            fields={"sampling": (0,), "generation": (1,)},
            voices_of="omnistage.pipelines.qwen3_tts:checkpoint_speakers",
            clones_voices=True,
        ),
    )
)
