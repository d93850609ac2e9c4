"""The demo's voice directories: `hibari-en` (the bundled hibari voice) and the spoken chat model.

Both are small descriptions in the cache (the voice's weights stay inside the `hibari-tts` wheel): the
voice is a config.json naming the package and voice; the spoken chat model, named like its LLM so
`"model": "smollm2-135m-instruct"` keeps working, holds links to the LLM's directory and the voice's.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.cache import cached_dir

VOICE_NAME = "hibari-en"
VOICE_VERSION = "1"


def _write_voice(root: Path) -> None:
    from omnistage.families.hibari.voice import BUNDLED_VOICE, PACKAGE, PACKAGE_VERSION

    out = root / VOICE_NAME
    out.mkdir(parents=True)
    config = {
        "model_type": "hibari_tts",
        "architectures": ["HibariTTS"],
        "package": f"{PACKAGE}=={PACKAGE_VERSION}",
        "voice": BUNDLED_VOICE,
        "sample_rate": 24000,
        "language": "en-US",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def voice_dir() -> Path:
    """The demo voice's directory (served as `hibari-en`)."""
    return cached_dir("voice", VOICE_VERSION, _write_voice) / VOICE_NAME


def spoken_chat_dir(llm_dir: Path) -> Path:
    """A spoken chat model over `llm_dir` and the demo voice, named like the LLM."""

    def build(root: Path) -> None:
        out = root / llm_dir.name
        out.mkdir(parents=True)
        (out / "llm").symlink_to(llm_dir.resolve(), target_is_directory=True)
        (out / "voice").symlink_to(voice_dir().resolve(), target_is_directory=True)
        (out / "config.json").write_text(json.dumps({"model_type": "spoken_chat"}, indent=2) + "\n")

    key = f"spoken-{llm_dir.parent.name}-{llm_dir.name}"
    return cached_dir(key, VOICE_VERSION, build) / llm_dir.name
