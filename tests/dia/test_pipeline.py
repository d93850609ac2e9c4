"""The dia pipeline end to end (offline API, one process, full handoff): a checkpoint directory resolves to
the family by its architectures, and a request speaks the reference's waveform (its greedy frames with the
checkpoint's classifier-free guidance, `DiaProcessor.batch_decode`d) within 1e-4."""

from __future__ import annotations

import pytest
import torch

from omnistage import Omni
from omnistage.families.resolve import resolve_pipeline
from omnistage.params import SamplingParams
from omnistage.prompts import SpeechPrompt
from tests.dia.reference import GUIDED_TOP_K, MAX_NEW, PROMPTS, reference_audio, reference_codes

pytestmark = pytest.mark.engine

INLINE = "omnistage/families/dia/dia_inline.yaml"


def test_speech_equals_reference_waveform() -> None:
    from omnistage.families.dia.tiny import tiny_dia_dir

    model_dir = str(tiny_dia_dir())
    pipeline, _ = resolve_pipeline(model_dir)
    assert pipeline.name == "dia"
    greedy = SamplingParams(temperature=0.0, top_k=GUIDED_TOP_K, max_tokens=MAX_NEW)
    with Omni(model_dir, INLINE) as omni:
        for text in (PROMPTS[0], PROMPTS[1]):
            out = omni.generate(SpeechPrompt(input=text), [greedy, None], use_tqdm=False)[0]
            assert out.error is None, out.error
            want = reference_audio(reference_codes(text))
            assert out.sample_rate == 44100 and out.audio.reshape(-1).shape == want.shape
            assert float((out.audio.reshape(-1) - want).abs().max()) <= 1e-4
            assert float(want.abs().max()) > 0.0


def test_async_chunks_through_the_chunk_processor_equal_reference_waveform() -> None:
    """The decoder's delayed frames handed on a few at a time (as async chunk does): the chunk processor
    undelays what each completes, the codec engine decodes chunks behind their exact context, and the joined
    audio is the reference's `batch_decode` within 1e-4."""
    from omnistage.config.pipeline import StageSpec
    from omnistage.families.dia.pipeline import codec_chunk
    from omnistage.outputs import StageOutput
    from omnistage.stages.base import StageInputContext
    from tests.dia.test_codec import engine

    eng = engine(async_chunk=True, chunk_frames=8, first_chunk_frames=2)
    stage = StageSpec(1, "codec", "generation", inputs=(0,), final_output=True, output_modality="audio")
    for text in PROMPTS[:3]:
        out = reference_codes(text)
        delayed = out[1:]
        ctx = StageInputContext("r", None, None, {}, stage, resources=eng.input_resources())
        audio, finished = [], False
        for start in range(0, len(delayed), 3):
            last = start + 3 >= len(delayed)
            answer = codec_chunk(ctx, StageOutput("r", codes=delayed[start : start + 3]), last)
            if start == 0:
                eng.add_request(answer)
            elif answer is not None:
                eng.add_chunk("r", answer, last)
            for piece in eng.step():
                audio.append(piece.audio)
                finished |= piece.finished
        while not finished:
            for piece in eng.step():
                audio.append(piece.audio)
                finished |= piece.finished
        want = reference_audio(out)
        got = torch.cat(audio)
        assert got.shape == want.shape
        assert float((got - want).abs().max()) <= 1e-4


def test_a_voice_clip_prompt_equals_reference_waveform() -> None:
    """`ref_audio` + `ref_text`: the clip's codes prefix the decoder and its transcript the script, as the
    reference's processor takes them (`text=ref_text + script, audio=clip`); the new frames' audio is its
    `batch_decode(audio_prompt_len=...)` within 1e-4."""
    import io

    import soundfile

    from omnistage.families.dia.tiny import tiny_dia_dir
    from tests.dia.reference import AUDIO_KWARGS, clip, reference_inputs, reference_model

    ref_text, script = "[S1] Once upon a time.", "[S2] A small model learned to speak."
    audio = clip(0.2, 180.0)
    data = io.BytesIO()
    soundfile.write(data, audio, 44100, format="WAV", subtype="FLOAT")
    greedy = SamplingParams(temperature=0.0, top_k=GUIDED_TOP_K, max_tokens=MAX_NEW)
    prompt = SpeechPrompt(input=script, options={"ref_audio": data.getvalue(), "ref_text": ref_text})
    with Omni(str(tiny_dia_dir()), INLINE) as omni:
        out = omni.generate(prompt, [greedy, None], use_tqdm=False)[0]
    assert out.error is None, out.error
    codes = reference_codes(f"{ref_text} {script}", audio)
    mask = reference_inputs(f"{ref_text} {script}", audio)["decoder_attention_mask"]
    prompt_len = reference_model()[1].get_audio_prompt_len(mask, **AUDIO_KWARGS)
    want = reference_audio(codes, audio_prompt_len=prompt_len)
    assert out.audio.reshape(-1).shape == want.shape and want.shape[0] > 0
    assert float((out.audio.reshape(-1) - want).abs().max()) <= 1e-4
