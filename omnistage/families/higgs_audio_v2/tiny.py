"""Higgs Audio v2 checkpoints with random weights, built with transformers' own classes
(`HiggsAudioV2ForConditionalGeneration`, its `HiggsAudioV2TokenizerModel` codec and `HiggsAudioV2Processor`)
and saved with `save_pretrained`, so serving and the reference load them through the real loading code. The
tokenizer is a local Llama 3 BPE with Higgs's audio tokens at their real ids; the chat template renders as the
released one's (system, optional scene, turns; an assistant turn is its audio; the generation prompt ends in
`<|audio_out_bos|>`).

`tiny_higgs_dir()`: tests (4 codebooks of 64 codes, a 2-layer DualFFN decoder, a small codec whose acoustic
and semantic frames agree: hop 960 at 24 kHz, HuBERT's 320 at 16 kHz taken every 2nd).
`bench_higgs_dir(dtype)`: the released widths (3072-wide decoder, 8 codebooks of 1024 codes, the released
codec's shape) with 4 of 28 decoder layers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omnistage.cache import cache_root, cached_dir

# Higgs's tokens at the ids its config names (audio_bos_token_id, audio_delay_token_id, audio_token_id) and
# the Llama 3 chat tokens its template uses. The scene markers' ids are the next free reserved ids (unchecked
# against the released tokenizer: nothing reads them by id).
SPECIALS = {
    "<|start_header_id|>": 128006,
    "<|end_header_id|>": 128007,
    "<|eot_id|>": 128009,
    "<|audio_bos|>": 128011,
    "<|audio_eos|>": 128012,
    "<|audio_out_bos|>": 128013,
    "<|reserved_special_token_6|>": 128014,  # the delay token
    "<|AUDIO|>": 128015,
    "<|AUDIO_OUT|>": 128016,
    "<|scene_desc_start|>": 128017,
    "<|scene_desc_end|>": 128018,
}
# As the released processor's (transformers' processor test carries it): a system turn is required.
CHAT_TEMPLATE = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0]['content'] is string %}
        {%- set system_message = messages[0]['content']|trim %}
    {%- elif messages[0]['content'] is iterable and messages[0]['content'][0]['type'] == 'text' %}
        {%- set system_message = messages[0]['content'][0]['text']|trim %}
    {%- else %}
        {{- raise_exception("System message content must be a string or contain text type!") }}
    {%- endif %}
    {%- set messages = messages[1:] %}
{%- else %}
    {{- raise_exception("A system message is required but not provided!") }}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- system_message }}
{%- if messages and messages[0]['role'] == 'scene' %}
    {{- "\\n\\n<|scene_desc_start|>\\n" }}
    {%- if messages[0]['content'] is string %}
        {{- messages[0]['content'] | trim }}
    {%- elif messages[0]['content'] is iterable %}
        {%- for content_item in messages[0]['content'] %}
            {%- if content_item['type'] == 'text' %}
                {{- content_item['text'] | trim }}
                {%- if loop.first and not loop.last %}{{- "\\n\\n" }}{%- endif %}
            {%- elif content_item['type'] == 'audio' %}
                {{- ' <|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>' }}
                {%- if not loop.last %}{{- "\\n" }}{%- endif %}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
    {{- "\\n<|scene_desc_end|>" }}
    {%- set messages = messages[1:] %}
{%- endif %}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {%- if message['role'] == 'assistant' %}
        {%- if message['content'] is not iterable or message['content'][0]['type'] != 'audio' %}
            {{- raise_exception("Assistant messages must contain audio content only!") }}
        {%- endif %}
        {{- '<|audio_out_bos|><|AUDIO_OUT|><|audio_eos|>' }}
    {%- else %}
        {%- if message['content'] is string %}
            {{- message['content'] | trim }}
        {%- elif message['content'] is iterable %}
            {%- for content_item in message['content'] %}
                {%- if content_item['type'] == 'text' %}
                    {{- content_item['text'] | trim }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
    {%- endif %}
    {{- '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n<|audio_out_bos|>' }}
{%- endif %}
"""

