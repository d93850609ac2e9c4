"""The talker on the AR engine, its code predictor in the post-sample hook: greedy codes (all 16 codebooks)
equal the reference's `generate` (qwen-tts-hf, in its own venv) token for token, for each task type's
prompts, each request alone and 8 of them batched, arriving at different steps."""

from __future__ import annotations

import msgspec
import pytest
import torch

from omnistage.errors import InvalidRequestError
from omnistage.families.qwen3_tts.prompt import talker_prompt
from omnistage.params import SamplingParams
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run
from tests.qwen3_tts.reference_outputs import reference_codes, tiny_dir

pytestmark = pytest.mark.engine

IM_START, IM_END, ASSISTANT, USER, NL = 151644, 151645, 77091, 872, 198
EOS, CODEBOOK = 2150, 2048
MAX_NEW = 24  # the reference's max_new_tokens: at most 23 frames
TALKER = {
    "model_loader": "omnistage.families.qwen3_tts.talker:load_talker",
    "post_sample_hook": "omnistage.families.qwen3_tts.talker:predict_codes",
}


def assistant(text: list[int]) -> list[int]:
    return [IM_START, ASSISTANT, NL, *text, IM_END, NL, IM_START, ASSISTANT, NL]


def instruct(text: list[int]) -> list[int]:
    return [IM_START, USER, NL, *text, IM_END, NL]


# Each: (text ids, instruction ids or None, language, speaker, non-streaming text input)
PROMPTS = {
    "custom_voice": [
        ([100, 2000, 30000, 555], None, "english", "vivian", True),
        ([9, 80000, 151000, 4, 17, 300], [5000, 6000], "auto", "eric", True),  # dialect speaker, Auto
        ([42, 4242, 424], None, "chinese", "dylan", False),  # dialect overrides Chinese; streaming text
        ([7, 77, 777, 7777, 77777], [123, 456, 789], "japanese", "ono_anna", False),
    ],
    "voice_design": [
        ([100, 2000, 30000, 555], [11, 22, 33], "english", None, True),
        ([5, 50, 500, 5000, 50000, 15], [900, 901], "auto", None, True),
        ([31, 331, 3331], [4000, 4001, 4002, 4003], "german", None, False),
        ([64, 128, 256, 512, 1024], [8], "korean", None, False),
    ],
}


def reference_requests(variant: str) -> list[dict]:
    return [
        {
            "input_ids": assistant(text),
            "instruct_ids": instruct(ins) if ins else None,
            "language": lang,
            "speaker": speaker,
            "non_streaming_mode": non_streaming,
            "max_new_tokens": MAX_NEW,
        }
        for text, ins, lang, speaker, non_streaming in PROMPTS[variant]
    ]


def talker_params() -> SamplingParams:
    """The reference's greedy: repetition penalty 1.05, codes 2048.. suppressed but EOS, at least 2 tokens;
    its max_new_tokens N gives N - 1 frames (the last token's frame is never predicted)."""
    return SamplingParams(
        temperature=0.0,
        max_tokens=MAX_NEW - 1,
        repetition_penalty=1.05,
        min_tokens=2,
        allowed_token_ids=[*range(CODEBOOK), EOS],
    )


def stage_requests(engine, requests: list[dict]) -> list[StageRequest]:
    loaded = engine.input_resources()
    out = []
    for i, r in enumerate(requests):
        ids, inputs = talker_prompt(
            loaded, r["input_ids"], r["instruct_ids"], r["language"], r["speaker"], r["non_streaming_mode"]
        )
        out.append(StageRequest(f"r{i}", prompt=ids, params=talker_params(), inputs=inputs))
    return out


def frames(result) -> torch.Tensor:
    codes = result.codes
    return codes[codes[:, 0] != EOS]


def talker(variant: str):
    return make_engine(model_dir=str(tiny_dir(variant)), engine_args={**TALKER, "block_size": 8})


