"""LoRA through the HTTP API (tiny FLUX.1 served in process; the official `openai` client): an adapter
registered at start (`--lora-modules`) or through `POST /v1/load_lora_adapter` is named in a request's
`lora` (vLLM-Omni's flexible keys) and the image equals diffusers with that adapter loaded; an unknown name,
a corrupt file, a path outside the allowed directory or a bad scale is a 400 naming the field; unloading
removes the name."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
from openai import OpenAI
from PIL import Image

from tests.diffusion.helpers import model_dir
from tests.diffusion.test_lora import FAMILY, PROMPT, adapter, diffusers_with
from tests.support.in_process import served

pytestmark = pytest.mark.engine
SIZE = {"size": "32x32"}
FIELDS = {"num_inference_steps": 2, "stage_params": [{"max_sequence_length": 16}]}


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("served-loras"))
    corrupt = tmp_path_factory.mktemp("corrupt") / "pytorch_lora_weights.safetensors"
    corrupt.write_bytes(b"\x00" * 64)
    return {"a": adapter(1, root), "b": adapter(2, root), "corrupt": str(corrupt.parent)}


@pytest.fixture(scope="module")
def client(paths, tmp_path_factory):
    modules = {"a": paths["a"], "corrupt": paths["corrupt"]}
    for app in served(
        model_dir(FAMILY), "flux", tmp_path_factory.mktemp("lora-storage"), lora_modules=modules
    ):
        yield OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=app, max_retries=0), app


def image(client: OpenAI, **extra) -> np.ndarray:
    reply = client.images.generate(
        model="flux", prompt=PROMPT, **SIZE, extra_body={**FIELDS, "seed": 7, **extra}
    )
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(reply.data[0].b64_json))), dtype=np.int16)


def uint8(reference) -> np.ndarray:
    return np.round(reference[0].numpy() * 255).astype(np.int16)


def test_a_named_adapter_equals_diffusers_with_it_loaded(client, paths) -> None:
    openai_client, app = client
    got = image(openai_client, lora={"name": "a", "scale": 0.7})
    assert np.abs(got - uint8(diffusers_with(paths["a"], 0.7, 7))).max() <= 1  # png rounding
    assert np.abs(image(openai_client) - uint8(diffusers_with(None, 1.0, 7))).max() <= 1
    # registered at run time, named with vLLM-Omni's other keys
    added = app.post("/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": paths["b"]})
    assert added.status_code == 200, added.text
    got = image(openai_client, lora={"lora_name": "b", "lora_scale": 1.0, "lora_int_id": 2})
    assert np.abs(got - uint8(diffusers_with(paths["b"], 1.0, 7))).max() <= 1
    assert app.post("/v1/unload_lora_adapter", json={"lora_name": "b"}).status_code == 200
    with pytest.raises(openai.BadRequestError) as refused:
        image(openai_client, lora={"name": "b"})
    assert refused.value.body["param"] == "lora.name"


@pytest.mark.parametrize(
    ("lora", "param"),
    [
        ({"name": "nope"}, "lora.name"),
        ({"name": "corrupt"}, "lora"),
        ({"path": "/etc"}, "lora.path"),
        ({"name": "a", "scale": "high"}, "lora.scale"),
        ({"name": "a", "rank": 4}, "lora.rank"),
        ("a", "lora"),
    ],
)
def test_bad_adapters_are_400_naming_the_field(client, lora, param) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        image(client[0], lora=lora)
    assert refused.value.status_code == 400 and refused.value.body["param"] == param


def test_registering_twice_or_nothing_is_400(client, paths) -> None:
    app = client[1]
    again = app.post("/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": paths["a"]})
    assert again.status_code == 400 and again.json()["error"]["param"] == "lora_name"
    missing = app.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/no/such/dir"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "lora_path"