# hop 8*5*4*2*3 = 960 at 24 kHz: 25 frames a second, as HuBERT's 320 at 16 kHz taken every 2nd; 0.75 kbps
# of 6-bit codes at 25 Hz = 5 codebooks (a bandwidth whose float division gives the same count both ways).
TINY_CODEC = dict(
    codebook_size=64,
    codebook_dim=16,
    target_bandwidths=[0.75],
    acoustic_model_config=dict(
        model_type="dac",
        encoder_hidden_size=4,
        downsampling_ratios=[8, 5, 4, 2, 3],
        decoder_hidden_size=64,
        upsampling_ratios=[8, 5, 4, 2, 3],
        hidden_size=16,
        n_codebooks=2,
        codebook_size=16,
        codebook_dim=4,
    ),
    semantic_model_config=dict(
        model_type="hubert",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=[16] * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=16,
        mask_time_prob=0.0,
    ),
)
TINY = dict(
    vocab_size=128256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    initializer_range=0.1,  # spread-out logits: greedy near-ties between implementations vanishingly rare
    num_codebooks=5,
    codebook_size=66,  # the codec's 64 codes, then the stream BOS (64) and EOS (65)
    audio_stream_bos_id=64,
    audio_stream_eos_id=65,
)
TINY_EOS_SCALE = 1.2
# The released widths: a 3072-wide Llama 3.2-3B-like decoder (4 of its 28 layers), 8 codebooks of 1024 codes
# (+ stream BOS/EOS), the released codec's shape (2 kbps: 8 codebooks at 25 Hz).
BENCH = dict(num_hidden_layers=4, codebook_size=1026, audio_stream_bos_id=1024, audio_stream_eos_id=1025)
BENCH_CODEC = dict(
    target_bandwidths=[0.5, 1, 1.5, 2],
    acoustic_model_config=dict(
        model_type="dac", downsampling_ratios=[8, 5, 4, 2, 3], upsampling_ratios=[8, 5, 4, 2, 3]
    ),
)
# The released generation defaults (sampling; ras_* off here: they resample with the global RNG).
GENERATION = {"do_sample": True, "temperature": 1.0, "top_k": 50, "top_p": 0.95}


def build(
    path: Path,
    final: Path,
    model: dict[str, Any],
    codec: dict[str, Any],
    dtype: str = "float32",
    seed: int = 0,
    eos_scale: float = 1.0,
) -> None:
    """Write a random-weight Higgs checkpoint, its codec (`audio_tokenizer/`), its processor and the released
    generation defaults into `path`; `final` is where the directory will live (the processor names its codec
    by path)."""
    import torch
    from transformers import (
        DacFeatureExtractor,
        HiggsAudioV2Config,
        HiggsAudioV2ForConditionalGeneration,
        HiggsAudioV2Processor,
        HiggsAudioV2TokenizerConfig,
        HiggsAudioV2TokenizerModel,
    )

    from omnistage.families.shared.tokenizer_builders import llama3_tokenizer

    torch.manual_seed(seed)
    codec_model = HiggsAudioV2TokenizerModel(HiggsAudioV2TokenizerConfig(**codec)).eval()
    _audible_codec(codec_model)
    codec_model.to(getattr(torch, dtype)).save_pretrained(str(path / "audio_tokenizer"))
    num_codebooks = codec_model.config.num_quantizers
    torch.manual_seed(seed + 1)  # the decoder's weights do not depend on how many draws the codec took
    config = HiggsAudioV2Config(**{**model, "num_codebooks": num_codebooks})
    lm = HiggsAudioV2ForConditionalGeneration(config).eval()
    lm.generation_config.update(**GENERATION)
    _reachable_eos(lm, eos_scale)
    lm.to(getattr(torch, dtype)).save_pretrained(str(path))
    tokenizer = llama3_tokenizer(SPECIALS, pad_token="<|end_of_text|>")  # the config's pad_token_id 128001
    extractor = DacFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0, hop_length=960)
    processor = HiggsAudioV2Processor(
        extractor,
        tokenizer,
        codec_model,
        chat_template=CHAT_TEMPLATE,
        audio_stream_bos_id=config.audio_stream_bos_id,
        audio_stream_eos_id=config.audio_stream_eos_id,
    )
    processor.save_pretrained(str(path))
    _point_at_codec(path, final / "audio_tokenizer")
    (path / "omnistage.json").write_text(json.dumps({"family": "higgs_audio_v2", "dtype": dtype}))


