"""Whisper's audio encoder as a generation-engine generator: log-mel features and the encoder, batched.

One input frame is one audio segment (<= 30 s at 16 kHz, zero-padded to the longest segment of its
request); its output is the encoder's `max_source_positions` rows (1500), so a request of k segments
gets k x 1500 rows. Features come from transformers' `WhisperFeatureExtractor` (its torch path), which
pads every segment to 30 s as `generate`'s callers do.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

SAMPLE_RATE = 16000


class WhisperEncoderGenerator:
    sample_rate = None

    def __init__(self, model_dir: str, dtype: torch.dtype, device: str):
        from transformers import GenerationConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

        model = WhisperForConditionalGeneration.from_pretrained(
            model_dir, dtype=dtype, attn_implementation="sdpa"
        )
        self.encoder = model.model.encoder.to(device).eval()
        self.features = WhisperFeatureExtractor.from_pretrained(model_dir)
        self.generation_config = GenerationConfig.from_pretrained(model_dir)
        self.dtype, self.device = dtype, device
        self.outputs_per_frame = model.config.max_source_positions
        self.chunk_samples = self.features.n_samples  # 30 s

    def run(self, batch: Any) -> Any:
        """The engine's call (stages/generation: one unit of work)."""
        from omnistage.stages.generation.engine import one_unit

        return one_unit(lambda: self.generate(batch.windows, batch.params))

    def generate(self, windows: list[torch.Tensor], params: list[Any]) -> list[torch.Tensor]:
        """windows: [k, samples] per request (zero-padded segments) → [k * 1500, d_model] per request."""
        segments = [row.numpy() for window in windows for row in window]
        feats = self.features(
            segments, sampling_rate=SAMPLE_RATE, return_tensors="pt", device="cpu"
        ).input_features
        with torch.inference_mode():
            hidden = self.encoder(feats.to(self.device, self.dtype)).last_hidden_state
        out, start = [], 0
        for window in windows:
            out.append(hidden[start : start + len(window)].reshape(-1, hidden.shape[-1]))
            start += len(window)
        return out


def create_generator(ctx: Any) -> WhisperEncoderGenerator:
    """engine_args.generator of the encoder stage."""
    from omnistage.stages.ar.loader import resolve_dtype

    dtype = resolve_dtype(ctx.deploy.dtype, ctx.model_dir, ctx.device)
    return WhisperEncoderGenerator(ctx.model_dir, dtype, ctx.device)


def as_segments(segments: list[np.ndarray]) -> torch.Tensor:
    """[k, longest] float32: the segments zero-padded to one width (the feature extractor pads to 30 s
    with zeros anyway, so the padding changes nothing)."""
    width = max(len(s) for s in segments)
    out = torch.zeros(len(segments), width)
    for i, s in enumerate(segments):
        out[i, : len(s)] = torch.from_numpy(np.asarray(s, dtype=np.float32))
    return out
