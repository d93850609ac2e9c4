"""Qwen2-VL's processor for images only: what the Qwen-Image-Edit pipelines' `processor` component needs.

Why it exists: transformers 5.25 cannot build nor load `Qwen2VLProcessor` without torchvision (which breaks
beside this torch, so it is not installed). `ProcessorMixin.__init__` checks the class of every attribute its
`__init__` names, `video_processor` too even when it is None, and that check looks the video processors up in
`VIDEO_PROCESSOR_MAPPING`, which without torchvision has no `_extra_content` (AttributeError). The edit
pipelines never pass videos, so this subclass names only `image_processor` and `tokenizer` in `__init__`:
transformers then neither checks nor saves nor loads a video processor, and everything else (the prompt's
image placeholders expanded to the image's grid, `Qwen2VLImageProcessorPil`'s resizing and patches) is
transformers' own `Qwen2VLProcessor` code. It saves and loads through `save_pretrained` / `from_pretrained`;
a pipeline saved with it names this class in `model_index.json`, and diffusers loads it from here once this
module is imported (the family's `register()` imports it; diffusers never imports a module a checkpoint
names).
"""

from __future__ import annotations

import transformers
from transformers import Qwen2VLProcessor

# diffusers loads a component of a custom module with the loading method of the base class it finds *by name
# in that module* (pipeline_loading_utils.get_class_obj_and_candidates): ProcessorMixin's from_pretrained.
ProcessorMixin = transformers.ProcessorMixin


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """`Qwen2VLProcessor` without a video processor (images and text only)."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # ProcessorMixin pairs positional sub-processors with `get_attributes()` (read from this signature:
        # image_processor, tokenizer), so the None Qwen2VLProcessor passes for the video processor is dropped.
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)
