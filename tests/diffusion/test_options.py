"""Memory and kernel options go through the libraries that own them and keep the output (or report its
quality where the option is lossy)."""

from __future__ import annotations

import pytest

from omnistage import media
from omnistage.errors import ConfigError
from tests.diffusion.helpers import BASE, drain, final_tensor, make_engine, reference, request

pytestmark = pytest.mark.engine
NAME = "tiny-flux1"


@pytest.fixture(scope="module")
def expected():
    return reference(NAME, "a cat", seed=7)


def generate(**engine_args):
    eng = make_engine(NAME, execution="step", **engine_args)
    eng.add_request(request("r", "a cat", **BASE, seed=7))
    return final_tensor(drain(eng)["r"][-1]), eng


@pytest.mark.parametrize(
    "engine_args",
    [
        {"offload": "group"},
        {"offload": "model"},
        {"attention_backend": "_native_math"},
        {"vae_slicing": True},
    ],
    ids=["group-offload", "model-offload", "native-math-attention", "vae-slicing"],
)
def test_lossless_options_keep_the_output(expected, engine_args):
    out, _ = generate(**engine_args)
    assert (out - expected).abs().max() <= 1e-4


def test_vae_tiling_is_enabled_on_the_vae(expected):
    out, eng = generate(vae_tiling=True)
    assert eng.runner.pipe.vae.use_tiling
    assert (out - expected).abs().max() <= 1e-4  # the image is smaller than one tile: tiling is a no-op


def test_int8_weight_only_quantization_is_close(expected):
    out, eng = generate(quantization="int8_weight_only")
    weight = eng.runner.pipe.transformer.proj_out.weight
    assert "Int8" in type(weight).__name__ or "Affine" in type(weight).__name__
    assert media.psnr(out, expected) > 25  # lossy: quality reported, not equality


@pytest.mark.parametrize(
    ("engine_args", "key"),
    [
        ({"attention_backend": "warp_drive"}, "attention_backend"),
        ({"quantization": "int3"}, "quantization"),
        ({"offload": "disk"}, "offload"),
        ({"vae_tiling": {"tile_size_in_furlongs": 3}}, "vae_tiling"),
        ({"cfg_parallel_size": 3}, "cfg_parallel_size"),
        ({"execution": "turbo"}, "execution"),
        ({"no_such_knob": 1}, "no_such_knob"),
        ({"cfg_parallel_size": 2, "execution": "request"}, "execution: step"),
    ],
)
def test_bad_engine_args_fail_at_start_naming_the_key(engine_args, key):
    with pytest.raises(ConfigError, match=key):
        make_engine(NAME, **engine_args)


def test_ulysses_needs_a_context_parallel_plan():
    """SD3's transformer has no `_cp_plan` in diffusers: refused before any process starts."""
    with pytest.raises(ConfigError, match="_cp_plan"):
        make_engine("tiny-sd3", execution="step", ulysses_degree=2)
