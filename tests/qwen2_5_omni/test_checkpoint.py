"""The tiny Qwen2.5-Omni checkpoint has the real layout, ids and processor, and resolves to the pipeline."""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open

from omnistage.errors import InvalidRequestError
from omnistage.families.qwen2_5_omni.processor import prompt_to_inputs
from omnistage.families.resolve import resolve_pipeline

pytestmark = pytest.mark.unit


def test_layout_and_weight_prefixes(omni_dir):
    config = json.loads((omni_dir / "config.json").read_text())
    assert config["model_type"] == "qwen2_5_omni"
    assert config["architectures"] == ["Qwen2_5OmniForConditionalGeneration"]
    assert config["thinker_config"]["text_config"]["vocab_size"] == 152064
    with safe_open(str(omni_dir / "model.safetensors"), "pt") as f:
        prefixes = {key.split(".")[0] for key in f.keys()}  # noqa: SIM118
    assert prefixes == {"thinker", "talker", "token2wav"}
    speakers = torch.load(omni_dir / "spk_dict.pt", weights_only=True)
    assert {name: s["bos_token"] for name, s in speakers.items()} == {"Chelsie": 151870, "Ethan": 151871}
    assert speakers["Chelsie"]["cond"].shape == (1, 16) and speakers["Chelsie"]["ref_mel"].shape[-1] == 80
    nested = json.loads((omni_dir / "processor_config.json").read_text())
    assert {"feature_extractor", "image_processor", "video_processor"} <= set(nested)


def test_tokenizer_has_the_real_special_ids(processor):
    tok = processor.tokenizer
    assert len(tok) == 151665
    expected = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|AUDIO|>": 151646,
        "<|audio_bos|>": 151647,
        "<|vision_bos|>": 151652,
        "<|IMAGE|>": 151655,
        "<|VIDEO|>": 151656,
        "<|file_sep|>": 151664,
    }
    assert {t: tok.convert_tokens_to_ids(t) for t in expected} == expected
    assert [tok.encode(w) for w in ("user", "system", "assistant", "\n")] == [[872], [8948], [77091], [198]]
    ids = prompt_to_inputs(processor, "Hi")["input_ids"][0].tolist()
    assert ids[:3] == [151644, 8948, 198] and ids[-3:] == [151644, 77091, 198]
    assert tok.decode(ids, skip_special_tokens=True).endswith("Hi\nassistant\n")


def test_processor_expands_media_placeholders(processor):
    rng = np.random.default_rng(1)
    content = [
        {"type": "image", "image": rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)},
        {"type": "audio", "audio": rng.standard_normal(8000).astype(np.float32)},
        {"type": "video", "video": rng.integers(0, 255, (4, 56, 56, 3), dtype=np.uint8)},
        {"type": "text", "text": "Describe."},
    ]
    out = prompt_to_inputs(processor, {"messages": [{"role": "user", "content": content}]})
    ids = out["input_ids"][0]
    assert out["image_grid_thw"].tolist() == [[1, 4, 4]] and int((ids == 151655).sum()) == 4
    assert out["video_grid_thw"].tolist() == [[2, 4, 4]] and int((ids == 151656).sum()) == 8
    assert out["pixel_values_videos"].shape == (32, 3 * 2 * 14 * 14)
    assert int((ids == 151646).sum()) == 12  # 0.5 s: 50 mel frames → 25 after conv → 12 after pooling
    with pytest.raises(InvalidRequestError) as err:
        prompt_to_inputs(
            processor, {"messages": [{"role": "user", "content": [{"type": "image", "image": "x"}]}]}
        )
    assert err.value.param == "multi_modal_data.image"


def test_vllm_prompt_forms_give_the_chat_forms_inputs(processor):
    """vLLM's templated `{"prompt", "multi_modal_data"}` and a typed chat prompt with its media in
    `multi_modal_data` give the model the same inputs as the media in the message parts."""
    rng = np.random.default_rng(2)
    image = rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)
    audio = rng.standard_normal(8000).astype(np.float32)
    parts = [
        {"type": "image", "image": image},
        {"type": "audio", "audio": audio},
        {"type": "text", "text": "Hi"},
    ]
    in_parts = prompt_to_inputs(processor, {"messages": [{"role": "user", "content": parts}]})
    placeholders = [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "Hi"}]
    media = {"image": image, "audio": audio}
    chat = prompt_to_inputs(
        processor, {"messages": [{"role": "user", "content": placeholders}], "multi_modal_data": media}
    )
    text = processor.apply_chat_template(
        [{"role": "user", "content": placeholders}], tokenize=False, add_generation_prompt=True
    )
    templated = prompt_to_inputs(processor, {"prompt": text, "multi_modal_data": media})
    for other in (chat, templated):
        assert set(other) == set(in_parts)
        assert all(torch.equal(other[k], in_parts[k]) for k in in_parts)
    assert int((templated["input_ids"][0] == 151655).sum()) == 4


def test_resolves_to_three_stages_or_thinker_only(omni_dir, tmp_path):
    spec, _ = resolve_pipeline(omni_dir)
    assert [(s.name, str(s.kind), s.inputs) for s in spec.stages] == [
        ("thinker", "ar", ()),
        ("talker", "ar", (0,)),
        ("code2wav", "generation", (1,)),
    ]
    assert spec.stages_for(["text"]) == ({0}, {0})
    config = json.loads((omni_dir / "config.json").read_text())
    shutil.copy(omni_dir / "spk_dict.pt", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "enable_audio_output": False}))
    spec, _ = resolve_pipeline(tmp_path)
    assert [s.name for s in spec.stages] == ["thinker"]
