"""The 12 Hz codec's encoder (`speech_tokenizer/`, `encoder.*`): a 24 kHz reference clip → its [T, 16] codes,
which Base's in-context cloning puts in the talker's prompt (and before the generated codes when decoding).

The reference's encoder is transformers' own `MimiModel` with the decoder half dropped; this is the same
class's encoder parts from transformers 5.24 (`MimiEncoderModel` + `MimiSplitResidualVectorQuantizer`,
whose weight names moved from `encoder.*` to `encoder_seanet.*`). Tests prove the codes equal the reference's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from omnistage.families.qwen3_tts.codec import SUBFOLDER


class CodecEncoder(nn.Module):
    def __init__(self, config: dict, valid_quantizers: int, downsample: int):
        super().__init__()
        from transformers import MimiConfig
        from transformers.models.mimi.modeling_mimi import MimiEncoderModel, MimiSplitResidualVectorQuantizer

        mimi = MimiConfig(**{k: v for k, v in config.items() if k != "model_type"})
        self.encoder = MimiEncoderModel(mimi.encoder_config)
        self.quantizer = MimiSplitResidualVectorQuantizer(mimi)
        self.valid_quantizers = valid_quantizers
        self.downsample = downsample

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """[samples] float waveform at 24 kHz → codes [ceil(samples / 1920), 16] (long)."""
        device = next(self.parameters()).device
        latents = self.encoder(audio.float().to(device)[None, None]).latents
        codes = self.quantizer.encode(latents).transpose(0, 1)[0, : self.valid_quantizers]  # [16, T']
        return codes[:, : math.ceil(audio.shape[-1] / self.downsample)].T.long().cpu()


def load_encoder(model_dir: str, device: str = "cpu") -> CodecEncoder:
    """The encoder of `model_dir`/speech_tokenizer, fp32 (it runs once per uploaded voice)."""
    from safetensors.torch import load_file

    path = Path(model_dir) / SUBFOLDER
    cfg = json.loads((path / "config.json").read_text())
    valid, rate = cfg["encoder_valid_num_quantizers"], cfg["encode_downsample_rate"]
    model = CodecEncoder(cfg["encoder_config"], valid, rate)
    renames = {"encoder.encoder.": "encoder.encoder_seanet.", "encoder.quantizer.": "quantizer."}
    state = {}
    for key, value in load_file(str(path / "model.safetensors")).items():
        if not key.startswith("encoder."):
            continue
        for old, new in renames.items():
            if key.startswith(old):
                key = new + key.removeprefix(old)
                break
        state[key] = value
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError(f"{path}: encoder weights do not match (missing {missing}, extra {unexpected})")
    return model.to(device, torch.float32).eval()
