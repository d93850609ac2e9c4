"""Runs inside the reference venv (transformers 5.17 + qwen-tts-hf 0.1.1.post1, see reference_env.sh), never
in omnistage's: builds the tiny checkpoints from the reference's own config and model classes, and computes
the reference's outputs for them. Called by tests/qwen3_tts/reference_outputs.py as
`python worker.py build OUT_DIR VARIANT` or `python worker.py codes MODEL_DIR REQUESTS_JSON OUT_PT`."""

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
    return modeling


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


def build(out_dir: str, variant: str) -> None:
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


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"build": build, "codes": codes}[sys.argv[1]](*sys.argv[2:])
