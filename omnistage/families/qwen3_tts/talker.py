"""The Qwen3-TTS talker and its code predictor, loaded from a released checkpoint directory.

The reference code (qwen-tts-hf) cannot be imported beside transformers 5.24 (its model outputs and Mimi
patches break there, see tests/qwen3_tts/reference), so the networks are the transformers classes its
layers are made of: the talker's decoder is a `Qwen3Model` (q/k-normed attention, SwiGLU MLP, RMSNorm). Its
interleaved multimodal RoPE reduces to plain RoPE for speech, whose three position rows are always equal
(`get_rope_index` of a text-only mask), so `Qwen3Model`'s RoPE computes the same rotation. The code
predictor is a second, small `Qwen3Model` with 15 codebook embeddings and heads. The weights load by name
from the checkpoint (`talker.model.*`, `talker.code_predictor.*`); tests prove the codes equal the
reference's `generate`.

Per frame (post-sample hook, batched over the step's sequences): the talker's head gives codebook 0; the
predictor, fed [talker hidden, embedding of code 0] and then each code it makes, greedily gives codebooks
1..15 (a fresh KV cache each frame); the next talker input is the sum of the 16 codebook embeddings plus the
request's next text row (`trailing_text`, or `tts_pad` once the text is spoken).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnistage.families.shared.depth_codes import Pick, SeededPick, residual_codes
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.attention import ATTENTION_NAME
from omnistage.stages.ar.loader import LoadedModel, load_tokenizer
from omnistage.stages.ar.post_sample import PostSample, SampledStep

WEIGHTS = "model.safetensors"


class TextProjection(nn.Module):
    """The talker's text resize MLP (`text_projection`): text width → talker width."""

    def __init__(self, width: int, out: int, act: str):
        super().__init__()
        from transformers.activations import ACT2FN

        self.linear_fc1 = nn.Linear(width, width, bias=True)
        self.linear_fc2 = nn.Linear(width, out, bias=True)
        self.act_fn = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


