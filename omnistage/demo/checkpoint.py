"""Resumable training state: a phase saves its modules and optimizer every few hundred steps, so a run
stopped on a shared machine (or killed to free the cores) continues where it stopped."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


def save_state(path: Path, step: int, states: dict[str, Any]) -> None:
    """Writes `{name: obj.state_dict()}` plus the step atomically (a crash mid-write keeps the old file)."""
    payload = {"step": step, **{name: obj.state_dict() for name, obj in states.items()}}
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    logger.info("saved %s at step %d", path.name, step)


def load_state(path: Path, states: dict[str, Any]) -> int:
    """Restores every named object from `path` and returns the step it was saved at (0 if absent)."""
    if not path.exists():
        return 0
    payload = torch.load(path, map_location="cpu", weights_only=False)
    for name, obj in states.items():
        try:
            obj.load_state_dict(payload[name])
        except (RuntimeError, ValueError, KeyError) as error:
            raise RuntimeError(
                f"{path} does not fit this run's {name} (saved by another model configuration, e.g. the "
                f"demo's earlier architecture): move it away to start over, or pass another --workdir. "
                f"({error})"
            ) from error
    logger.info("resumed %s at step %d", path.name, payload["step"])
    return int(payload["step"])
