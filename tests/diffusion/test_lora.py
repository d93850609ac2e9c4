"""LoRA adapters per request on the diffusion engine (tiny FLUX.1, step-wise; PEFT adapters saved by
diffusers' own `save_lora_weights`): a request with an adapter equals diffusers with that adapter loaded
(`load_lora_weights`, `set_adapters` at the same scale) within 1e-4; four requests at once with two adapters
and none each equal their solo result, in step and in request mode; with model offload and with step caching
too; an unknown or corrupt adapter fails only its request, naming `lora`; the adapter cache keeps its bound
and never evicts an adapter a running request holds."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from omnistage.params import LoraRequest
from tests.diffusion.helpers import BASE, drain, final_tensor, make_engine, model_dir, plain_pipeline, request

pytestmark = pytest.mark.engine
FAMILY = "tiny-flux1"
TOLERANCE = 1e-4
PROMPT = "a cat sitting on a bench"


@functools.cache
def adapter(seed: int, root: str) -> str:
    """A rank-4 LoRA on the transformer's attention projections, random (non-zero) weights, saved as users
    have them: diffusers' `save_lora_weights` of a PEFT adapter's state dict."""
    from diffusers import DiffusionPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    pipe = DiffusionPipeline.from_pretrained(model_dir(FAMILY), local_files_only=True)
    transformer = pipe.transformer
    targets = ["to_q", "to_k", "to_v", "to_out.0"]
    transformer.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=targets, init_lora_weights=False))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in transformer.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    path = Path(root) / f"adapter-{seed}"
    type(pipe).save_lora_weights(str(path), transformer_lora_layers=get_peft_model_state_dict(transformer))
    return str(path)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("loras"))
    return {"a": adapter(1, root), "b": adapter(2, root), "c": adapter(3, root)}


def diffusers_with(path: str | None, scale: float, seed: int) -> torch.Tensor:
    """A plain diffusers call with the adapter loaded the documented way (or none)."""
    pipe = plain_pipeline(FAMILY)
    if path is not None:
        pipe.load_lora_weights(path, adapter_name="under_test")
        pipe.set_adapters(["under_test"], adapter_weights=[scale])
    try:
        call = {k: v for k, v in BASE.items() if k != "output_format"}
        result = pipe(PROMPT, generator=torch.Generator().manual_seed(seed), output_type="np", **call)
    finally:
        if path is not None:
            pipe.delete_adapters(["under_test"])
    return torch.as_tensor(result.images)


def run(engine, items, steps: int = 2, metrics: dict | None = None) -> dict[str, torch.Tensor]:
    """Each (request id, adapter, seed) at once; their images (and metrics into `metrics`)."""
    for rid, lora, seed in items:
        params = {**BASE, "num_inference_steps": steps}
        engine.add_request(request(rid, PROMPT, seed=seed, lora=lora, **params))
    outputs = drain(engine)
    if metrics is not None:
        metrics.update({rid: outs[-1].metrics for rid, outs in outputs.items()})
    return {rid: final_tensor(outs[-1]).reshape(1, 32, 32, 3) for rid, outs in outputs.items()}


def test_a_request_with_an_adapter_equals_diffusers_with_it_loaded(adapters) -> None:
    engine = make_engine(FAMILY)
    got = run(engine, [("with", LoraRequest(name="a", path=adapters["a"], scale=0.8), 5)])["with"]
    expected = diffusers_with(adapters["a"], 0.8, 5)
    assert (got - expected).abs().max().item() <= TOLERANCE
    assert (got - diffusers_with(None, 1.0, 5)).abs().max().item() > 1e-3  # the adapter changes the image


MIXED = [("a1", "a", 0.8, 11), ("b1", "b", 1.0, 12), ("none", None, 1.0, 13), ("a2", "a", 0.5, 14)]


TEACACHE = {"cache": {"backend": "teacache", "rel_l1_thresh": 1e9}}  # steps 2 and 3 of 4 from the cache


@pytest.mark.parametrize(
    ("engine_args", "steps"),
    [({}, 2), ({"execution": "request"}, 2), ({"offload": "model"}, 2), (TEACACHE, 4)],
    ids=["step", "request", "model-offload", "teacache"],
)
def test_four_requests_with_two_adapters_and_none_each_equal_their_solo_result(
    adapters, engine_args, steps
) -> None:
    def lora(name, scale):
        return None if name is None else LoraRequest(name=name, path=adapters[name], scale=scale)

    solo = make_engine(FAMILY, **engine_args)
    alone = {rid: run(solo, [(rid, lora(n, s), seed)], steps)[rid] for rid, n, s, seed in MIXED}
    mixed = [(rid, lora(n, s), seed) for rid, n, s, seed in MIXED]
    metrics: dict = {}
    together = run(make_engine(FAMILY, **engine_args), mixed, steps, metrics)
    for rid, *_ in MIXED:
        assert (together[rid] - alone[rid]).abs().max().item() <= TOLERANCE, rid
    if "cache" in engine_args:  # the adapters' steps came from the cache too
        assert all(m["cached_steps"] == 2 for m in metrics.values()), metrics
    if not engine_args:  # and each is diffusers' own
        for rid, name, scale, seed in MIXED:
            expected = diffusers_with(adapters[name] if name else None, scale, seed)
            assert (together[rid] - expected).abs().max().item() <= TOLERANCE, rid


def test_an_unknown_or_corrupt_adapter_fails_only_its_request(adapters, tmp_path) -> None:
    corrupt = tmp_path / "corrupt" / "pytorch_lora_weights.safetensors"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"not a safetensors file at all")
    engine = make_engine(FAMILY)
    bad = {
        "missing": LoraRequest(name="gone", path=str(tmp_path / "nowhere")),
        "corrupt": LoraRequest(name="corrupt", path=str(corrupt.parent)),
    }
    for rid, lora in bad.items():
        engine.add_request(request(rid, PROMPT, seed=1, lora=lora, **BASE))
    engine.add_request(request("fine", PROMPT, seed=1, **BASE))
    outs = drain(engine)
    for rid in bad:
        out = outs[rid][-1]
        assert (out.error_type, out.error_param) == ("InvalidRequestError", "lora"), out.error
    assert outs["fine"][-1].error is None
    assert not engine.runner.loras.loaded and not engine.runner.loras.holders


def test_the_adapter_cache_keeps_its_bound_and_never_evicts_a_held_adapter(adapters) -> None:
    engine = make_engine(FAMILY, max_loras=2)
    cache = engine.runner.loras
    held = [LoraRequest(name=n, path=adapters[n]) for n in ("a", "b")]
    for i, lora in enumerate(held):
        engine.add_request(request(f"held{i}", PROMPT, seed=i, lora=lora, **BASE))
    third = LoraRequest(name="c", path=adapters["c"])
    engine.add_request(request("third", PROMPT, seed=3, lora=third, **BASE))  # both held: refused
    outs = drain(engine)
    assert "in use by running requests" in str(outs["third"][-1].error)
    assert all(outs[f"held{i}"][-1].error is None for i in range(2))
    run(engine, [("c", third, 3)])  # now one of them goes
    assert len(cache.loaded) == 2 and cache.loads == 3 and not cache.holders
    run(engine, [("a again", held[0], 4)])
    assert len(cache.loaded) == 2 and cache.loads == 4  # "a" had been evicted: loaded again
