"""The real Qwen2.5-Omni processor, assembled so it works without torchvision, and prompt → model inputs.

`AutoProcessor.from_pretrained` cannot build `Qwen2_5OmniProcessor` here: its video slot is checked against
transformers' torchvision-backed video classes, which do not import beside the CPU torch wheel. We build
it from its parts instead (the tokenizer, `WhisperFeatureExtractor`, the PIL image processor) with a
numpy video processor that produces the same patch layout as `Qwen2VLVideoProcessor`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import AutoTokenizer, BatchFeature, Qwen2_5OmniProcessor, WhisperFeatureExtractor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

from omnistage.errors import InvalidRequestError
from omnistage.prompts import ChatPrompt, SpeechPrompt, TextPrompt, as_prompt

SAMPLE_RATE = 16000
DEFAULT_SYSTEM = "You are a helpful assistant."


class FrameVideoProcessor:
    """Qwen2-VL video patches from decoded frames (uint8 `[F, H, W, 3]`), in numpy.

    Same resizing rule (`smart_resize`), normalization and `(t, h, w)` patch order as
    `Qwen2VLVideoProcessor`; frames are padded by repeating the last one to a multiple of the temporal patch.
    """

    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, **config: Any):
        self.patch_size = int(config.get("patch_size", 14))
        self.temporal_patch_size = int(config.get("temporal_patch_size", 2))
        self.merge_size = int(config.get("merge_size", 2))
        self.min_pixels = int(config.get("min_pixels", 128 * 28 * 28))
        self.max_pixels = int(config.get("max_pixels", 768 * 28 * 28))
        self.mean = np.asarray(config.get("image_mean", [0.48145466, 0.4578275, 0.40821073]), np.float32)
        self.std = np.asarray(config.get("image_std", [0.26862954, 0.26130258, 0.27577711]), np.float32)

    def __call__(self, videos: Any, **_: Any) -> BatchFeature:
        patches, grids = [], []
        for video in videos if isinstance(videos, list) else [videos]:
            p, grid = self._patchify(np.asarray(video))
            patches.append(p)
            grids.append(grid)
        return BatchFeature(
            {
                "pixel_values_videos": torch.from_numpy(np.concatenate(patches)),
                "video_grid_thw": torch.tensor(grids),
            }
        )

    def _patchify(self, frames: np.ndarray) -> tuple[np.ndarray, list[int]]:
        if frames.ndim != 4 or frames.shape[-1] != 3:
            raise InvalidRequestError(
                "a video must be uint8 frames [F, H, W, 3]", param="multi_modal_data.video"
            )
        factor = self.patch_size * self.merge_size
        h, w = smart_resize(frames.shape[1], frames.shape[2], factor, self.min_pixels, self.max_pixels)
        resized = np.stack([np.asarray(Image.fromarray(f).resize((w, h), Image.BICUBIC)) for f in frames])
        pixels = ((resized.astype(np.float32) / 255.0 - self.mean) / self.std).transpose(0, 3, 1, 2)
        tps = self.temporal_patch_size
        if len(pixels) % tps:
            pixels = np.concatenate([pixels, np.repeat(pixels[-1:], tps - len(pixels) % tps, axis=0)])
        ps, ms = self.patch_size, self.merge_size
        t, gh, gw = len(pixels) // tps, h // ps, w // ps
        x = pixels.reshape(t, tps, 3, gh // ms, ms, ps, gw // ms, ms, ps)
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return x.reshape(t * gh * gw, 3 * tps * ps * ps), [t, gh, gw]


@functools.cache
def _frame_video_class(base: type) -> type:
    """`base` (a Qwen-Omni processor class) whose video slot takes `FrameVideoProcessor` (the only change)."""

    def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
        if argument_name == "video_processor":
            return type(argument)
        return base.check_argument_for_proper_class(self, argument_name, argument)

    return type(
        f"Frame{base.__name__}", (base,), {"check_argument_for_proper_class": check_argument_for_proper_class}
    )


@functools.lru_cache(maxsize=4)
def load_processor(model_dir: str | Path, processor_class: type = Qwen2_5OmniProcessor) -> Any:
    """The processor of a Qwen-Omni directory (nested `processor_config.json` or the older split files),
    as `processor_class` (Qwen2.5-Omni's, or another family's with the same parts)."""
    model_dir = Path(model_dir)
    sections = _processor_sections(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    fe = {k: v for k, v in sections.get("feature_extractor", {}).items() if not k.endswith("_type")}
    image = {k: v for k, v in sections.get("image_processor", {}).items() if not k.endswith("_type")}
    template = model_dir / "chat_template.jinja"
    return _frame_video_class(processor_class)(
        image_processor=Qwen2VLImageProcessorPil(**image),
        video_processor=FrameVideoProcessor(**sections.get("video_processor", image)),
        feature_extractor=WhisperFeatureExtractor(**fe),
        tokenizer=tokenizer,
        chat_template=template.read_text() if template.exists() else tokenizer.chat_template,
    )


def _processor_sections(model_dir: Path) -> dict[str, dict[str, Any]]:
    nested = model_dir / "processor_config.json"
    if nested.exists():
        data = json.loads(nested.read_text())
        if "feature_extractor" in data or "image_processor" in data:
            return data
    legacy = model_dir / "preprocessor_config.json"
    data = json.loads(legacy.read_text()) if legacy.exists() else {}
    return {"feature_extractor": data, "image_processor": data}


def prompt_to_inputs(processor: Qwen2_5OmniProcessor, prompt: Any) -> BatchFeature:
    """Model inputs for one prompt (omnistage/prompts.py; what `as_prompt` takes is converted first): a
    `TextPrompt`'s token ids, its text (a user message, or used as is where it is `templated`: vLLM's
    `{"prompt": ...}`), a `ChatPrompt`'s messages and media, or a `SpeechPrompt`'s text as a user message."""
    prompt = as_prompt(prompt)
    if isinstance(prompt, TextPrompt) and prompt.token_ids is not None:
        ids = torch.tensor([prompt.token_ids], dtype=torch.long)
        if ids.numel() == 0:
            raise InvalidRequestError("prompt_token_ids must not be empty", param="prompt_token_ids")
        return BatchFeature({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    if isinstance(prompt, TextPrompt) and prompt.templated:
        text = prompt.text
    elif isinstance(prompt, TextPrompt):
        text = _template(processor, [{"role": "user", "content": prompt.text or ""}])
    elif isinstance(prompt, ChatPrompt | SpeechPrompt):
        text = _template(processor, prompt.messages)
    else:
        raise InvalidRequestError(
            f"the thinker takes text, chat or speech prompts, not {type(prompt).__name__}", param="prompt"
        )
    media = _media(prompt)
    kwargs = {k: v for k, v in media.items() if v}
    try:
        return processor(text=text, return_tensors="pt", padding=False, **kwargs)
    except (ValueError, IndexError) as exc:
        raise InvalidRequestError(
            f"prompt does not match its media: {exc}", param="multi_modal_data"
        ) from exc


def _template(processor: Qwen2_5OmniProcessor, messages: list[dict[str, Any]]) -> str:
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _media(prompt: Any) -> dict[str, list[Any]]:
    """Images, audio clips and videos in prompt order: from message parts first, else the prompt's media."""
    found: dict[str, list[Any]] = {"images": [], "audio": [], "videos": []}
    if not isinstance(prompt, ChatPrompt | TextPrompt):
        return found
    for message in prompt.messages if isinstance(prompt, ChatPrompt) else []:
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            for key, slot in (("image", "images"), ("audio", "audio"), ("video", "videos")):
                if part.get(key) is not None:
                    found[slot].append(part[key])
    data = prompt.media()
    for key, slot in (("image", "images"), ("audio", "audio"), ("video", "videos")):
        if not found[slot] and data.get(key):
            found[slot] = list(data[key])
    found["images"] = [_image(x) for x in found["images"]]
    found["audio"] = [_audio(x) for x in found["audio"]]
    return found


def _image(value: Any) -> Image.Image:
    if isinstance(value, Image.Image):
        return value.convert("RGB")
    array = np.asarray(value)
    if array.ndim != 3 or array.shape[-1] != 3 or array.dtype != np.uint8:
        raise InvalidRequestError(
            "an image must be a PIL image or uint8 [H, W, 3]", param="multi_modal_data.image"
        )
    return Image.fromarray(array)


def _audio(value: Any) -> np.ndarray:
    """Mono float32 at 16 kHz; `(samples, sample_rate)` tuples are resampled linearly."""
    rate = SAMPLE_RATE
    if isinstance(value, tuple | list) and len(value) == 2 and np.ndim(value[1]) == 0:  # a list once sent
        value, rate = value
    samples = np.asarray(value, dtype=np.float32)
    if samples.ndim != 1 or samples.size == 0:
        raise InvalidRequestError("audio must be a non-empty mono waveform", param="multi_modal_data.audio")
    if rate != SAMPLE_RATE:
        n = int(round(samples.size * SAMPLE_RATE / rate))
        samples = np.interp(np.linspace(0, samples.size - 1, n), np.arange(samples.size), samples)
    return samples.astype(np.float32)
