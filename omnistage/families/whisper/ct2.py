"""Reading a CTranslate2 `model.bin` (format version 6), and turning a CTranslate2 Whisper into a
transformers `WhisperForConditionalGeneration` directory.

CTranslate2 stores each attention's q/k/v (self-attention) or k/v (cross-attention) as one fused linear,
keeps a zero key bias transformers does not have, and ties the output projection to the token embedding;
its directory has no generation config, so `generation_config.json` is built from its `config.json`
(suppress ids, language ids) and the tokenizer's special tokens.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

# CTranslate2's DataType enum.
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_FORMAT_VERSION = 6


def read_model_bin(path: str | Path) -> dict[str, np.ndarray]:
    """Every variable of a CTranslate2 model file, by name (aliases resolved)."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def text() -> str:
        nonlocal pos
        size = take("<H")
        value = data[pos : pos + size - 1].decode()
        pos += size
        return value

    version = take("<I")
    if version != _FORMAT_VERSION:
        raise ValueError(f"{path}: CTranslate2 model format {version}, this reader knows {_FORMAT_VERSION}")
    text()  # the spec's name
    take("<I")  # its revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(take("<I")):
        name = text()
        dims = [take("<I") for _ in range(take("<B"))]
        dtype = np.dtype(_DTYPES[take("<B")])
        size = take("<I")
        variables[name] = np.frombuffer(data, dtype, size // dtype.itemsize, pos).reshape(dims)
        pos += size
    for _ in range(take("<I")):
        alias, target = text(), text()
        variables[alias] = variables[target]
    return variables


def _linear(v: dict, prefix: str) -> tuple[np.ndarray, np.ndarray | None]:
    return v[f"{prefix}/weight"], v.get(f"{prefix}/bias")


def _norm(sd: dict, v: dict, src: str, dst: str) -> None:
    sd[f"{dst}.weight"], sd[f"{dst}.bias"] = v[f"{src}/gamma"], v[f"{src}/beta"]


def _fused(sd: dict, v: dict, src: str, dst: str, names: tuple[str, ...]) -> None:
    """Split a fused projection into transformers' q/k/v (k has no bias: CTranslate2's is zero)."""
    weight, bias = _linear(v, src)
    for name, w, b in zip(names, np.split(weight, len(names)), np.split(bias, len(names)), strict=True):
        sd[f"{dst}.{name}.weight"] = w
        if name != "k_proj":
            sd[f"{dst}.{name}.bias"] = b
        elif np.abs(b).max() != 0:
            raise ValueError(f"{src}: the key bias is not zero; transformers' Whisper has none")


def _plain(sd: dict, v: dict, src: str, dst: str) -> None:
    sd[f"{dst}.weight"], sd[f"{dst}.bias"] = _linear(v, src)


def whisper_state_dict(v: dict[str, np.ndarray], encoder_layers: int, decoder_layers: int) -> dict:
    """transformers names → arrays."""
    sd: dict[str, np.ndarray] = {}
    e, d = "model.encoder", "model.decoder"
    for conv in ("conv1", "conv2"):
        _plain(sd, v, f"encoder/{conv}", f"{e}.{conv}")
    sd[f"{e}.embed_positions.weight"] = v["encoder/position_encodings/encodings"]
    _norm(sd, v, "encoder/layer_norm", f"{e}.layer_norm")
    for i in range(encoder_layers):
        src, dst = f"encoder/layer_{i}", f"{e}.layers.{i}"
        _fused(sd, v, f"{src}/self_attention/linear_0", f"{dst}.self_attn", ("q_proj", "k_proj", "v_proj"))
        _plain(sd, v, f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
        _norm(sd, v, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
        _plain(sd, v, f"{src}/ffn/linear_0", f"{dst}.fc1")
        _plain(sd, v, f"{src}/ffn/linear_1", f"{dst}.fc2")
        _norm(sd, v, f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
    sd[f"{d}.embed_tokens.weight"] = v["decoder/embeddings/weight"]
    sd[f"{d}.embed_positions.weight"] = v["decoder/position_encodings/encodings"]
    _norm(sd, v, "decoder/layer_norm", f"{d}.layer_norm")
    for i in range(decoder_layers):
        src, dst = f"decoder/layer_{i}", f"{d}.layers.{i}"
        _fused(sd, v, f"{src}/self_attention/linear_0", f"{dst}.self_attn", ("q_proj", "k_proj", "v_proj"))
        _plain(sd, v, f"{src}/self_attention/linear_1", f"{dst}.self_attn.out_proj")
        _norm(sd, v, f"{src}/self_attention/layer_norm", f"{dst}.self_attn_layer_norm")
        _plain(sd, v, f"{src}/attention/linear_0", f"{dst}.encoder_attn.q_proj")
        _fused(sd, v, f"{src}/attention/linear_1", f"{dst}.encoder_attn", ("k_proj", "v_proj"))
        _plain(sd, v, f"{src}/attention/linear_2", f"{dst}.encoder_attn.out_proj")
        _norm(sd, v, f"{src}/attention/layer_norm", f"{dst}.encoder_attn_layer_norm")
        _plain(sd, v, f"{src}/ffn/linear_0", f"{dst}.fc1")
        _plain(sd, v, f"{src}/ffn/linear_1", f"{dst}.fc2")
        _norm(sd, v, f"{src}/ffn/layer_norm", f"{dst}.final_layer_norm")
    return sd


def _count_layers(v: dict, side: str) -> int:
    return len({k.split("/")[1] for k in v if re.match(rf"{side}/layer_\d+/", k)})


def convert_ct2_whisper(src: str | Path, dst: str | Path) -> Path:
    """Write `dst` as a transformers Whisper directory (float16 weights as stored, tokenizer, feature
    extractor, generation config) from the CTranslate2 Whisper directory `src`."""
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizerFast,
    )

    src, dst = Path(src), Path(dst)
    v = read_model_bin(src / "model.bin")
    ct2 = json.loads((src / "config.json").read_text())
    vocab, d_model = v["decoder/embeddings/weight"].shape
    enc_layers, dec_layers = _count_layers(v, "encoder"), _count_layers(v, "decoder")
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(src / "tokenizer.json"))
    ids = tokenizer.convert_tokens_to_ids
    eot, sot = ids("<|endoftext|>"), ids("<|startoftranscript|>")
    multilingual = vocab >= 51865
    config = WhisperConfig(
        vocab_size=int(vocab),
        num_mel_bins=int(v["encoder/conv1/weight"].shape[1]),
        d_model=int(d_model),
        encoder_layers=enc_layers,
        decoder_layers=dec_layers,
        encoder_attention_heads=int(v["encoder/num_heads"]),
        decoder_attention_heads=int(v["decoder/num_heads"]),
        encoder_ffn_dim=int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        decoder_ffn_dim=int(v["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        max_source_positions=int(v["encoder/position_encodings/encodings"].shape[0]),
        max_target_positions=int(v["decoder/position_encodings/encodings"].shape[0]),
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=sot,
        suppress_tokens=list(ct2["suppress_ids"]),
        begin_suppress_tokens=list(ct2["suppress_ids_begin"]),
        tie_word_embeddings=True,
        dtype="float16",
    )
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    state = {
        k: torch.from_numpy(np.array(a)) for k, a in whisper_state_dict(v, enc_layers, dec_layers).items()
    }
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"{src}: no CTranslate2 variable for {missing[:3]}")
    model.save_pretrained(dst)
    gen = generation_config(tokenizer, ct2, multilingual)
    GenerationConfig(**gen).save_pretrained(dst)
    tokenizer.save_pretrained(dst)
    WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(dst)
    shutil.copy(src / "config.json", dst / "ct2_config.json")
    return dst


def generation_config(tokenizer: Any, ct2: dict, multilingual: bool) -> dict[str, Any]:
    """What transformers' Whisper checkpoints carry in generation_config.json."""
    ids = tokenizer.convert_tokens_to_ids
    eot, sot = ids("<|endoftext|>"), ids("<|startoftranscript|>")
    gen: dict[str, Any] = {
        "bos_token_id": eot,
        "decoder_start_token_id": sot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "max_length": 448,
        "suppress_tokens": list(ct2["suppress_ids"]),
        "begin_suppress_tokens": list(ct2["suppress_ids_begin"]),
        "no_timestamps_token_id": ids("<|notimestamps|>"),
        "prev_sot_token_id": ids("<|startofprev|>"),
        "max_initial_timestamp_index": 50,
        "is_multilingual": multilingual,
        "return_timestamps": False,
        "alignment_heads": [list(h) for h in ct2.get("alignment_heads", [])],
    }
    if multilingual:
        lang_ids = ct2.get("lang_ids") or []
        gen["lang_to_id"] = {tokenizer.convert_ids_to_tokens(i): i for i in lang_ids}
        gen["task_to_id"] = {"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")}
        gen["forced_decoder_ids"] = [[1, None], [2, ids("<|transcribe|>")]]
    else:
        gen["forced_decoder_ids"] = [[1, gen["no_timestamps_token_id"]]]
    return gen
