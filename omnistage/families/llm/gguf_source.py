"""GGUF files as a model source: `omnistage serve model.gguf` (or a directory holding one GGUF and no
config) serves the standard directory the file converts to, which then resolves like any other checkpoint
(a llama GGUF becomes a `LlamaForCausalLM` directory, served by the LLM pipeline)."""

from __future__ import annotations

from pathlib import Path

from omnistage.families.llm.gguf import converted_dir, find_gguf


def gguf_source(path: Path) -> Path | None:
    gguf = find_gguf(path)
    return None if gguf is None else converted_dir(gguf)
