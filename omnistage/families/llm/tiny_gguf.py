"""A tiny llama GGUF file written locally with `gguf` (llama.cpp's own Python writer), so the GGUF model
source can be tested in seconds: converting the real 98 MB demo file takes tens of seconds.

The file is laid out the way llama.cpp's converter writes one: llama.cpp tensor names, Q/K rows permuted
into llama.cpp's rotary order, 2-D weights quantized to Q4_1 (norms stay float32), and a byte-level BPE
tokenizer (the tiny ChatML one, its special tokens marked as control tokens) with its chat template.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from omnistage.cache import cached_dir
from omnistage.families.llm.tiny import TINY, TINY_VOCAB
from omnistage.families.shared.tokenizer import FAMILIES, build_tokenizer

GGUF_NAME = "Tiny-Llama-Chat.Q4_1.gguf"
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def tiny_gguf_file() -> Path:
    """A 2-layer, 64-wide llama chat model in one Q4_1 GGUF file, built once per machine."""
    return cached_dir("tiny-llama-gguf", "v1", lambda p: write_tiny_gguf(p / GGUF_NAME)) / GGUF_NAME


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary layout for Q/K rows (what its converter does to Hugging Face weights)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_tiny_gguf(path: Path, seed: int = 0) -> None:
    import gguf
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens, token_types, merges, specials = _tiny_chatml_vocab()
    config = LlamaConfig(vocab_size=TINY_VOCAB, tie_word_embeddings=True, rms_norm_eps=1e-6, **TINY)
    torch.manual_seed(seed)
    weights = {k: v.numpy() for k, v in LlamaForCausalLM(config).state_dict().items()}

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("Tiny Llama Chat")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(TINY_VOCAB)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(specials["<|im_start|>"])
    writer.add_eos_token_id(specials["<|im_end|>"])
    writer.add_pad_token_id(specials["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(FAMILIES["qwen"][1])

    def add(name: str, weight: np.ndarray) -> None:
        if weight.ndim == 1:
            writer.add_tensor(name, weight.astype(np.float32))
            return
        qtype = gguf.GGMLQuantizationType.Q4_1
        writer.add_tensor(name, gguf.quants.quantize(weight.astype(np.float32), qtype), raw_dtype=qtype)

    add("token_embd.weight", weights["model.embed_tokens.weight"])
    add("output_norm.weight", weights["model.norm.weight"])
    for i in range(config.num_hidden_layers):
        for gguf_name, hf_name in LAYER_TENSORS.items():
            weight = weights[f"model.layers.{i}.{hf_name}.weight"]
            if gguf_name == "attn_q":
                weight = llama_cpp_permute(weight, config.num_attention_heads)
            elif gguf_name == "attn_k":
                weight = llama_cpp_permute(weight, config.num_key_value_heads)
            add(f"blk.{i}.{gguf_name}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _tiny_chatml_vocab() -> tuple[list[str], list[int], list[str], dict[str, int]]:
    """The tiny ChatML tokenizer as GGUF metadata: tokens by id, their types, merges, special ids."""
    import gguf

    with tempfile.TemporaryDirectory() as tmp:
        specials = build_tokenizer(Path(tmp), "qwen", TINY_VOCAB)
        spec = json.loads((Path(tmp) / "tokenizer.json").read_text())
    vocab = dict(spec["model"]["vocab"])
    added = {t["content"]: t for t in spec["added_tokens"]}
    vocab.update({content: t["id"] for content, t in added.items()})
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    assert len(tokens) == TINY_VOCAB and all(vocab[t] == i for i, t in enumerate(tokens))
    types = []
    for token in tokens:
        if token in added:
            special = added[token]["special"]
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, [int(t) for t in types], merges, specials
