"""CSM's backbone on the AR engine, its depth decoder in the post-sample hook.

The checkpoint loads through transformers' own `CsmForConditionalGeneration.from_pretrained` (the backbone on
the engine's paged attention, the depth decoder and Mimi on their own). The engine runs the backbone: a
prompt's text positions are its text embedding, an earlier turn's audio frames the sum of their codebooks'
embeddings (`frame_rows`); its head gives codebook 0 of each frame. The post-sample hook (`depth_codes`),
batched over the step's sequences, runs the depth decoder as the reference's `generate` does: fed [the
backbone's hidden state, codebook 0's embedding] and then each code it makes, its per-codebook heads give
codebooks 1..K-1; the next backbone input is the sum of the frame's K codebook embeddings; a frame whose
codebooks (all but the last) are all `codebook_eos_token_id` ends the request (the reference's stop).
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.shared.depth_codes import SeededPick, residual_codes
from omnistage.stages.ar.attention import ATTENTION_NAME
from omnistage.stages.ar.loader import LoadedModel, load_tokenizer
from omnistage.stages.ar.post_sample import PostSample, SampledStep


@dataclasses.dataclass
class DepthSampling:
    """A request's depth-decoder sampling (the checkpoint's `depth_decoder_*`; None on ARInputs.extension:
    greedy), seeded per request so its frames do not depend on the batch."""

    spec: dict[str, Any] | None = None


class CodebookHeads:
    """The depth decoder's head for codebook j (1..K-1) as `heads[j - 1](hidden)`: the reference's
    `CsmCodebooksHead` product for one position."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight  # [K - 1, H, V]

    def __len__(self) -> int:
        return self.weight.shape[0]

    def __getitem__(self, j: int):
        return lambda hidden: F.linear(hidden, self.weight[j].T)

    def __iter__(self):
        return (self[j] for j in range(len(self)))


class CodebookEmbeddings:
    """Codebook j+1's embedding as `embeddings[j](codes)`: rows of the one table the backbone and the depth
    decoder share, offset by codebook."""

    def __init__(self, table: nn.Embedding, vocab: int):
        self.table, self.vocab = table, vocab

    def __getitem__(self, j: int):
        return lambda codes: self.table(codes + (j + 1) * self.vocab)


@dataclasses.dataclass
class CsmBackbone(LoadedModel):
    """The AR engine's parts (embed = the text embedding, decoder = the backbone, head = codebook 0's head)
    and what prompts and the hook need."""

    audio_embed: nn.Embedding | None = None  # [K * V, H]: every codebook's codes, offset by codebook
    depth: nn.Module | None = None  # CsmDepthDecoderForCausalLM
    codec: nn.Module | None = None  # MimiModel: an earlier turn's clip → its codes
    csm_config: Any = None
    generation_config: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def num_codebooks(self) -> int:
        return self.csm_config.num_codebooks

    @property
    def codebook_size(self) -> int:
        return self.csm_config.vocab_size

    def frame_rows(self, codes: torch.Tensor) -> torch.Tensor:
        """[N, K] codes → [N, H]: each frame's summed codebook embeddings (the backbone's audio input)."""
        offsets = torch.arange(codes.shape[1], device=codes.device) * self.codebook_size
        return self.audio_embed(codes.to(self.audio_embed.weight.device) + offsets).sum(dim=1)

    def text_rows(self, ids: list[int]) -> torch.Tensor:
        return self.embed(torch.tensor(ids, dtype=torch.long, device=self.embed.weight.device))


@torch.inference_mode()
def load_backbone(model_dir: str, dtype: torch.dtype, device: str) -> CsmBackbone:
    """The AR engine's `model_loader` for a CSM checkpoint directory."""
    from transformers import CsmForConditionalGeneration

    model = CsmForConditionalGeneration.from_pretrained(
        model_dir,
        dtype=dtype,
        attn_implementation={"": ATTENTION_NAME, "depth_decoder_config": "sdpa", "codec_config": "sdpa"},
    )
    model.to(device).eval()
    config = model.config
    return CsmBackbone(
        embed=model.embed_text_tokens,
        decoder=model.backbone_model,
        head=model.lm_head,
        config=config,
        tokenizer=load_tokenizer(model_dir),
        eos_token_ids=[],  # a frame ends a request (depth_codes), not a token of codebook 0
        root=model,
        step_modules=[model.depth_decoder],
        audio_embed=model.backbone_model.embed_tokens.embed_audio_tokens,
        depth=model.depth_decoder,
        codec=model.codec_model,
        csm_config=config,
        generation_config=_generation_config(model_dir),
    )


def _generation_config(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / "generation_config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def depth_sampling(loaded: CsmBackbone, params: Any) -> DepthSampling:
    """A request's depth-decoder sampling: greedy when the backbone is (temperature 0) or the checkpoint's
    depth decoder does not sample; else the checkpoint's `depth_decoder_*` settings, seeded by the
    request's seed (or a fresh one)."""
    gen = loaded.generation_config
    if getattr(params, "temperature", None) == 0.0 or not gen.get("depth_decoder_do_sample", False):
        return DepthSampling()
    seed = getattr(params, "seed", None)
    spec = {
        "temperature": float(gen.get("depth_decoder_temperature", 1.0)),
        "top_k": int(gen.get("depth_decoder_top_k", 50) or 0),
        "top_p": float(gen.get("depth_decoder_top_p", 1.0) or 1.0),
        "seed": int(seed) if seed is not None else random.getrandbits(62),
    }
    return DepthSampling(spec)


def depth_codes(model: CsmBackbone, step: SampledStep) -> PostSample:
    """Post-sample hook: codebooks 1..K-1 of every sampled frame in one batch, the next inputs, and the stop
    (a frame whose codebooks but the last are all EOS)."""
    depth = model.depth
    code0 = model.audio_embed(step.token_ids)
    specs = [_spec(inputs) for inputs in step.inputs]
    pick = SeededPick(specs, step.steps, code0.device) if any(specs) else None
    codes, rest = residual_codes(
        depth.model,
        CodebookHeads(depth.codebooks_head.weight),
        CodebookEmbeddings(model.audio_embed, model.codebook_size),
        step.hidden.to(code0.dtype),
        code0,
        depth.model.inputs_embeds_projector,
        pick=pick,
        projects_inside=True,
    )
    frame = torch.cat([step.token_ids[:, None], codes], dim=1)
    stop = (frame[:, :-1] == model.csm_config.codebook_eos_token_id).all(dim=1)
    return PostSample(codes=codes, next_embeds=code0 + rest, stop=stop)


def _spec(inputs: Any) -> dict[str, Any] | None:
    extension = getattr(inputs, "extension", None)
    return extension.spec if isinstance(extension, DepthSampling) else None
