"""Base in-context voice cloning: the 12 Hz codec's encoder gives a reference clip the reference's codes,
and the talker prompted with the clip's transcript and codes speaks the reference's greedy codes (all 16
codebooks), each request alone and 8 batched, arriving at different steps, in the reference's default
streaming text input and in non-streaming."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from omnistage.families.qwen3_tts.prompt import talker_prompt
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import run
from tests.qwen3_tts.reference_outputs import reference_icl, tiny_dir
from tests.qwen3_tts.test_clone import clip
from tests.qwen3_tts.test_talker import MAX_NEW, frames, talker, talker_params

pytestmark = pytest.mark.engine

# (text, transcript of the clip, language, non-streaming text input)
CASES = [
    ("Hello there, a test!", "The quick brown fox.", "english", False),
    (
        "Speak slowly.",
        "Hello there, this is a small voice test, spoken quite slowly and clearly.",
        "auto",
        False,
    ),  # noqa: E501
    ("The lazy dog, in a warm voice!", "Speak!", "chinese", True),
    ("A small voice test.", "The quick brown fox jumps over the lazy dog.", "japanese", True),
]


def wrap(tok, text: str, ref_text: str) -> dict:
    """The reference's prompt strings (`_build_assistant_text`, `_build_ref_text`)."""
    return {
        "input_ids": tok(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")["input_ids"],
        "ref_ids": tok(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")["input_ids"],
    }


def test_in_context_clone_equals_reference() -> None:
    model_dir = tiny_dir("base")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    clips = [clip(i + 1, 0.6 + 0.3 * i) for i in range(len(CASES))]
    requests = [
        {**wrap(tok, text, ref), "language": lang, "non_streaming_mode": ns, "max_new_tokens": MAX_NEW}
        for text, ref, lang, ns in CASES
    ]
    expected = reference_icl(model_dir, requests, clips)
    engine = talker("base")
    loaded = engine.input_resources()
    ref_codes = [loaded.codec_encoder.encode(c) for c in clips]
    for mine, ref in zip(ref_codes, expected["ref_codes"], strict=True):
        assert mine.shape == ref.shape and mine.shape[1] == 16 and torch.equal(mine, ref)
    assert len({len(c) for c in ref_codes}) == len(CASES)  # clips of 8 to 19 frames
    xvectors = [loaded.speaker_encoder.embed(c) for c in clips]

    def stage_requests(order: list[int]) -> list[StageRequest]:
        out = []
        for n, i in enumerate(order):
            r = requests[i]
            ids, inputs = talker_prompt(
                loaded, r["input_ids"], None, r["language"], None, r["non_streaming_mode"],
                speaker_embed=xvectors[i], ref_ids=r["ref_ids"], ref_codes=ref_codes[i],
            )  # fmt: skip
            out.append(StageRequest(f"r{n}", prompt=ids, params=talker_params(), inputs=inputs))
        return out

    for i in range(len(requests)):
        results, _ = run(talker("base"), stage_requests([i]))
        assert torch.equal(frames(results["r0"]), expected["codes"][i]), i
    order = [0, 1, 2, 3, 3, 2, 1, 0]
    results, _ = run(engine, stage_requests(order), [0, 0, 1, 3, 4, 6, 9, 11])
    for n, i in enumerate(order):
        assert torch.equal(frames(results[f"r{n}"]), expected["codes"][i]), (n, i)
    assert engine.stats()["peak_running"] > 1
    assert sum(len(c) > 2 for c in expected["codes"]) >= 2
