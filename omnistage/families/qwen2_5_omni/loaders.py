"""Loading one Qwen2.5-Omni sub-model from the single checkpoint directory.

The release keeps every weight in one directory under `thinker.` / `talker.` / `token2wav.` prefixes and one
composite `config.json`. Each stage loads only its own part: the sub-config from the composite config and
the prefixed tensors, handed to transformers' `from_pretrained(None, config=..., state_dict=...)` so the
real loading code (dtype, buffers, tied weights) runs.

The AR engine drives the thinker and the talker through `LoadedModel` (embed, decoder, head); the extra
fields here are what the Qwen2.5-Omni input processors need in the same process (the thinker's encoders
and processor, the talker's copy of the thinker's token embeddings, the speakers).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import AutoConfig

from omnistage.stages.ar.attention import ATTENTION_NAME
from omnistage.stages.ar.cpu.lean_decoder import LeanDecoder, supports
from omnistage.stages.ar.loader import LoadedModel, eos_token_ids

logger = logging.getLogger(__name__)


def read_prefixed(model_dir: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """The checkpoint tensors under `prefix`, with the prefix removed (only those are read from disk)."""
    tensors = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(file), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                if key.startswith(prefix):
                    tensors[key[len(prefix) :]] = handle.get_tensor(key)
    if not tensors:
        raise FileNotFoundError(f"{model_dir} has no weights under {prefix!r}")
    return tensors


def load_speakers(model_dir: str | Path) -> dict[str, dict[str, Any]]:
    """`spk_dict.pt`: {name: {"cond", "ref_mel", "bos_token"}}."""
    path = Path(model_dir) / "spk_dict.pt"
    if not path.exists():
        raise FileNotFoundError(f"{model_dir} has no spk_dict.pt (the speaker dictionary)")
    return torch.load(path, weights_only=True)


@dataclasses.dataclass
class ThinkerModel(LoadedModel):
    """The thinker's text stack for the engine, plus its audio/vision encoders and the processor."""

    thinker: Any = None  # Qwen2_5OmniThinkerForConditionalGeneration
    processor: Any = None
    speakers: list[str] = dataclasses.field(default_factory=list)  # checked before the thinker runs


@dataclasses.dataclass
class TalkerModel(LoadedModel):
    """The talker for the engine, plus what building its inputs needs from the thinker and the speakers."""

    talker: Any = None  # Qwen2_5OmniTalkerForConditionalGeneration
    text_embed: torch.nn.Embedding | None = None  # the thinker's token embeddings
    speakers: dict[str, int] = dataclasses.field(default_factory=dict)  # name → text bos token


class TalkerDecoder(torch.nn.Module):
    """The talker's decoder as the engine calls it: thinker-width embeddings in, projected to the talker's
    width first (what `Qwen2_5OmniTalkerForConditionalGeneration.forward` does before its model)."""

    def __init__(self, talker: Any):
        super().__init__()
        self.proj = talker.thinker_to_talker_proj
        self.model = talker.model

    def forward(self, inputs_embeds: torch.Tensor, **kwargs: Any) -> Any:
        return self.model(inputs_embeds=self.proj(inputs_embeds), **kwargs)

    def lean_decoder(self) -> LeanDecoder | None:
        return LeanDecoder(self.model, input_proj=self.proj) if supports(self.model) else None


class TalkerHead(torch.nn.Module):
    """`codec_head` with the codec BOS suppressed, as the reference's `generate` always does."""

    def __init__(self, head: torch.nn.Linear, suppressed: list[int]):
        super().__init__()
        self.head = head
        self.suppressed = suppressed

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)
        logits[..., self.suppressed] = float("-inf")
        return logits


def load_thinker(model_dir: str, dtype: torch.dtype, device: str) -> ThinkerModel:
    from transformers import Qwen2_5OmniThinkerForConditionalGeneration

    from omnistage.families.qwen2_5_omni.processor import load_processor

    config = AutoConfig.from_pretrained(model_dir).thinker_config
    attn = {"text_config": ATTENTION_NAME, "vision_config": "sdpa", "audio_config": "sdpa", "": "sdpa"}
    thinker = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(
        None,
        config=config,
        state_dict=read_prefixed(model_dir, "thinker."),
        dtype=dtype,
        attn_implementation=attn,
    )
    thinker.to(device).eval()
    text_config = thinker.config.text_config
    processor = load_processor(model_dir)
    has_speakers = (Path(model_dir) / "spk_dict.pt").exists()
    return ThinkerModel(
        embed=thinker.get_input_embeddings(),
        decoder=thinker.model.language_model,
        head=thinker.lm_head,
        config=text_config,
        tokenizer=processor.tokenizer,
        eos_token_ids=eos_token_ids(model_dir, text_config),
        root=thinker,
        thinker=thinker,
        processor=processor,
        speakers=sorted(load_speakers(model_dir)) if has_speakers else [],
    )


def load_talker(model_dir: str, dtype: torch.dtype, device: str) -> TalkerModel:
    from transformers import Qwen2_5OmniTalkerForConditionalGeneration

    config = AutoConfig.from_pretrained(model_dir)
    talker = Qwen2_5OmniTalkerForConditionalGeneration.from_pretrained(
        None,
        config=config.talker_config,
        state_dict=read_prefixed(model_dir, "talker."),
        dtype=dtype,
        attn_implementation=ATTENTION_NAME,
    )
    talker.to(device).eval()
    text_weight = read_prefixed(model_dir, "thinker.model.embed_tokens.")["weight"]
    text_embed = torch.nn.Embedding.from_pretrained(text_weight.to(dtype), freeze=True).to(device)
    speakers = {name: int(spk["bos_token"]) for name, spk in load_speakers(model_dir).items()}
    return TalkerModel(
        embed=talker.get_input_embeddings(),
        decoder=TalkerDecoder(talker),
        head=TalkerHead(talker.codec_head, [talker.codec_bos_token]),
        config=talker.config,
        tokenizer=None,
        # The composite generate stops the talker on codec pad or codec end.
        eos_token_ids=[talker.codec_pad_token, talker.codec_eos_token],
        root=talker,
        talker=talker,
        text_embed=text_embed,
        speakers=speakers,
    )


def load_token2wav(model_dir: str, device: str = "cpu") -> tuple[Any, dict[str, dict[str, Any]]]:
    """The code2wav model in float32 (the reference always runs it in float32) and the speakers."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    config = AutoConfig.from_pretrained(model_dir).token2wav_config
    model = Qwen2_5OmniToken2WavModel.from_pretrained(
        None, config=config, state_dict=read_prefixed(model_dir, "token2wav."), dtype=torch.float32
    )
    return model.to(device).eval(), load_speakers(model_dir)
