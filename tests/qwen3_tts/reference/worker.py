"""Runs inside the reference venv (transformers 5.17 + qwen-tts-hf 0.1.1.post1, see reference_env.sh), never
in omnistage's: builds the tiny checkpoints from the reference's own config and model classes, and computes
the reference's outputs for them. Called by tests/qwen3_tts/reference_outputs.py as
`python worker.py build OUT_DIR VARIANT`, `python worker.py codes MODEL_DIR REQUESTS_JSON OUT_PT` or
`python worker.py decode MODEL_DIR CODES_PT OUT_PT` or
`python worker.py clone|icl MODEL_DIR REQUESTS_JSON AUDIO_PT OUT_PT`; `python worker.py layout OUT_JSON`
writes what tests/qwen3_tts/tiny_checkpoint.py builds the tiny checkpoints from. For benchmarks/qwen3_tts.py:
`python worker.py build_bench OUT_DIR` (the 0.6B model's widths, fewer layers) and
`python worker.py bench MODEL_DIR REQUESTS_JSON OUT_PT` (timed, one request at a time)."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import types
from pathlib import Path

import torch

VARIANTS = {"custom_voice": 1, "voice_design": 2, "base": 3}  # tts_model_type → seed
LANGUAGES = {
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071, "spanish": 2054,
    "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069, "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}  # fmt: skip
SPEAKERS = {
    "serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
    "sohee": 2864, "eric": 2875, "dylan": 2878,
}  # fmt: skip
DIALECTS = {name: False for name in SPEAKERS} | {"eric": "sichuan_dialect", "dylan": "beijing_dialect"}


def import_reference() -> types.ModuleType:
    """`qwen_tts`'s modeling module. The package import always pulls the 25 Hz tokenizer's x-vector code
    (sox, onnxruntime, torchaudio), unused on the 12 Hz path: inert stubs stand in during the import, after
    transformers' own availability checks have run so they do not cache a wrong answer."""
    import importlib.machinery

    import torch._dynamo  # noqa: F401 - its trace rules probe every optional module once
    import transformers.generation.utils  # noqa: F401
    import transformers.utils.import_utils as iu

    for check in ("is_torchaudio_available", "is_onnx_available"):
        getattr(iu, check, lambda: None)()
    stubs = {}
    for name in ("sox", "onnxruntime", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        if name not in sys.modules:
            stubs[name] = sys.modules[name] = types.ModuleType(name)
            stubs[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the package prints a flash-attn banner
            from qwen_tts.core.models import modeling_qwen3_tts as modeling
    finally:
        for name in stubs:
            sys.modules.pop(name, None)
    for cls in (modeling.Qwen3TTSTalkerForConditionalGeneration,
                modeling.Qwen3TTSTalkerCodePredictorModelForConditionalGeneration):  # fmt: skip
        cls._tied_weights_keys = {}  # a v4-style list breaks transformers 5's save_pretrained; none are tied
    _patch_rope_default()
    return modeling


def _patch_rope_default() -> None:
    """The package registers a "default" RoPE init reading `config.rope_theta`, which 5.17's MimiConfig keeps
    only in `rope_parameters`: the same init, reading it from there when the attribute is absent."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    init = ROPE_INIT_FUNCTIONS["default"]
    if getattr(init, "_reads_rope_parameters", False):
        return

    def default(config, *args, **kwargs):  # noqa: ANN001, ANN202
        if "rope_theta" not in config.__dict__:
            config.rope_theta = config.rope_parameters["rope_theta"]
        return init(config, *args, **kwargs)

    default._reads_rope_parameters = True
    ROPE_INIT_FUNCTIONS["default"] = default


def tiny_config(modeling: types.ModuleType, variant: str):  # noqa: ANN201 - the reference's config class
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig

    predictor = dict(
        vocab_size=2048, hidden_size=24, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=12, max_position_embeddings=64, rope_theta=1000000,
        num_code_groups=16,
    )  # fmt: skip
    talker = dict(
        code_predictor_config=predictor, vocab_size=3072, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=4096, rope_theta=1000000, num_code_groups=16, text_hidden_size=32,
        text_vocab_size=151936, codec_eos_token_id=2150, codec_think_id=2154, codec_nothink_id=2155,
        codec_think_bos_id=2156, codec_think_eos_id=2157, codec_pad_id=2148, codec_bos_id=2149,
        codec_language_id=dict(LANGUAGES), spk_id=dict(SPEAKERS) if variant == "custom_voice" else {},
        spk_is_dialect=dict(DIALECTS) if variant == "custom_voice" else {},
        rope_scaling={"interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default",
                      "type": "default"},
    )  # fmt: skip
    speaker = dict(
        mel_dim=128, enc_dim=32, enc_channels=[16, 16, 16, 16, 48], enc_kernel_sizes=[5, 3, 3, 3, 1],
        enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=8, enc_res2net_scale=4, enc_se_channels=8,
        sample_rate=24000,
    )  # fmt: skip
    config = Qwen3TTSConfig(
        talker_config=talker, speaker_encoder_config=speaker, tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size="1b7", tts_model_type=variant,
    )  # fmt: skip
    config.architectures = ["Qwen3TTSForConditionalGeneration"]
    return config


# The released 0.6B widths (Qwen3-TTS-12Hz-0.6B and its 12 Hz tokenizer's decoder) with fewer layers
# (talker 4 of 28, code predictor 2 of 5, codec decoder transformer 2 of 8), for benchmarks/qwen3_tts.py.
BENCH_TALKER = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=4, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, text_hidden_size=2048,
    rope_scaling={"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default",
                  "type": "default"},
)  # fmt: skip
BENCH_PREDICTOR = dict(
    hidden_size=1024, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128,
)  # fmt: skip
BENCH_DECODER = dict(
    hidden_size=512, latent_dim=1024, codebook_dim=512, intermediate_size=1024, num_hidden_layers=2,
    num_attention_heads=16, num_key_value_heads=16, decoder_dim=1536,
)  # fmt: skip


def build_bench(out_dir: str) -> None:
    """A CustomVoice checkpoint at the 0.6B model's widths, the model's own seeded init; the talker head's
    EOS row zeroed so that every request speaks its whole frame budget (equal work on both sides)."""
    modeling = import_reference()
    config = tiny_config(modeling, "custom_voice")
    talker = config.talker_config
    for key, value in BENCH_TALKER.items():
        setattr(talker, key, value)
    talker.rope_parameters = dict(BENCH_TALKER["rope_scaling"], rope_theta=1000000)
    for key, value in BENCH_PREDICTOR.items():
        setattr(talker.code_predictor_config, key, value)
    config.tts_model_size = "0b6"
    torch.manual_seed(0)
    model = modeling.Qwen3TTSForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.talker.codec_head.weight[talker.codec_eos_token_id] = 0.0
    out = Path(out_dir)
    _save_released(model, config, out)
    build_codec(out / "speech_tokenizer", BENCH_DECODER)
    build_tokenizer(out)


def _save_released(model, config, out: Path) -> None:  # noqa: ANN001
    """`save_pretrained`, then config.json and generation_config.json in the released layout."""
    model.save_pretrained(out)
    released = config.to_dict()
    released["speaker_encoder_config"].pop("model_type", None)  # its __init__ takes no **kwargs
    talker = released["talker_config"]
    talker["rope_scaling"] = talker.pop("rope_parameters")  # the released name, which the talker reads
    (out / "config.json").write_text(json.dumps(released, indent=2, sort_keys=True))
    generation = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0,
                  "top_k": 50, "subtalker_dosample": True, "subtalker_temperature": 0.9,
                  "subtalker_top_p": 1.0, "subtalker_top_k": 50, "max_new_tokens": 8192}  # fmt: skip
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))


def build(out_dir: str, variant: str, tokenizer: bool = True) -> None:
    """A seeded random-weight checkpoint in the released layout (config.json, model.safetensors,
    generation_config.json). The talker head's EOS row is scaled up so some texts end on EOS."""
    modeling = import_reference()
    config = tiny_config(modeling, variant)
    torch.manual_seed(VARIANTS[variant])
    model = modeling.Qwen3TTSForConditionalGeneration(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
        model.talker.codec_head.weight[config.talker_config.codec_eos_token_id] *= 3.0
    out = Path(out_dir)
    _save_released(model, config, out)
    build_codec(out / "speech_tokenizer")
    if tokenizer:
        build_tokenizer(out)


SPECIALS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151671: "<|tts_pad|>",
            151672: "<|tts_text_bos|>", 151673: "<|tts_text_eod|>"}  # fmt: skip


def build_tokenizer(out: Path) -> None:
    """A byte-level BPE tokenizer with Qwen2's id layout: a small trained vocabulary padded with unused
    entries to 151643 ids, then the chat and TTS special tokens at their real ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Hello there, this is a small voice test.", "The quick brown fox jumps over the lazy dog.",
              "assistant user system", "Speak slowly and clearly, in a warm voice!"] * 4  # fmt: skip
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(len(vocab), 151643):
        vocab[f"<|unused_{i}|>"] = i
    spec["added_tokens"] = [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, text in SPECIALS.items()
    ]  # fmt: skip
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    fast.save_pretrained(str(out))


def codec_config(decoder_widths: dict | None = None):  # noqa: ANN201 - the reference's tokenizer config class
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config

    decoder = dict(
        codebook_size=2048, codebook_dim=32, hidden_size=32, latent_dim=32, max_position_embeddings=8000,
        rope_theta=10000, num_attention_heads=2, num_key_value_heads=2, sliding_window=72,
        intermediate_size=64, layer_scale_initial_scale=0.01, rms_norm_eps=1e-5, num_hidden_layers=2,
        num_quantizers=16, upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=64,
    )  # fmt: skip
    decoder.update(decoder_widths or {})
    encoder = dict(
        sampling_rate=24000, frame_rate=12.5, audio_channels=1, hidden_size=32, num_filters=4,
        num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4], kernel_size=7, last_kernel_size=3,
        residual_kernel_size=3, dilation_growth_rate=2, compress=2, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16, intermediate_size=64, codebook_size=2048,
        codebook_dim=16, vector_quantization_hidden_dimension=16,  # as released: a projection before the RVQ
        num_quantizers=32, num_semantic_quantizers=1, sliding_window=250, max_position_embeddings=8000,
        upsample_groups=32, rope_theta=10000.0,
    )  # fmt: skip
    config = Qwen3TTSTokenizerV2Config(encoder_config=encoder, decoder_config=decoder)
    config.encoder_config.rope_theta = 10000.0  # read by the package's RoPE patch; 5.17 keeps it elsewhere
    config.architectures = ["Qwen3TTSTokenizerV2Model"]
    return config


def build_codec(out: Path, decoder_widths: dict | None = None) -> None:
    """The 12 Hz codec (Mimi encoder + the Qwen3-TTS decoder) with real upsampling (1920 samples a frame),
    seeded. Random decoder weights at unit gain (its tiny init scales would give a ~1e-9 waveform), the last
    conv scaled so a random frame sequence decodes to std 0.2: well off the +-1 clamp."""
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    torch.manual_seed(0)
    model = Qwen3TTSTokenizerV2Model(codec_config(decoder_widths)).eval()
    with torch.no_grad():
        for name, param in model.decoder.named_parameters():
            if name.endswith(("alpha", "beta")):
                param.normal_(0.0, 0.3)
            elif name.endswith(("gamma", "scale")):
                param.fill_(1.0)
            elif "embedding_sum" in name:
                param.normal_(0.0, 1.0)
            elif param.ndim >= 2 and "cluster_usage" not in name:
                param.normal_(0.0, (param[0].numel()) ** -0.5)
        probe = torch.randint(0, 2048, (1, 16, 24))
        last = model.decoder.decoder[-1].conv
        for _ in range(3):  # the clamp makes one rescale inexact
            last.weight *= 0.2 / float(model.decoder(probe).std())
    model.save_pretrained(out)
    preprocessor = {"feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
                    "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
                    "sampling_rate": 24000}  # fmt: skip
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))


def load(model_dir: str):  # noqa: ANN201
    modeling = import_reference()
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from safetensors.torch import load_file

    config = Qwen3TTSConfig(**json.loads((Path(model_dir) / "config.json").read_text()))
    model = modeling.Qwen3TTSForConditionalGeneration(config).eval()
    state = load_file(str(Path(model_dir) / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"checkpoint mismatch: missing {missing[:4]}, unexpected {unexpected[:4]}")
    return model


def codes(model_dir: str, requests_json: str, out_pt: str) -> None:
    """Greedy talker codes ([T, 16] each) of the reference's `generate`, one request at a time. A request:
    {"input_ids", "instruct_ids"?, "language", "speaker"?, "non_streaming_mode", "max_new_tokens"}."""
    model = load(model_dir)
    results = []
    for req in json.loads(Path(requests_json).read_text()):
        instruct = req.get("instruct_ids")
        with torch.no_grad():
            got, _ = model.generate(
                input_ids=[torch.tensor([req["input_ids"]])],
                instruct_ids=[torch.tensor([instruct]) if instruct else None],
                languages=[req["language"]],
                speakers=[req.get("speaker")],
                non_streaming_mode=req["non_streaming_mode"],
                max_new_tokens=req["max_new_tokens"],
                do_sample=False,
                subtalker_dosample=False,
            )
        results.append(got[0].cpu())
    torch.save(results, out_pt)


def clone(model_dir: str, requests_json: str, audio_pt: str, out_pt: str) -> None:
    """Base, x-vector-only voice cloning: each request's reference clip (24 kHz, one per request in
    `audio_pt`) → the reference's x-vector and its greedy codes with that speaker embedding."""
    model = load(model_dir)
    clips = torch.load(audio_pt)
    xvectors, results = [], []
    for req, clip in zip(json.loads(Path(requests_json).read_text()), clips, strict=True):
        xvector = model.extract_speaker_embedding(clip.numpy().astype("float32"), 24000)
        prompt = {"ref_spk_embedding": [xvector], "x_vector_only_mode": [True], "icl_mode": [False],
                  "ref_code": None}  # fmt: skip
        with torch.no_grad():
            got, _ = model.generate(
                input_ids=[torch.tensor([req["input_ids"]])], voice_clone_prompt=prompt,
                languages=[req["language"]], non_streaming_mode=req["non_streaming_mode"],
                max_new_tokens=req["max_new_tokens"], do_sample=False, subtalker_dosample=False,
            )  # fmt: skip
        xvectors.append(xvector.float().cpu())
        results.append(got[0].cpu())
    torch.save({"xvectors": xvectors, "codes": results}, out_pt)


def icl(model_dir: str, requests_json: str, audio_pt: str, out_pt: str) -> None:
    """Base in-context cloning, as the reference's `generate_voice_clone`: each request's clip (24 kHz)
    → its codes (the 12 Hz tokenizer's encoder) and x-vector; greedy codes with the clip's codes and
    transcript (`ref_ids`) in the prompt; the waveform of clip codes + codes, the clip's share cut."""
    model = load(model_dir)
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    tokenizer = Qwen3TTSTokenizer.from_pretrained(str(Path(model_dir) / "speech_tokenizer"))
    codec = tokenizer.model.eval()
    result = {"ref_codes": [], "xvectors": [], "codes": [], "wavs": []}
    for req, clip in zip(json.loads(Path(requests_json).read_text()), torch.load(audio_pt), strict=True):
        wav = clip.numpy().astype("float32")
        ref_code = tokenizer.encode(wav, sr=24000).audio_codes[0]
        xvector = model.extract_speaker_embedding(wav, 24000)
        prompt = {"ref_code": [ref_code], "ref_spk_embedding": [xvector], "x_vector_only_mode": [False],
                  "icl_mode": [True]}  # fmt: skip
        with torch.no_grad():
            got, _ = model.generate(
                input_ids=[torch.tensor([req["input_ids"]])], ref_ids=[torch.tensor([req["ref_ids"]])],
                voice_clone_prompt=prompt, languages=[req["language"]],
                non_streaming_mode=req["non_streaming_mode"], max_new_tokens=req["max_new_tokens"],
                do_sample=False, subtalker_dosample=False,
            )  # fmt: skip
            whole = torch.cat([ref_code, got[0]], dim=0)
            wave = codec.decode(whole[None].long()).audio_values[0].float().cpu()
        cut = int(ref_code.shape[0] / max(whole.shape[0], 1) * wave.shape[0])
        result["ref_codes"].append(ref_code.cpu())
        result["xvectors"].append(xvector.float().cpu())
        result["codes"].append(got[0].cpu())
        result["wavs"].append(wave[cut:])
    torch.save(result, out_pt)


def bench(model_dir: str, requests_json: str, out_pt: str, talker_dtype: str = "float32",
          codec_dtype: str = "float32") -> None:  # fmt: skip
    """The reference as a user calls it, one request at a time on every core: greedy `generate`, then the
    codec's `decode` of its codes; per request the seconds to the whole waveform, its codes and waveform.
    One untimed request first (the reference's first call warms up for seconds). The dtypes: the model's
    (talker, code predictor) and the codec's, as a user would cast them (`.to(dtype)`)."""
    import os
    import time

    torch.set_num_threads(os.cpu_count() or 1)
    model = load(model_dir).to(getattr(torch, talker_dtype))
    import_reference()
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    codec = Qwen3TTSTokenizer.from_pretrained(str(Path(model_dir) / "speech_tokenizer")).model.eval()
    codec = codec.to(getattr(torch, codec_dtype))
    requests = json.loads(Path(requests_json).read_text())

    def speak(req: dict) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            got, _ = model.generate(
                input_ids=[torch.tensor([req["input_ids"]])], instruct_ids=[None],
                languages=[req["language"]], speakers=[req["speaker"]],
                non_streaming_mode=req["non_streaming_mode"], max_new_tokens=req["max_new_tokens"],
                do_sample=False, subtalker_dosample=False,
            )  # fmt: skip
            return got[0].cpu(), codec.decode(got[0][None].long()).audio_values[0].float().cpu()

    speak(requests[0])
    result = {"seconds": [], "codes": [], "wavs": []}
    for req in requests:
        began = time.perf_counter()
        codes, wave = speak(req)
        result["seconds"].append(time.perf_counter() - began)
        result["codes"].append(codes)
        result["wavs"].append(wave)
    torch.save(result, out_pt)


def decode(model_dir: str, codes_pt: str, out_pt: str) -> None:
    """The reference codec's waveform (`Qwen3TTSTokenizerV2Model.decode`, fp32) of each [T, 16] codes."""
    import_reference()
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    codec = Qwen3TTSTokenizer.from_pretrained(str(Path(model_dir) / "speech_tokenizer")).model.eval()
    with torch.no_grad():
        wavs = [codec.decode(c[None].long()).audio_values[0].float().cpu() for c in torch.load(codes_pt)]
    torch.save(wavs, out_pt)


def layout(out_json: str, *variants: str) -> None:
    """What a checkpoint of each variant holds, as the reference's classes save it: every JSON file and
    every tensor's name and shape (all fp32). omnistage's venv builds the tiny checkpoints from it
    (tests/qwen3_tts/tiny_checkpoint.py) without the reference."""
    import tempfile

    from safetensors import safe_open

    result = {}
    for variant in variants or tuple(VARIANTS):
        with tempfile.TemporaryDirectory() as tmp:
            build(tmp, variant, tokenizer=False)
            files, tensors = {}, {}
            for path in sorted(Path(tmp).rglob("*")):
                rel = str(path.relative_to(tmp))
                if path.suffix == ".json":
                    files[rel] = json.loads(path.read_text())
                elif path.suffix == ".safetensors":
                    with safe_open(str(path), "pt") as f:
                        tensors[rel] = {k: list(f.get_slice(k).get_shape()) for k in sorted(f.keys())}
        result[variant] = {"files": files, "tensors": tensors}
    Path(out_json).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    commands = {"build": build, "layout": layout, "codes": codes, "clone": clone, "icl": icl}
    commands |= {"build_bench": build_bench, "bench": bench}
    (commands | {"decode": decode})[sys.argv[1]](*sys.argv[2:])