def _reachable_eos(lm: Any, scale: float) -> None:
    """Random heads rarely pick the stream EOS (1 code in 66 per codebook), so greedy audio would never end:
    its rows scaled up, greedy requests end at different lengths and the stop path is exercised."""
    import torch

    config = lm.config
    rows = torch.arange(config.num_codebooks) * config.codebook_size + config.audio_stream_eos_id
    with torch.no_grad():
        lm.audio_lm_head.weight[rows] *= scale


def _point_at_codec(path: Path, codec_dir: Path) -> None:
    """The saved processor names its codec by the path it was built from (the build's temporary directory):
    name where it will live instead."""
    for name in ("processor_config.json",):
        file = path / name
        if not file.exists():
            continue
        data = json.loads(file.read_text())
        if "audio_tokenizer" in data:
            data["audio_tokenizer"]["audio_tokenizer_name_or_path"] = str(codec_dir)
            file.write_text(json.dumps(data, indent=2))


def _audible_codec(codec: Any) -> None:
    """A random codec whose waveform tells its codes apart: a fresh codec's codebooks are all zero (its init:
    every code would decode alike) and its decoder's convs and projections are drawn at std 0.02 (codes
    differ by 1e-5 in its waveform). So random codebooks and a decoder that keeps its signal without blowing
    up float32 rounding (convs at half gain, upsamplers at double, projections at unit gain: one-pass float32
    within 2e-6 of float64), its last conv scaled to a waveform mostly within ±1."""
    import math

    import torch
    from torch import nn
    from transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer import (
        HiggsAudioV2TokenizerEuclideanCodebook,
    )

    decoding = [
        *codec.acoustic_decoder.modules(),
        codec.fc2,
        *(q.project_out for q in codec.quantizer.quantizers),
    ]
    with torch.no_grad():
        for module in codec.modules():
            if isinstance(module, HiggsAudioV2TokenizerEuclideanCodebook):
                module.embed.normal_()
                module.embed_avg.copy_(module.embed)
        for module in decoding:
            if isinstance(module, nn.Conv1d):
                module.weight.normal_(0, 0.5 / math.sqrt(module.weight.shape[1] * module.weight.shape[2]))
            elif isinstance(module, nn.ConvTranspose1d):
                module.weight.normal_(0, 2 / math.sqrt(module.weight.shape[0] * module.weight.shape[2]))
            elif isinstance(module, nn.Linear):
                module.weight.normal_(0, 1 / math.sqrt(module.weight.shape[1]))
        last = codec.acoustic_decoder.conv2
        last.weight.mul_(0.1)
        last.bias.mul_(0.1)


def _version(extra: str) -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + extra.encode()).hexdigest()[:12]


def _dir(name: str, version: str, model: dict, codec: dict, dtype: str = "float32", eos: float = 1.0) -> Path:
    final = cache_root() / "models" / f"{name}-{version}"
    return cached_dir(name, version, lambda path: build(path, final, model, codec, dtype, eos_scale=eos))


def tiny_higgs_dir() -> Path:
    return _dir("tiny-higgs-audio-v2", _version("tiny"), TINY, TINY_CODEC, eos=TINY_EOS_SCALE)


def bench_higgs_dir(dtype: str = "float32") -> Path:
    return _dir(f"bench-higgs-audio-v2-{dtype}", _version(dtype), BENCH, BENCH_CODEC, dtype)
