"""The qwen3_tts pipeline end to end (offline API, one process, full handoff): a checkpoint directory
resolves to the family by its config.json architectures, CustomVoice, VoiceDesign and Base (x-vector clone)
requests speak the reference's waveform (its talker codes decoded by its codec) within 1e-4, and bad fields
fail naming them."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from omnistage import Omni
from omnistage.families.resolve import resolve_pipeline
from tests.qwen3_tts.reference_outputs import reference_clone, reference_codes, reference_waveforms, tiny_dir
from tests.qwen3_tts.test_talker import MAX_NEW, talker_params

pytestmark = pytest.mark.engine

INLINE = "omnistage/families/qwen3_tts/qwen3_tts_inline.yaml"
FIRST = "initial_codec_chunk_frames"


def wrapped(tokenizer, text: str, instructions: str | None) -> dict:
    """The reference's own prompt strings (its `_build_assistant_text` / `_build_instruct_text`)."""
    ids = tokenizer(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    ins = tokenizer(f"<|im_start|>user\n{instructions}<|im_end|>\n")["input_ids"] if instructions else None
    return {"input_ids": ids, "instruct_ids": ins}


@pytest.mark.parametrize(
    ("variant", "prompt"),
    [
        ("custom_voice", {"input": "Hello there, a test!", "speaker": "vivian", "language": "English"}),
        ("voice_design", {"input": "The quick brown fox.", "instructions": "Speak in a warm voice"}),
    ],
)
def test_speech_equals_reference_waveform(variant: str, prompt: dict) -> None:
    model_dir = tiny_dir(variant)
    pipeline, _ = resolve_pipeline(str(model_dir))
    assert pipeline.name == "qwen3_tts"
    with Omni(str(model_dir), INLINE) as omni:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
        request = {
            **wrapped(tok, prompt["input"], prompt.get("instructions")),
            "language": prompt.get("language", "auto").lower(),
            "speaker": prompt.get("speaker"),
            "non_streaming_mode": True,
            "max_new_tokens": MAX_NEW,
        }
        codes = reference_codes(model_dir, [request])
        want = reference_waveforms(model_dir, codes)[0]
        out = omni.generate({"task": "speech", **prompt}, [talker_params(), None], use_tqdm=False)[0]
        assert out.error is None, out.error
        assert out.sample_rate == 24000 and out.audio.shape == want.shape
        assert float((out.audio.reshape(-1) - want).abs().max()) <= 1e-4
        assert float(want.std()) > 0.1


def test_bad_fields_fail_naming_them() -> None:
    with Omni(str(tiny_dir("voice_design")), INLINE) as omni:
        out = omni.generate({"task": "speech", "input": "Hi there"}, [talker_params(), None], use_tqdm=False)[
            0
        ]
        assert out.error is not None and "instructions" in str(out.error)
    with Omni(str(tiny_dir("custom_voice")), INLINE) as omni:
        cases = [
            ({"input": "Hi", "speaker": "nobody"}, "voice"),
            ({"input": "Hi"}, "voice"),
            ({"input": "Hi", "speaker": "ryan", "language": "Klingon"}, "language"),
            ({"input": "   ", "speaker": "ryan"}, "input"),
            ({"input": "Hi", "speaker": "ryan", FIRST: -1}, FIRST),
        ]
        outs = omni.generate(
            [{"task": "speech", **p} for p, _ in cases], [talker_params(), None], use_tqdm=False
        )
        for out, (_, field) in zip(outs, cases, strict=True):
            assert out.error is not None and field in str(out.error), (field, out.error)
        ok = omni.generate(
            {"task": "speech", "input": "Hi", "speaker": "ryan"}, [talker_params(), None], use_tqdm=False
        )
        assert ok[0].error is None and ok[0].audio.numel() > 0


def test_base_clones_an_uploaded_voice_as_the_reference(tmp_path) -> None:
    """Base, x-vector-only: an uploaded voice's clip (a WAV file) speaks the reference's waveform; a Base
    request without an uploaded voice, and a preset-voice checkpoint given one, are refused naming voice."""
    import soundfile

    from tests.qwen3_tts.test_clone import clip

    model_dir = tiny_dir("base")
    samples = clip(5, 1.5)
    path = tmp_path / "voice.wav"
    soundfile.write(str(path), samples.numpy(), 24000, subtype="FLOAT")
    voice = {"name": "mine", "path": str(path), "sample_rate": 24000, "ref_text": None}
    text = "Hello there, a test!"
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    request = {**wrapped(tok, text, None), "language": "english", "non_streaming_mode": False}
    request = {**request, "max_new_tokens": MAX_NEW}
    request.pop("instruct_ids")
    codes = reference_clone(model_dir, [request], [samples])["codes"]
    want = reference_waveforms(model_dir, codes)[0]
    with Omni(str(model_dir), INLINE) as omni:
        prompt = {"task": "speech", "input": text, "language": "English", "uploaded_voice": voice}
        out = omni.generate(prompt, [talker_params(), None], use_tqdm=False)[0]
        assert out.error is None, out.error
        assert out.audio.reshape(-1).shape == want.shape
        assert float((out.audio.reshape(-1) - want).abs().max()) <= 1e-4
        bad = omni.generate({"task": "speech", "input": text}, [talker_params(), None], use_tqdm=False)[0]
        assert bad.error is not None and "voice" in str(bad.error) and "Base" in str(bad.error)
    with Omni(str(tiny_dir("custom_voice")), INLINE) as omni:
        prompt = {"task": "speech", "input": text, "speaker": "mine", "uploaded_voice": voice}
        bad = omni.generate(prompt, [talker_params(), None], use_tqdm=False)[0]
        assert bad.error is not None and "CustomVoice" in str(bad.error)


def test_base_clones_in_context_as_the_reference(tmp_path) -> None:
    """Base, in context: an uploaded voice with a transcript speaks the reference's `generate_voice_clone`
    waveform (its clip's codes decoded before the new ones, the clip's share cut) within 1e-4; asked
    `x_vector_only_mode`, the same voice clones by x-vector only (other audio); usage counts the clip's
    frames as audio tokens."""
    import soundfile

    from tests.qwen3_tts.reference_outputs import reference_icl
    from tests.qwen3_tts.test_clone import clip

    model_dir = tiny_dir("base")
    samples = clip(6, 0.8)
    path = tmp_path / "voice.wav"
    soundfile.write(str(path), samples.numpy(), 24000, subtype="FLOAT")
    ref_text, text = "The quick brown fox.", "Hello there, a test!"
    voice = {"name": "mine", "path": str(path), "sample_rate": 24000, "ref_text": ref_text}
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    request = {
        **wrapped(tok, text, None),
        "ref_ids": tok(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")["input_ids"],
        "language": "english",
        "non_streaming_mode": False,
        "max_new_tokens": MAX_NEW,
    }
    request.pop("instruct_ids")
    expected = reference_icl(model_dir, [request], [samples], waveforms=True)
    want = expected["wavs"][0]
    with Omni(str(model_dir), INLINE) as omni:
        prompt = {"task": "speech", "input": text, "language": "English", "uploaded_voice": voice}
        out = omni.generate(prompt, [talker_params(), None], use_tqdm=False)[0]
        assert out.error is None, out.error
        audio = out.audio.reshape(-1)
        assert audio.shape == want.shape == (len(expected["codes"][0]) * 1920,)
        assert float((audio - want).abs().max()) <= 1e-4
        assert out.token_counts.input_audio_tokens == len(expected["ref_codes"][0]) == 10
        xvec = omni.generate({**prompt, "x_vector_only_mode": True}, [talker_params(), None], use_tqdm=False)
        assert xvec[0].error is None and xvec[0].token_counts.input_audio_tokens == 0
        assert not torch.equal(xvec[0].audio.reshape(-1)[: len(audio)], audio)
