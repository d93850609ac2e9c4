"""Caption embeddings for training, equal to what WanPipeline feeds the DiT but four times cheaper.

WanPipeline pads every prompt to 512 tokens and zeroes the embeddings past the caption, so the DiT's
cross-attention always sees the caption's tokens plus ~500 identical padding tokens. Identical keys and
values are interchangeable: attention over P copies of one key equals attention over a single copy whose
logit is raised by log(P). Training therefore feeds the caption tokens plus ONE zero "padding slot" and adds
log(P) to that slot's logits through an attention bias; the result equals the padded computation (a test
checks it), so the trained model is exactly right for the pipeline's default `max_sequence_length`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
from diffusers import WanTransformer3DModel
from diffusers.models.transformers.transformer_wan import WanAttnProcessor
from transformers import PreTrainedTokenizerBase, UMT5EncoderModel

from omnistage.demo.architecture import MAX_SEQUENCE_LENGTH


class CollapsedPaddingProcessor(WanAttnProcessor):
    """Wan cross-attention with an additive bias (set per batch) standing in for the collapsed padding."""

    def __init__(self, bias: torch.Tensor):
        super().__init__()
        self.bias = bias

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        return super().__call__(attn, hidden_states, encoder_hidden_states, self.bias, rotary_emb)


@contextlib.contextmanager
def collapsed_padding(transformer: WanTransformer3DModel, bias: torch.Tensor) -> Iterator[None]:
    """Runs the transformer's cross-attentions with `bias`, restoring the stock processors afterwards."""
    originals = [block.attn2.processor for block in transformer.blocks]
    processor = CollapsedPaddingProcessor(bias)
    for block in transformer.blocks:
        block.attn2.set_processor(processor)
    try:
        yield
    finally:
        for block, original in zip(transformer.blocks, originals, strict=True):
            block.attn2.set_processor(original)


def encode_captions(
    tokenizer: PreTrainedTokenizerBase,
    text_encoder: UMT5EncoderModel,
    captions: list[str],
    max_sequence_length: int = MAX_SEQUENCE_LENGTH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(embeddings [B, L+1, D], bias [B, 1, 1, L+1]) for `collapsed_padding`; L is the longest caption.

    Keeps gradients, so the text encoder can train with the DiT. Tokens past a caption's length are masked
    out of the encoder (as the pipeline's attention mask does) and out of the cross-attention (-inf bias);
    the last slot is the zero padding embedding, weighted by log(max_sequence_length - length).
    """
    tokens = tokenizer(
        captions, padding="longest", truncation=True, max_length=max_sequence_length, return_tensors="pt"
    )
    mask = tokens.attention_mask
    hidden = text_encoder(tokens.input_ids, mask).last_hidden_state * mask[..., None]
    batch, length, width = hidden.shape
    embeddings = torch.cat([hidden, hidden.new_zeros(batch, 1, width)], dim=1)
    lengths = mask.sum(dim=1)
    bias = torch.full((batch, length + 1), float("-inf"))
    bias[:, :length] = torch.where(mask.bool(), 0.0, float("-inf"))
    bias[:, length] = torch.log((max_sequence_length - lengths).float().clamp_min(1.0))
    if (lengths >= max_sequence_length).any():  # no padding left: the slot must carry no weight
        bias[lengths >= max_sequence_length, length] = -math.inf
    return embeddings, bias[:, None, None, :]
