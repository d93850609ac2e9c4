"""Hooks other stages build on (thinker → talker): prompt embeddings, given (multimodal) positions, the
per-step embedding hook, hidden states out, a custom model loader. References are transformers forwards
of the same model with the same embeddings and positions, recomputed in full at every step."""

from __future__ import annotations

import pytest
import torch

from omnistage.cache import cached_dir
from omnistage.params import SamplingParams
from omnistage.stages.base import StageRequest
from tests.ar import ar_helpers
from tests.ar.ar_helpers import hf_greedy, hf_model, make_engine, run, step_rows

pytestmark = pytest.mark.engine

PROMPT = [7, 99, 23, 301, 5, 42, 77, 8, 150]
H = 64


def params(n: int = 10, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)


@torch.inference_mode()
def reference_loop(embed, decoder, head, embeds, positions, delta, n_new, step_rows=None) -> list[int]:
    """Greedy decoding with a full forward per step; `positions` is [R, L], generated token k sits at
    L + k + delta on every row, and gets `step_rows[k]` added to its embedding."""
    embeds, positions = embeds.clone(), positions.clone()
    prompt_len, tokens = positions.shape[1], []
    for k in range(n_new):
        pos = positions[:, None, :] if positions.shape[0] == 3 else positions
        hidden = decoder(inputs_embeds=embeds[None], position_ids=pos).last_hidden_state[0, -1]
        token = int(head(hidden).argmax())
        tokens.append(token)
        row = embed(torch.tensor([token]))[0]
        if step_rows is not None:
            row = row + step_rows[k]
        embeds = torch.cat([embeds, row[None]])
        positions = torch.cat([positions, torch.full((positions.shape[0], 1), prompt_len + k + delta)], dim=1)
    return tokens


def qwen2_parts():
    model = hf_model("qwen2")
    return model.get_input_embeddings(), model.model, model.lm_head


def test_inputs_embeds_replace_the_prompt_lookup() -> None:
    embed, decoder, head = qwen2_parts()
    torch.manual_seed(0)
    with torch.inference_mode():
        embeds = embed(torch.tensor(PROMPT)) + 0.05 * torch.randn(len(PROMPT), H)
    positions = torch.arange(len(PROMPT))[None]
    expected = reference_loop(embed, decoder, head, embeds, positions, 0, 10)
    same_as_ids = embed(torch.tensor(PROMPT)).detach()
    results, _ = run(
        make_engine(),
        [
            StageRequest("embeds", {"prompt_token_ids": PROMPT}, params(), inputs={"inputs_embeds": embeds}),
            StageRequest("embeds_only", None, params(), inputs={"inputs_embeds": embeds}),
            StageRequest("plain", PROMPT, params(), inputs={"inputs_embeds": same_as_ids}),
        ],
    )
    assert results["embeds"].token_ids == expected
    assert results["embeds_only"].token_ids == expected
    assert results["plain"].token_ids == hf_greedy("qwen2", tuple(PROMPT), 10)
    assert expected != results["plain"].token_ids  # the embeddings really were used


def test_given_positions_and_rope_delta() -> None:
    embed, decoder, head = qwen2_parts()
    positions = torch.tensor([[0, 1, 2, 30, 31, 32, 33, 34, 35]])
    delta = 36 - len(PROMPT)
    with torch.inference_mode():
        embeds = embed(torch.tensor(PROMPT))
    expected = reference_loop(embed, decoder, head, embeds, positions, delta, 10)
    inputs = {"position_ids": positions[0].tolist(), "rope_delta": delta}
    results, _ = run(make_engine(), [StageRequest("pos", PROMPT, params(), inputs=inputs)])
    assert results["pos"].token_ids == expected
    assert expected != hf_greedy("qwen2", tuple(PROMPT), 10)


def test_multimodal_rope_positions_through_a_custom_loader() -> None:
    from transformers import Qwen2VLForConditionalGeneration

    model_dir = cached_dir("tiny-qwen2-vl-ar-test", "v1", ar_helpers.build_tiny_qwen2_vl)
    model = Qwen2VLForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    text = model.model.language_model
    # an "image" of 2x3 patches after two text tokens: rows t/h/w differ there, as get_rope_index makes them
    positions = torch.tensor(
        [
            [0, 1, 2, 2, 2, 2, 2, 2, 5],
            [0, 1, 2, 2, 2, 3, 3, 3, 5],
            [0, 1, 2, 3, 4, 2, 3, 4, 5],
        ]
    )
    delta = 6 - len(PROMPT)
    with torch.inference_mode():
        embeds = text.embed_tokens(torch.tensor(PROMPT))
    expected = reference_loop(text.embed_tokens, text, model.lm_head, embeds, positions, delta, 10)
    engine = make_engine(
        model_dir=model_dir, engine_args={"model_loader": "tests.ar.ar_helpers:load_qwen2_vl_text"}
    )
    inputs = {"position_ids": positions, "rope_delta": delta}
    results, _ = run(engine, [StageRequest("mrope", PROMPT, params(), inputs=inputs)])
    assert results["mrope"].token_ids == expected
    plain = reference_loop(
        text.embed_tokens, text, model.lm_head, embeds, torch.arange(len(PROMPT)).expand(3, -1), 0, 10
    )
    assert plain != expected  # the three rows really mattered