class CodePredictor(nn.Module):
    """`talker.code_predictor`: codebooks 1..G-1 of a frame from the talker's hidden state and code 0."""

    def __init__(self, config: dict[str, Any], talker_width: int):
        super().__init__()
        from transformers import Qwen3Config, Qwen3Model

        groups = config["num_code_groups"]
        self.model = Qwen3Model(_qwen3_config(Qwen3Config, config, "sdpa"))
        self.model.codec_embedding = nn.ModuleList(
            [nn.Embedding(config["vocab_size"], talker_width) for _ in range(groups - 1)]
        )
        self.model.embed_tokens = None  # inputs are always embeddings
        self.lm_head = nn.ModuleList(
            [nn.Linear(config["hidden_size"], config["vocab_size"], bias=False) for _ in range(groups - 1)]
        )
        width = config["hidden_size"]
        self.small_to_mtp_projection = (
            nn.Linear(talker_width, width, bias=True) if width != talker_width else nn.Identity()
        )

    def forward(
        self, hidden: torch.Tensor, code0_embed: torch.Tensor, pick: Pick | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden, code0_embed: [S, H_talker] → (codes [S, G-1], summed embeddings of codes 1.. [S, H])."""
        return residual_codes(
            self.model,
            self.lm_head,
            self.model.codec_embedding,
            hidden,
            code0_embed,
            self.small_to_mtp_projection,
            pick=pick,
        )


@dataclasses.dataclass
class Qwen3TTSTalker(LoadedModel):
    """The AR engine's parts (embed = the codec embedding, decoder, head = codec_head) plus what prompts
    and the post-sample hook need."""

    text_embed: nn.Module | None = None
    text_projection: nn.Module | None = None
    code_predictor: CodePredictor | None = None
    speaker_encoder: nn.Module | None = None  # Base checkpoints: a reference clip's x-vector (speaker.py)
    codec_encoder: nn.Module | None = None  # Base checkpoints: a reference clip's codes (encoder.py)
    tts_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    generation_config: dict[str, Any] = dataclasses.field(default_factory=dict)  # subtalker_* defaults

    @property
    def talker_config(self) -> dict[str, Any]:
        return self.tts_config["talker_config"]

    def text_rows(self, ids: list[int]) -> torch.Tensor:
        """Projected text embeddings [len(ids), H]."""
        device = self.embed.weight.device
        return self.text_projection(self.text_embed(torch.tensor(ids, dtype=torch.long, device=device)))

    def codec_rows(self, ids: list[int]) -> torch.Tensor:
        return self.embed(torch.tensor(ids, dtype=torch.long, device=self.embed.weight.device))


def _qwen3_config(cls: type, config: dict[str, Any], attn: str) -> Any:
    return cls(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        hidden_act=config.get("hidden_act", "silu"),
        max_position_embeddings=config["max_position_embeddings"],
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_parameters={"rope_type": "default", "rope_theta": float(config.get("rope_theta", 10000))},
        attention_bias=config.get("attention_bias", False),
        tie_word_embeddings=False,
        attn_implementation=attn,
    )


def read_config(model_dir: str) -> dict[str, Any]:
    return json.loads((Path(model_dir) / "config.json").read_text())


@torch.inference_mode()
def load_talker(model_dir: str, dtype: torch.dtype, device: str) -> Qwen3TTSTalker:
    """The AR engine's `model_loader` for a Qwen3-TTS checkpoint directory."""
    from safetensors.torch import load_file
    from transformers import Qwen3Config, Qwen3Model

    tts = read_config(model_dir)
    cfg = tts["talker_config"]
    decoder = Qwen3Model(_qwen3_config(Qwen3Config, cfg, ATTENTION_NAME))
    decoder.embed_tokens = None  # the codec embedding below is the engine's embed
    root = nn.Module()
    root.decoder = decoder
    root.embed = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
    root.head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
    root.text_embed = nn.Embedding(cfg["text_vocab_size"], cfg["text_hidden_size"])
    act = cfg.get("hidden_act", "silu")
    root.text_projection = TextProjection(cfg["text_hidden_size"], cfg["hidden_size"], act)
    root.code_predictor = CodePredictor(cfg["code_predictor_config"], cfg["hidden_size"])
    if tts.get("tts_model_type") == "base":
        from omnistage.families.qwen3_tts.speaker import SpeakerEncoder

        root.speaker_encoder = SpeakerEncoder(tts["speaker_encoder_config"])
    state = load_file(str(Path(model_dir) / WEIGHTS))
    names = {
        "talker.model.codec_embedding.weight": "embed.weight",
        "talker.model.text_embedding.weight": "text_embed.weight",
        "talker.codec_head.weight": "head.weight",
    }
    mapped = {}
    for key, value in state.items():
        if key in names:
            mapped[names[key]] = value
        elif key.startswith("talker.model."):
            mapped["decoder." + key.removeprefix("talker.model.")] = value
        elif key.startswith("talker."):
            mapped[key.removeprefix("talker.")] = value
        elif key.startswith("speaker_encoder.") and hasattr(root, "speaker_encoder"):
            mapped[key] = value
    missing, unexpected = root.load_state_dict(mapped, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError(f"{model_dir}: talker weights do not match (missing {missing}, extra {unexpected})")
    root.to(device, dtype).eval()
    return Qwen3TTSTalker(
        embed=root.embed,
        decoder=decoder,
        head=root.head,
        config=decoder.config,
        tokenizer=load_tokenizer(model_dir),
        eos_token_ids=[int(cfg["codec_eos_token_id"])],
        root=root,
        text_embed=root.text_embed,
        text_projection=root.text_projection,
        code_predictor=root.code_predictor,
        step_modules=[root.code_predictor],
        speaker_encoder=getattr(root, "speaker_encoder", None),
        codec_encoder=_codec_encoder(tts, model_dir, device),
        tts_config=tts,
        generation_config=_generation_config(model_dir),
    )


def _generation_config(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / "generation_config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _codec_encoder(tts: dict[str, Any], model_dir: str, device: str) -> nn.Module | None:
    if tts.get("tts_model_type") != "base":
        return None
    from omnistage.families.qwen3_tts.encoder import load_encoder

    return load_encoder(model_dir, device)


def predict_codes(model: Qwen3TTSTalker, step: SampledStep) -> PostSample:
    """Post-sample hook: codebooks 1..15 of every sampled frame in one batch, and the next inputs. A
    request whose inputs hold `subtalker` params samples them as the reference's `subtalker_*` sampling."""
    code0 = model.embed(step.token_ids)
    specs = [inputs.extension.subtalker for inputs in step.inputs]
    pick = SeededPick(specs, step.steps, code0.device) if any(specs) else None
    codes, rest = model.code_predictor(step.hidden.to(code0.dtype), code0, pick=pick)
    text = torch.stack([_text_row(inputs, i) for inputs, i in zip(step.inputs, step.steps, strict=True)])
    return PostSample(codes=codes, next_embeds=code0 + rest + text.to(code0.device, code0.dtype))


def _text_row(inputs: ARInputs, step: int) -> torch.Tensor:
    """The text row fed with generated frame `step`: the next unspoken text token, then tts_pad."""
    text = inputs.extension
    return text.trailing_text[step] if step < text.trailing_text.shape[0] else text.tts_pad_embed
