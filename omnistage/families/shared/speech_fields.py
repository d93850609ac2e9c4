"""A speech prompt as the TTS families' input processors read it: one mapping of its fields and the family's
options, whichever route (or the Python API) made it."""

from __future__ import annotations

from typing import Any

import msgspec

from omnistage.prompts import SpeechPrompt, prompt_text


def speech_fields(prompt: Any) -> dict[str, Any]:
    """A speech prompt's fields that are set (input, speaker, instructions, language, the uploaded voice as a
    mapping) and its options (by name), as one mapping; a plain text prompt is the input alone."""
    if not isinstance(prompt, SpeechPrompt):
        return {"input": prompt_text(prompt)}
    voice = prompt.uploaded_voice
    fields = {
        "input": prompt.input,
        "speaker": prompt.speaker,
        "instructions": prompt.instructions,
        "language": prompt.language,
        "uploaded_voice": msgspec.structs.asdict(voice) if voice is not None else None,
    }
    return {**{k: v for k, v in fields.items() if v is not None}, **prompt.options}
