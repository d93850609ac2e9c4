"""VibeVoice's prompt: a script of speakers' lines and their voices, as its processor lays them out.

The layout is the model's own (the released processor's): a system line, then under " Voice input:" each
cloned speaker's clip (" Speaker k:", the audio-start marker, one placeholder a latent frame, the audio-end
marker), under " Text input:" each line of the script (" Speaker k: text"), and " Speech output:" with the
audio-start marker the LM continues. Clips are encoded by the model's own `get_audio_features` (its feature
extractor's loudness normalisation first; σ-VAE noise drawn from the request's seed, as `generate` draws it
from a seeded global RNG) and their projected latents replace the placeholders' embeddings.

A script is lines of "Speaker N: text"; text before any such line is Speaker 0's, a line without the prefix
continues the line before.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError

SYSTEM = (
    " Transform the text provided by various speakers into speech output, utilizing the distinct voice of "
    "each respective speaker.\n"
)
MAX_SPEAKERS = 4
_SPEAKER = re.compile(r"^\s*Speaker\s+(\d+)\s*:\s*(.*)$", re.IGNORECASE)


def parse_script(text: str) -> list[tuple[int, str]]:
    """`text` → [(speaker, line)]; 400 naming `input` for an empty script or a speaker past the fourth."""
    lines: list[tuple[int, str]] = []
    for raw in text.splitlines():
        match = _SPEAKER.match(raw)
        if match:
            speaker, line = int(match.group(1)), match.group(2).strip()
            if speaker >= MAX_SPEAKERS:
                raise InvalidRequestError(
                    f"input: VibeVoice speaks Speaker 0 to Speaker {MAX_SPEAKERS - 1}, not Speaker {speaker}",
                    param="input",
                )
            lines.append((speaker, line))
        elif raw.strip():
            if lines:
                lines[-1] = (lines[-1][0], f"{lines[-1][1]} {raw.strip()}".strip())
            else:
                lines.append((0, raw.strip()))
    lines = [(s, t) for s, t in lines if t]
    if not lines:
        raise InvalidRequestError("input: Input text cannot be empty", param="input")
    return lines


def prompt_ids(
    tokenizer: Any, lines: list[tuple[int, str]], clip_frames: dict[int, int], ids: dict[str, int]
) -> list[int]:
    """The prompt's token ids; each cloned speaker k's clip as `clip_frames[k]` placeholders."""

    def enc(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    out = enc(SYSTEM)
    if clip_frames:
        out += enc(" Voice input:\n")
        for speaker in sorted(clip_frames):
            out += enc(f" Speaker {speaker}:")
            out += [ids["bos"], *[ids["token"]] * clip_frames[speaker], ids["end"]] + enc("\n")
    out += enc(" Text input:\n")
    for speaker, line in lines:
        out += enc(f" Speaker {speaker}: {line}\n")
    return out + enc(" Speech output:\n") + [ids["bos"]]


@torch.inference_mode()
def clip_features(model: Any, clips: list[np.ndarray], seed: int) -> list[torch.Tensor]:
    """Mono 24 kHz clips → each one's projected latent frames [n, H], by the model's `get_audio_features`
    on the batch its feature extractor makes (σ-VAE noise from `seed`, the global RNG left as it was)."""
    from transformers import VibeVoiceAcousticTokenizerFeatureExtractor

    extractor = VibeVoiceAcousticTokenizerFeatureExtractor.from_pretrained(str(model.root_dir))
    batch = extractor(clips, sampling_rate=model.sample_rate, return_tensors="pt")
    vibe = model.vibe
    device, dtype = vibe.device, vibe.dtype
    values = batch["input_values"].to(device, dtype)
    mask = batch["padding_mask"].to(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        feats = vibe.model.get_audio_features(values, mask, sample=True).pooler_output
    hop = model.hop
    counts = [int(np.ceil(int(m.sum()) / hop)) for m in batch["padding_mask"]]
    return list(feats.split(counts))


@torch.inference_mode()
def speech_prompt(
    model: Any,
    text: str,
    params: Any,
    clips: dict[int, np.ndarray] | None = None,
    guidance_scale: float | None = None,
    diffusion_steps: int | None = None,
) -> tuple[list[int], Any]:
    """The LM's prompt for `text` (a script) with the speakers' clips (`clips[k]`: Speaker k's, mono at
    the model's rate): its token ids and ARInputs (embeddings with the clips' latents in place, the
    request's `VibeState`: the checkpoint's guidance scale and step count unless given)."""
    from omnistage.families.vibevoice.decoder import default_guidance, new_state
    from omnistage.stages.ar.ar_inputs import ARInputs

    lines = parse_script(text)
    scale, steps = default_guidance(model)
    state = new_state(params, scale if guidance_scale is None else guidance_scale, diffusion_steps or steps)
    speakers = sorted(clips or {})
    feats = clip_features(model, [clips[k] for k in speakers], state.seed) if speakers else []
    frames = {k: len(f) for k, f in zip(speakers, feats, strict=True)}
    ids = prompt_ids(model.tokenizer, lines, frames, model.ids)
    device = next(model.embed.parameters()).device
    embeds = model.embed(torch.tensor(ids, device=device))
    if feats:
        where = torch.tensor(ids, device=device) == model.ids["token"]
        embeds[where] = torch.cat(feats).to(embeds.dtype)
    return ids, ARInputs(inputs_embeds=embeds, extension=state)