@pytest.mark.parametrize("variant", ["custom_voice", "voice_design"])
def test_greedy_codes_equal_reference_alone_and_batched(variant: str) -> None:
    requests = reference_requests(variant)
    expected = reference_codes(tiny_dir(variant), requests)
    assert any(len(e) < MAX_NEW - 1 for e in expected) and any(len(e) > 2 for e in expected)  # EOS ends some
    for i, request in enumerate(requests):
        engine = talker(variant)
        results, _ = run(engine, stage_requests(engine, [request]))
        got = frames(results["r0"])
        assert got.shape[1] == 16 and torch.equal(got, expected[i]), (variant, i)
    batch = requests + requests[::-1]  # 8 requests
    engine = talker(variant)
    results, _ = run(engine, stage_requests(engine, batch), [0, 0, 1, 3, 4, 6, 9, 11])
    for i in range(len(batch)):
        j = i if i < len(requests) else len(batch) - 1 - i
        assert torch.equal(frames(results[f"r{i}"]), expected[j]), (variant, i)
    assert engine.stats()["peak_running"] > 1


def test_prompt_rejects_bad_fields_naming_them() -> None:
    engine = talker("custom_voice")
    loaded = engine.input_resources()
    text = assistant([100, 200])
    cases = [
        ({"speaker": "nobody"}, "voice"),
        ({"speaker": "vivian", "language": "klingon"}, "language"),
        ({"speaker": "vivian", "language": "sichuan_dialect"}, "language"),
    ]
    for kwargs, field in cases:
        with pytest.raises(InvalidRequestError) as err:
            talker_prompt(loaded, text, **kwargs)
        assert err.value.param == field
    with pytest.raises(InvalidRequestError) as err:
        talker_prompt(loaded, assistant([]), speaker="vivian")
    assert err.value.param == "input"


def test_seeded_sampling_gives_the_same_codes_alone_and_batched() -> None:
    """Sampled (the reference's defaults: temperature 0.9, top-k 50, for the talker and the code predictor's
    `subtalker_*`) with a seed: a request's 16-codebook frames are the same alone and among 8 requests
    arriving at different steps; other seeds give other frames, and the sampled code predictor other
    codebooks 1..15 than the greedy one."""
    requests = reference_requests("custom_voice")

    def sampled(engine, reqs: list[dict], seeds: list[int], subtalker: bool = True) -> list[StageRequest]:
        out = stage_requests(engine, reqs)
        for req, seed in zip(out, seeds, strict=True):
            req.params = msgspec.structs.replace(req.params, temperature=0.9, top_k=50, seed=seed)
            if subtalker:
                req.inputs.extension.subtalker = {
                    "temperature": 0.9,
                    "top_k": 50,
                    "top_p": 0.95,
                    "seed": seed + 100,
                }
        return out

    engine = talker("custom_voice")
    alone, _ = run(engine, sampled(engine, requests[:1], [7]))
    batch = requests + requests[::-1]
    engine = talker("custom_voice")
    seeds = [7, 1, 2, 3, 4, 5, 6, 8]
    mixed, _ = run(engine, sampled(engine, [requests[0]] + batch[1:], seeds), [3, 0, 0, 1, 4, 6, 9, 11])
    assert torch.equal(mixed["r0"].codes, alone["r0"].codes)
    engine = talker("custom_voice")
    greedy, _ = run(engine, stage_requests(engine, requests[:1]))
    others = [mixed[f"r{i}"].codes for i in range(1, 8) if batch[i] is requests[0]]
    assert others and all(not torch.equal(o, alone["r0"].codes) for o in others)
    assert not torch.equal(greedy["r0"].codes, alone["r0"].codes)
    engine = talker("custom_voice")
    plain, _ = run(engine, sampled(engine, requests[:1], [7], subtalker=False))
    same = min(len(plain["r0"].codes), len(alone["r0"].codes))
    assert same >= 2 and torch.equal(plain["r0"].codes[:1, 0], alone["r0"].codes[:1, 0])  # codebook 0 alike
    assert not torch.equal(plain["r0"].codes[:same, 1:], alone["r0"].codes[:same, 1:])
