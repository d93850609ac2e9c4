"""The tiny Qwen3-Omni checkpoint has the real layout and ids, initialised weights where transformers leaves
none, and resolves to the pipeline from config.json."""

import json
import shutil

import pytest
from safetensors import safe_open

from omnistage.families.qwen3_omni.pipeline import QWEN3_OMNI, QWEN3_OMNI_THINKER_ONLY
from omnistage.families.resolve import resolve_pipeline

pytestmark = pytest.mark.unit


def test_layout_ids_and_resolution(omni3_dir, tmp_path):
    config = json.loads((omni3_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3OmniMoeForConditionalGeneration"]
    assert config["thinker_config"]["text_config"]["vocab_size"] == 152064
    talker = config["talker_config"]
    assert talker["speaker_id"] == {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
    assert (talker["codec_pad_id"], talker["codec_bos_id"], talker["codec_eos_token_id"]) == (
        2148,
        2149,
        2150,
    )
    assert (config["tts_pad_token_id"], config["tts_bos_token_id"], config["tts_eos_token_id"]) == (
        151671,
        151672,
        151673,
    )
    with safe_open(str(omni3_dir / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert {key.split(".")[0] for key in keys} == {"thinker", "talker", "code2wav"}
        # The talker's experts (torch.empty in transformers) and routers (zeros) were initialised.
        for key in keys:
            if key.startswith("talker.model.layers.0.mlp.") and ("experts" in key or "gate.weight" in key):
                weight = f.get_tensor(key)
                assert weight.isfinite().all() and 0.01 < float(weight.std()) < 0.05, key
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(omni3_dir)
    ids = {"<|audio_pad|>": 151675, "<|audio_start|>": 151669, "<|image_pad|>": 151655, "<tts_pad>": 151671}
    ids |= {"user": 872, "system": 8948, "assistant": 77091, "\n": 198}
    assert {t: tok.convert_tokens_to_ids(tok.tokenize(t))[0] for t in ids} == ids

    assert resolve_pipeline(omni3_dir)[0] is QWEN3_OMNI
    text_only = tmp_path / "thinker_only"
    shutil.copytree(omni3_dir, text_only, ignore=shutil.ignore_patterns("*.safetensors"))
    config["enable_audio_output"] = False
    (text_only / "config.json").write_text(json.dumps(config))
    assert resolve_pipeline(text_only)[0] is QWEN3_OMNI_THINKER_ONLY
