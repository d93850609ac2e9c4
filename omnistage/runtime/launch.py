"""What a stage subprocess (or Ray actor) is told at start: its stage, settings, model and where to talk."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageSpec, ref_to_path
from omnistage.runtime.messages import INLINE_LIMIT
from omnistage.runtime.stage_board import BoardSeat

_REF_FIELDS = ("input_processor", "chunk_processor", "engine")


def refs_to_paths(values: dict[str, Any]) -> dict[str, Any]:
    """Function objects in a settings dict (engine_args) as import paths."""
    return {k: ref_to_path(v) if callable(v) else v for k, v in values.items()}


def stage_to_dict(stage: StageSpec) -> dict[str, Any]:
    """A StageSpec with its function references as import paths, for a fresh process."""
    data = {f.name: getattr(stage, f.name) for f in dataclasses.fields(stage)}
    for name in _REF_FIELDS:
        data[name] = ref_to_path(data[name])
    data["engine"] = ref_to_path(stage.engine_ref)
    data["kind"] = str(stage.kind)
    data["engine_args"] = refs_to_paths(stage.engine_args)
    return data


class WorkerConfig(msgspec.Struct):
    stage: dict[str, Any]
    deploy: StageDeploy
    model_dir: str | None
    replica: int
    inbox: str
    outbox: str
    owner_pid: int
    output_connector: str
    stream_tensors: bool
    board_seat: BoardSeat | None = None
    host: str = ""  # the address a TCP output connector serves from ("": this host's, see connectors/tcp.py)
    inline_limit: int = INLINE_LIMIT  # payloads up to this many bytes ride in the message frame
    family: str | None = None  # the pipeline family's register(), run before the engine is built

    def stage_spec(self) -> StageSpec:
        data = dict(self.stage)
        data["inputs"] = tuple(data["inputs"])
        return StageSpec(**data)
