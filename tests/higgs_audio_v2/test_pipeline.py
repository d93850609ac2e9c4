"""The higgs_audio_v2 pipeline end to end (offline API, one process, full handoff): a checkpoint directory
resolves to the family by its architectures, and a request speaks the reference's waveform (its greedy frames
decoded by its codec as `processor.decode` does) within 1e-4, plain, with a scene, and in a cloned voice."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile
import torch

from omnistage import Omni
from omnistage.families.higgs_audio_v2.pipeline import codec_frames
from omnistage.families.resolve import resolve_pipeline
from omnistage.params import SamplingParams
from omnistage.prompts import SpeechPrompt
from tests.higgs_audio_v2.reference import CLONE, MAX_NEW, PROMPTS, reference_codes, reference_waveform

pytestmark = pytest.mark.engine

INLINE = "omnistage/families/higgs_audio_v2/higgs_audio_v2_inline.yaml"


def wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, 24000, format="WAV", subtype="FLOAT")
    return out.getvalue()


def speech(text: str, scene: str | None, voice: tuple | None) -> SpeechPrompt:
    options: dict = {}
    if scene is not None:
        options["scene"] = scene
    if voice is not None:
        options.update(ref_text=voice[0], ref_audio=wav(voice[1]))
    return SpeechPrompt(input=text, options=options)


def test_codec_frames_revert_the_delay_pattern_as_the_processor() -> None:
    """Partial requests give the complete codec frames so far, a prefix of the finished request's."""
    from tests.higgs_audio_v2.reference import reference_model

    _, processor = reference_model()
    codes = reference_codes(*PROMPTS[0])
    bos, eos = processor.audio_stream_bos_id, processor.audio_stream_eos_id
    full = codec_frames(codes, bos, eos)
    k = codes.shape[1]
    body = (
        codes[1 : int((codes == eos).all(dim=1).nonzero()[0])]
        if (codes == eos).all(dim=1).any()
        else codes[1:]
    )
    assert torch.equal(full, processor.revert_delay_pattern(body).clip(0, bos - 1))
    for n in range(len(codes) + 1):
        part = codec_frames(codes[:n], bos, eos)
        assert torch.equal(part, full[: len(part)]) and len(part) == max(0, min(n - k, len(full))), n


def test_speech_equals_reference_waveform() -> None:
    from omnistage.families.higgs_audio_v2.tiny import tiny_higgs_dir

    model_dir = str(tiny_higgs_dir())
    pipeline, _ = resolve_pipeline(model_dir)
    assert pipeline.name == "higgs_audio_v2"
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    with Omni(model_dir, INLINE) as omni:
        for prompt in (PROMPTS[0], PROMPTS[1], CLONE):
            out = omni.generate(speech(*prompt), [greedy, None], use_tqdm=False)[0]
            assert out.error is None, out.error
            want = reference_waveform(*prompt)
            assert out.sample_rate == 24000 and out.audio.reshape(-1).shape == want.shape
            assert float((out.audio.reshape(-1) - want).abs().max()) <= 1e-4
            assert float(want.abs().max()) > 0.0


def test_async_chunks_speak_the_reference_waveform(tmp_path) -> None:
    """Async chunk (the default deployment's handoff, here inline with small chunks): each codec chunk is
    decoded behind and ahead of the decoder's receptive field, so the joined audio is the reference's."""
    from pathlib import Path

    from omnistage.families.higgs_audio_v2.tiny import tiny_higgs_dir

    base = Path(INLINE).resolve().parent / "higgs_audio_v2.yaml"
    deploy = tmp_path / "async.yaml"
    deploy.write_text(
        f"base_config: {base}\n"
        "async_chunk: true\n"
        "stages:\n"
        "  - stage_id: 0\n"
        "    placement: inline\n"
        "  - stage_id: 1\n"
        "    placement: inline\n"
        "    engine_args: {chunk_frames: 4, first_chunk_frames: 2}\n"
    )
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    with Omni(str(tiny_higgs_dir()), str(deploy)) as omni:
        for prompt in (PROMPTS[2], CLONE):
            out = omni.generate(speech(*prompt), [greedy, None], use_tqdm=False)[0]
            assert out.error is None, out.error
            want = reference_waveform(*prompt)
            assert out.audio.reshape(-1).shape == want.shape
            assert float((out.audio.reshape(-1) - want).abs().max()) <= 1e-4