def step_rows_case(num_rows: int) -> tuple[torch.Tensor, list[int]]:
    """Rows a step hook adds to the generated tokens' embeddings, and the 10 greedy tokens they lead to."""
    embed, decoder, head = qwen2_parts()
    torch.manual_seed(1)
    rows = 0.5 * torch.randn(num_rows, H)
    with torch.inference_mode():
        embeds = embed(torch.tensor(PROMPT))
    return rows, reference_loop(embed, decoder, head, embeds, torch.arange(len(PROMPT))[None], 0, 10, rows)


def test_step_embed_hook_adds_a_row_per_generated_token() -> None:
    rows, expected = step_rows_case(12)
    engine = make_engine(engine_args={"step_embed_hook": "tests.ar.ar_helpers:add_step_rows"})
    streaming = StageRequest("stream", PROMPT, params(), inputs=step_rows(rows[:3]), streaming_input=True)

    def feed(step: int, eng) -> None:
        if step == 1:
            eng.add_chunk("stream", step_rows(rows[3:]), last=True)

    results, deltas = run(
        engine,
        [
            StageRequest("hooked", PROMPT, params(), inputs=step_rows(rows)),
            streaming,
            StageRequest("none", PROMPT, params()),
            StageRequest("boom", PROMPT, params(), inputs=step_rows(rows, explode=True)),
        ],
        on_step=feed,
    )
    assert results["hooked"].token_ids == expected
    assert results["stream"].token_ids == expected
    assert results["none"].token_ids == hf_greedy("qwen2", tuple(PROMPT), 10)
    assert results["boom"].finish_reason == "error" and "hook exploded" in deltas["boom"][-1].error


def test_step_ready_hook_holds_a_sequence_until_its_row_arrives() -> None:
    """Rows streamed slower than the engine decodes (a talker fed by a thinker still writing): the sequence
    sits out the steps it has no row for, keeping its slot, while another request runs on; with nothing
    runnable the engine reports no work (the worker then blocks instead of spinning)."""
    rows, expected = step_rows_case(10)
    hooks = {"step_embed_hook": "tests.ar.ar_helpers:add_step_rows"}
    engine = make_engine(engine_args={**hooks, "step_ready_hook": "tests.ar.ar_helpers:step_row_ready"})
    engine.add_request(
        StageRequest("slow", PROMPT, params(), inputs=step_rows(rows[:1]), streaming_input=True)
    )
    engine.add_request(StageRequest("plain", PROMPT, params(4)))
    tokens: dict[str, list[int]] = {"slow": [], "plain": []}
    sent, stalls = 1, 0
    for _ in range(100):
        if not engine.has_work():
            stalls += 1
            assert engine.stats()["num_running"] == 1  # waiting for a row, holding its place
            assert len(tokens["slow"]) == sent + 1  # the prefill's token, then one per row
            last = sent + 2 >= len(rows) - 1  # token k needs row k - 1: 10 tokens, 9 rows
            engine.add_chunk("slow", step_rows(rows[sent : sent + 2]), last=last)
            sent += 2
            if last:
                break
        for out in engine.step():
            assert out.error is None
            tokens[out.request_id] += out.token_ids
    for _ in range(100):
        if not engine.has_work():
            break
        for out in engine.step():
            tokens[out.request_id] += out.token_ids
    assert tokens["slow"] == expected
    assert tokens["plain"] == hf_greedy("qwen2", tuple(PROMPT), 4)
    assert stalls == 4 and engine.stats()["num_requests"] == 0

    # Aborted while it waits for a row: nothing is left running and its blocks come back.
    free = engine.stats()["kv_blocks_free"]
    engine.add_request(
        StageRequest("gone", PROMPT, params(), inputs=step_rows(rows[:1]), streaming_input=True)
    )
    for _ in range(20):
        if not engine.has_work():
            break
        engine.step()
    assert not engine.has_work() and engine.stats()["num_running"] == 1
    engine.abort("gone")
    stats = engine.stats()
    assert not engine.has_work() and (stats["num_requests"], stats["num_running"]) == (0, 0)
    assert stats["kv_blocks_free"] == free


def test_hidden_states_rows_equal_transformers_across_chunks() -> None:
    prompt = list(range(40, 85))  # 45 tokens, prefilled in chunks of at most 16
    engine = make_engine(max_num_batched_tokens=16)
    results, deltas = run(
        engine,
        [
            StageRequest("h", prompt, params(6, return_hidden_states=True)),
            StageRequest("x", PROMPT, params(6)),
        ],
    )
    hidden = results["h"].hidden(-1)
    out = results["h"].token_ids
    assert hidden.shape == (len(prompt) + len(out) - 1, H)
    assert len([d for d in deltas["h"] if -1 in d.hidden_states]) > 3
    assert results["x"].hidden(-1) is None
    with torch.inference_mode():
        expected = hf_model("qwen2").model(torch.tensor([prompt + out[:-1]])).last_hidden_state[0]
    torch.testing.assert_close(hidden, expected, atol=1e-4, rtol=1e-4)
