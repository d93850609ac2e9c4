"""GGUF files as a model source, on a tiny llama GGUF written with llama.cpp's own `gguf` writer (seconds,
where the real demo file takes tens of seconds to convert)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from omnistage.errors import ConfigError
from omnistage.families.llm.gguf import find_gguf, served_name
from omnistage.families.llm.tiny import TINY_VOCAB
from omnistage.families.llm.tiny_gguf import LAYER_TENSORS, tiny_gguf_file
from omnistage.families.resolve import resolve_pipeline
from omnistage.families.shared.tokenizer import build_tokenizer

REPO = Path(__file__).resolve().parents[2]
CONVERT = (
    "import sys; from pathlib import Path; from omnistage.families.llm.gguf import converted_dir; "
    "print(converted_dir(Path(sys.argv[1])))"
)


@pytest.fixture(scope="module")
def tiny_gguf() -> Path:
    return tiny_gguf_file()


@pytest.fixture(scope="module")
def first_loads(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """Two processes resolve the same GGUF at once in an empty cache: (cache root, their outputs)."""
    cache = tmp_path_factory.mktemp("cache")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMNISTAGE_CACHE": str(cache)}
    command = [sys.executable, "-c", "import logging; logging.basicConfig(level=logging.INFO); " + CONVERT]
    procs = [
        subprocess.Popen(
            [*command, str(tiny_gguf)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    return cache, [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outputs, strict=True)]


@pytest.fixture
def converted_cache(first_loads, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cache the first loads filled, as this process's cache."""
    monkeypatch.setenv("OMNISTAGE_CACHE", str(first_loads[0]))
    return first_loads[0]


@pytest.mark.unit
@pytest.mark.parametrize(
    "file, name",
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct"),
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "llama-3.2-1b-instruct"),
        ("qwen2.5-0.5b-instruct-f16.gguf", "qwen2.5-0.5b-instruct"),
        ("model.gguf", "model"),
    ],
)
def test_served_name_drops_the_quantization_tag(file: str, name: str) -> None:
    assert served_name(Path(file)) == name


@pytest.mark.unit
def test_find_gguf(tmp_path: Path) -> None:
    (tmp_path / "a.Q4_0.gguf").write_bytes(b"")
    assert find_gguf(tmp_path) == tmp_path / "a.Q4_0.gguf"
    assert find_gguf(tmp_path / "a.Q4_0.gguf") == tmp_path / "a.Q4_0.gguf"
    (tmp_path / "notes.txt").write_text("x")
    assert find_gguf(tmp_path / "notes.txt") is None
    (tmp_path / "b.Q8_0.gguf").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"2 GGUF files \(a.Q4_0.gguf, b.Q8_0.gguf\)"):
        find_gguf(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert find_gguf(tmp_path) is None  # a standard checkpoint that happens to hold GGUF files


@pytest.mark.unit
def test_unloadable_gguf_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNISTAGE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(ConfigError, match="cannot load the GGUF file .*broken.gguf"):
        resolve_pipeline(tmp_path / "broken.gguf")


@pytest.mark.engine
def test_concurrent_first_loads_convert_once(first_loads) -> None:
    """One process converts, the other waits for it and reuses the result."""
    cache, results = first_loads
    assert [code for code, _, _ in results] == [0, 0], results
    dirs = {out.strip() for _, out, _ in results}
    assert len(dirs) == 1
    assert sum("to a safetensors directory" in err for _, _, err in results) == 1
    converted = Path(dirs.pop())
    assert converted.name == "tiny-llama-chat"
    assert [p.name for p in (cache / "models").iterdir() if not p.name.startswith(".")] == [
        converted.parent.name
    ]


@pytest.mark.engine
def test_converted_weights_are_the_files_dequantized_tensors(tiny_gguf: Path, converted_cache: Path) -> None:
    """The converted checkpoint holds exactly what llama.cpp's reader dequantizes, in transformers' layout,
    and a directory holding the GGUF resolves to the LLM pipeline over it."""
    import gguf

    spec, info = resolve_pipeline(tiny_gguf.parent)
    assert spec.name == "llm" and info.path.name == "tiny-llama-chat"
    assert info.architectures == ["LlamaForCausalLM"]
    converted = load_file(str(info.path / "model.safetensors"))
    heads, kv_heads = info.config["num_attention_heads"], info.config["num_key_value_heads"]

    reader = gguf.GGUFReader(str(tiny_gguf))
    checked = 0
    for tensor in reader.tensors:
        weight = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        hf_name = _hf_name(tensor.name)
        if tensor.name.endswith("attn_q.weight"):
            weight = _llama_cpp_unpermute(weight, heads)
        elif tensor.name.endswith("attn_k.weight"):
            weight = _llama_cpp_unpermute(weight, kv_heads)
        torch.testing.assert_close(
            converted[hf_name], torch.from_numpy(weight), rtol=0, atol=1e-6, msg=hf_name
        )
        checked += 1
    assert checked == len(reader.tensors) == 2 + 9 * info.config["num_hidden_layers"]
    assert info.config["tie_word_embeddings"] is True


@pytest.mark.engine
def test_the_files_blocks_are_kept_beside_the_float_weights(tiny_gguf: Path, converted_cache: Path) -> None:
    """Every linear's Q4_1 blocks (the Q/K rows in transformers' order, found by matching, and the tied
    head's, the embedding table's blocks) stand for exactly the converted float weight."""
    from omnistage.stages.ar.cpu.quantized_linear import BLOCKS_FILE, WeightOnly

    _, info = resolve_pipeline(tiny_gguf)
    converted = load_file(str(info.path / "model.safetensors"))
    blocks = load_file(str(info.path / BLOCKS_FILE))
    names = sorted({key.rsplit(".", 1)[0] for key in blocks})
    layers = info.config["num_hidden_layers"]
    assert len(names) == 7 * layers + 1 and "lm_head.weight" in names
    for name in names:
        held = WeightOnly("int4", blocks[f"{name}.q"], blocks[f"{name}.scale"], blocks[f"{name}.offset"])
        floats = converted["model.embed_tokens.weight" if name == "lm_head.weight" else name]
        assert torch.equal(held.dequantized(), floats), name


@pytest.mark.engine
def test_converted_tokenizer_is_the_files_tokenizer(
    tiny_gguf: Path, converted_cache: Path, tmp_path: Path
) -> None:
    """Same ids and chat prompt as the tokenizer the GGUF's vocabulary was taken from."""
    from transformers import AutoTokenizer

    _, info = resolve_pipeline(tiny_gguf)
    converted = AutoTokenizer.from_pretrained(info.path)
    build_tokenizer(tmp_path / "reference", "qwen", TINY_VOCAB)
    reference = AutoTokenizer.from_pretrained(tmp_path / "reference")
    for text in [
        "Hello world! How are you today?",
        "你好，世界 🙂<|im_end|>x",
        "def main():\n    return 0\n",
    ]:
        assert converted(text)["input_ids"] == reference(text)["input_ids"], text
    chat = [{"role": "user", "content": "hi"}]
    assert converted.apply_chat_template(chat, add_generation_prompt=True) == reference.apply_chat_template(
        chat, add_generation_prompt=True
    )
    assert converted.eos_token == "<|im_end|>"


def _hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    _, layer, kind, _ = gguf_name.split(".")
    return f"model.layers.{layer}.{LAYER_TENSORS[kind]}.weight"


def _llama_cpp_unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    return (
        weight.reshape(heads, weight.shape[0] // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )
