"""Loading one Qwen3-Omni sub-model from the single checkpoint directory (as Qwen2.5-Omni's loaders do:
the sub-config of the composite `config.json` and the prefixed tensors, through transformers'
`from_pretrained(None, config=..., state_dict=...)`)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from transformers import AutoConfig

from omnistage.families.qwen2_5_omni.loaders import ThinkerModel, read_prefixed
from omnistage.stages.ar.attention import ATTENTION_NAME
from omnistage.stages.ar.loader import LoadedModel, eos_token_ids


@dataclasses.dataclass
class Qwen3ThinkerModel(ThinkerModel):
    """Qwen2.5-Omni's thinker parts, plus the hidden layer the talker reads (`accept_hidden_layer`)."""

    accept_hidden_layer: int = -1


@dataclasses.dataclass
class TalkerModel(LoadedModel):
    """The talker for the engine (embed = codec embedding, decoder, head = codec_head), plus its text and
    hidden projections, code predictor and the thinker's token embeddings its prompt is made of."""

    talker: Any = None  # Qwen3OmniMoeTalkerForConditionalGeneration
    text_embed: torch.nn.Embedding | None = None
    omni_config: Any = None  # the composite config (tts ids, im_start / user / assistant ids)


def load_thinker(model_dir: str, dtype: torch.dtype, device: str) -> Qwen3ThinkerModel:
    from transformers import Qwen3OmniMoeProcessor, Qwen3OmniMoeThinkerForConditionalGeneration

    from omnistage.families.qwen2_5_omni.processor import load_processor

    config = AutoConfig.from_pretrained(model_dir)
    attn = {"text_config": ATTENTION_NAME, "vision_config": "sdpa", "audio_config": "sdpa", "": "sdpa"}
    thinker = Qwen3OmniMoeThinkerForConditionalGeneration.from_pretrained(
        None,
        config=config.thinker_config,
        state_dict=read_prefixed(model_dir, "thinker."),
        dtype=dtype,
        attn_implementation=attn,
    )
    thinker.to(device).eval()
    text_config = thinker.config.text_config
    processor = load_processor(model_dir, Qwen3OmniMoeProcessor)
    speakers = sorted(config.talker_config.speaker_id or {}) if config.enable_audio_output else []
    return Qwen3ThinkerModel(
        embed=thinker.get_input_embeddings(),
        decoder=thinker.model.language_model,
        head=thinker.lm_head,
        config=text_config,
        tokenizer=processor.tokenizer,
        eos_token_ids=eos_token_ids(model_dir, text_config),
        root=thinker,
        thinker=thinker,
        processor=processor,
        speakers=speakers,
        accept_hidden_layer=config.talker_config.accept_hidden_layer,
    )


class TalkerHead(torch.nn.Module):
    """`codec_head` with the reference's suppressed ids (the top 1024 of the vocabulary, but codec EOS)."""

    def __init__(self, head: torch.nn.Linear, vocab: int, eos: int):
        super().__init__()
        self.head = head
        self.suppressed = [i for i in range(vocab - 1024, vocab) if i != eos]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        logits[..., self.suppressed] = float("-inf")
        return logits


def fused_experts(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert `experts.{e}.{gate,up,down}_proj.weight` (how the checkpoint stores the talker's experts)
    as the fused `experts.gate_up_proj` [E, 2I, H] / `experts.down_proj` [E, H, I] the module holds; the
    composite model's loader converts them, a sub-model loaded from a state dict does not."""
    pattern = re.compile(r"(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
    out, experts = {}, {}
    for key, value in state.items():
        match = pattern.match(key)
        if match is None:
            out[key] = value
        else:
            experts.setdefault(match[1], {}).setdefault(int(match[2]), {})[match[3]] = value
    for prefix, by_index in experts.items():
        ordered = [by_index[e] for e in sorted(by_index)]
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([w["gate"], w["up"]]) for w in ordered])
        out[f"{prefix}.down_proj"] = torch.stack([w["down"] for w in ordered])
    return out


def load_talker(model_dir: str, dtype: torch.dtype, device: str) -> TalkerModel:
    from transformers import Qwen3OmniMoeTalkerForConditionalGeneration

    config = AutoConfig.from_pretrained(model_dir)
    attn = {"text_config": ATTENTION_NAME, "code_predictor_config": "sdpa", "": "sdpa"}
    talker = Qwen3OmniMoeTalkerForConditionalGeneration.from_pretrained(
        None,
        config=config.talker_config,
        state_dict=fused_experts(read_prefixed(model_dir, "talker.")),
        dtype=dtype,
        attn_implementation=attn,
    )
    talker.to(device).eval()
    text_weight = read_prefixed(model_dir, "thinker.model.embed_tokens.")["weight"]
    text_embed = torch.nn.Embedding.from_pretrained(text_weight.to(dtype), freeze=True).to(device)
    cfg = talker.config
    return TalkerModel(
        embed=talker.get_input_embeddings(),
        decoder=talker.model,
        head=TalkerHead(talker.codec_head, cfg.text_config.vocab_size, cfg.codec_eos_token_id),
        config=cfg.text_config,
        tokenizer=None,
        eos_token_ids=[cfg.codec_eos_token_id],
        root=talker,
        talker=talker,
        text_embed=text_embed,
        omni_config=config,
        step_modules=[talker.code_predictor],
    )


def load_code2wav(model_dir: str, device: str = "cpu") -> Any:
    """code2wav in float32 (the reference runs it in the checkpoint dtype; float32 here)."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    config = AutoConfig.from_pretrained(model_dir).code2wav_config
    model = Qwen3OmniMoeCode2Wav.from_pretrained(
        None, config=config, state_dict=read_prefixed(model_dir, "code2wav."), dtype=torch.float32
    )
    return model.to(device).eval()
