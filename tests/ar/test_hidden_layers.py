"""Hidden states of chosen layers out: each equals transformers' `output_hidden_states=True` entry of the same
index, row for row over chunked prefill and decode, on every decoder path the engine takes."""

from __future__ import annotations

import pytest
import torch

from omnistage.params import SamplingParams
from omnistage.stages.ar.cpu import native
from omnistage.stages.ar.cpu.lean_decoder import LeanDecoder
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import hf_model, make_engine, run
from tests.ar.test_greedy import workload

pytestmark = pytest.mark.engine

MAX_NEW = 8
LAYERS = [0, 1, -1]  # the embeddings, layer 0's output (an intermediate one), the last layer after the norm


def reference(arch: str, token_ids: list[int]) -> tuple[torch.Tensor, ...]:
    with torch.inference_mode():
        return hf_model(arch).model(torch.tensor([token_ids]), output_hidden_states=True).hidden_states


@pytest.mark.parametrize(
    ("arch", "path"),
    [
        ("qwen2", "lean_native"),
        ("qwen2", "lean_torch"),
        ("qwen2", "model"),
        ("qwen3", "model"),
        ("llama", "lean_torch"),
    ],
)
def test_layer_hidden_states_equal_transformers(arch: str, path: str) -> None:
    """Prompts of 3-70 tokens prefilled in chunks of at most 16 tokens beside decoding sequences, a shared
    prefix in the prefix cache (which these requests must not take: every position's rows are needed)."""
    prompts, arrivals = workload(seed=2)
    prompts, arrivals = prompts[:8], arrivals[:8]
    engine = make_engine(arch, engine_args={"block_size": 8}, max_num_batched_tokens=16, max_num_seqs=8)
    decoder = engine.runner.decoder
    if path == "model":
        engine.runner.decoder = engine.model.decoder
    elif not isinstance(decoder, LeanDecoder):
        pytest.fail(f"{arch} should run on the lean decoder")
    elif path == "lean_torch":
        decoder.native_ops = None
    elif decoder.native_ops is None:
        assert native.kernels() is None  # only where the kernels cannot be built
        pytest.skip("the native kernels are not built on this CPU")
    warm = StageRequest("warm", prompt=prompts[1][:40], params=SamplingParams(temperature=0.0, max_tokens=2))
    run(engine, [warm])  # the shared prefix is now in the cache
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, hidden_state_layers=LAYERS)
    reqs = [StageRequest(f"r{i}", prompt=p, params=params) for i, p in enumerate(prompts)]
    results, _ = run(engine, reqs, arrivals)
    for i, p in enumerate(prompts):
        got = results[f"r{i}"]
        assert got.num_cached_tokens == 0
        fed = p + got.token_ids[:-1]  # every position computed: the last token is never fed back
        want = reference(arch, fed)
        assert sorted(got.hidden_chunks) == sorted(LAYERS)
        for layer in LAYERS:
            rows = got.hidden(layer)
            assert rows.shape == (len(fed), want[layer].shape[-1]), (i, layer)
            torch.testing.assert_close(rows, want[layer][0], atol=1e-5, rtol=1e-5)
    assert engine.stats()["peak_running"] > 1


def test_return_hidden_states_is_the_last_layer_and_the_fields_combine() -> None:
    """`return_hidden_states` keeps meaning layer -1; with `hidden_state_layers` both come out, and an index
    past the model's layers is refused naming the field."""
    engine = make_engine("qwen2")
    prompt = list(range(5, 25))
    params = SamplingParams(
        temperature=0.0, max_tokens=4, return_hidden_states=True, hidden_state_layers=[2, 1]
    )
    results, _ = run(engine, [StageRequest("a", prompt=prompt, params=params)])
    got = results["a"]
    want = reference("qwen2", prompt + got.token_ids[:-1])
    assert sorted(got.hidden_chunks) == [-1, 1, 2]
    torch.testing.assert_close(got.hidden(-1), got.hidden(2), atol=0, rtol=0)
    for layer in (-1, 1):
        torch.testing.assert_close(got.hidden(layer), want[layer][0], atol=1e-5, rtol=1e-5)
    bad = SamplingParams(max_tokens=2, hidden_state_layers=[3])
    _, deltas = run(engine, [StageRequest("b", prompt=prompt, params=bad)])
    (end,) = deltas["b"]
    assert end.finish_reason == "error" and end.error_param == "hidden_state_layers"
    assert "[-3, 2]" in end.error
