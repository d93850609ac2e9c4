"""The csm pipeline end to end (offline API, one process, full handoff): a checkpoint directory resolves to
the family by its architectures, and a request speaks the reference's waveform (its greedy frames decoded
by its Mimi) within 1e-4, with and without earlier turns as context."""

from __future__ import annotations

import pytest

from omnistage import Omni
from omnistage.families.resolve import resolve_pipeline
from omnistage.params import SamplingParams
from omnistage.prompts import SpeechPrompt
from tests.csm.reference import MAX_NEW, PROMPTS, reference_audio, reference_codes, wav

pytestmark = pytest.mark.engine

INLINE = "omnistage/families/csm/csm_inline.yaml"


def test_speech_equals_reference_waveform() -> None:
    from omnistage.families.csm.tiny import tiny_csm_dir

    model_dir = str(tiny_csm_dir())
    pipeline, _ = resolve_pipeline(model_dir)
    assert pipeline.name == "csm"
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    with Omni(model_dir, INLINE) as omni:
        for text, speaker, turns in (PROMPTS[0], PROMPTS[3]):
            context = [{"speaker": s, "text": t, "audio": wav(a)} for s, t, a in turns]
            prompt = SpeechPrompt(input=text, speaker=str(speaker), options={"context": context})
            out = omni.generate(prompt, [greedy, None], use_tqdm=False)[0]
            assert out.error is None, out.error
            want = reference_audio(reference_codes(text, speaker, turns))
            assert out.sample_rate == 24000 and out.audio.reshape(-1).shape == want.shape
            assert float((out.audio.reshape(-1) - want).abs().max()) <= 1e-4
            assert float(want.abs().max()) > 0.0
