"""Deployment: where and how each stage runs. The only configuration users edit (YAML).

Precedence, highest first: per-stage CLI overrides (`--stage-overrides JSON`) > CLI flags > deploy YAML
(a stage entry over the file's pipeline-wide values, a file over its `base_config`) > pipeline defaults.
Unknown keys are errors that name the key and where it came from.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
from pathlib import Path
from typing import Any

import yaml

from omnistage.config.capabilities import Limits
from omnistage.config.pipeline import PipelineSpec, StageKind
from omnistage.errors import ConfigError

PLACEMENTS = ("inline", "process", "ray")
CONNECTORS = ("inline", "shm", "socket", "tcp")
DTYPES = ("float32", "float16", "bfloat16", "auto")


@dataclasses.dataclass(frozen=True)
class CoreSharingSettings:
    """A stage's `core_sharing` block: how it shares CPU cores with the pipeline's other stages
    (runtime/core_sharing.py says what each does)."""

    # An idle stage that receives work waits until its inbox has been quiet this long (at most 20 ms) so a
    # burst of requests starts as one batch; 0 suits a stage that gains nothing from batching.
    burst_settle_ms: float = 3.0
    # Pause this stage's steps while another stage computes a streaming request's first output.
    yield_to_first_outputs: bool = False
    # Torch threads while every other stage replica has been idle for a while; 0 or unset: off.
    solo_threads: int | None = None

    @property
    def needs_board(self) -> bool:
        return self.yield_to_first_outputs or bool(self.solo_threads)


CORE_SHARING_FIELDS = {f.name for f in dataclasses.fields(CoreSharingSettings)}


@dataclasses.dataclass
class StageDeploy:
    """Resolved settings of one stage (every field has its final value)."""

    stage_id: int
    placement: str = "process"
    devices: list[int] | None = None
    num_threads: int | None = None
    replicas: int = 1
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    kv_cache_bytes: int | None = None
    dtype: str = "auto"
    default_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    input_connectors: dict[str, str] = dataclasses.field(default_factory=dict)
    async_chunk: bool | None = None
    engine_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    # How the stage shares CPU cores with the others (runtime/core_sharing.py; off on accelerators).
    core_sharing: CoreSharingSettings = dataclasses.field(default_factory=lambda: CoreSharingSettings())
    # Placement `ray`: what each replica's actor asks the cluster for. Custom resources pin a stage to the
    # nodes that carry them (`ray start --resources '{"talker_node": 1}'`); num_cpus defaults to 1.
    num_cpus: float | None = None
    num_gpus: float | None = None
    resources: dict[str, float] = dataclasses.field(default_factory=dict)
    # Seconds a replica may take from its launch to Ready (process or actor start, engine load); past it
    # start-up fails naming the replica and what it was doing, and nothing it started is left behind.
    startup_timeout_s: float = 600.0
    # A replica whose process or actor dies fails the requests it held and is started again, at most this
    # many times in ten minutes (0: a dead replica stays dead).
    max_restarts: int = 3

    def connector_from(self, stage_id: int, connectors: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """The connector spec for the edge from `stage_id` into this stage."""
        name = self.input_connectors.get(f"from_stage_{stage_id}")
        if name is None:  # a Ray actor may sit on another host: its inputs cross by TCP
            name = {"inline": "inline", "ray": "tcp"}.get(self.placement, "shm")
        return {"type": name} if name in CONNECTORS else connectors[name]


STAGE_FIELDS = {f.name for f in dataclasses.fields(StageDeploy)}
# Dict-valued fields merge key by key across layers instead of being replaced.
MERGED_FIELDS = {"default_params", "input_connectors", "engine_args", "env", "resources", "core_sharing"}
TOP_FIELDS = {"base_config", "async_chunk", "connectors", "stages", "limits"}


@dataclasses.dataclass
class DeploySpec:
    """A whole deployment: per-stage settings plus the connectors edges refer to."""

    stages: dict[int, StageDeploy]
    connectors: dict[str, dict[str, Any]]
    async_chunk: bool
    sources: list[str] = dataclasses.field(default_factory=list)
    # The pipeline's request limits with the YAML's `limits:` block on top (config/capabilities.py).
    limits: Limits = dataclasses.field(default_factory=Limits)

    def stage(self, stage_id: int) -> StageDeploy:
        return self.stages[stage_id]

    def edge_async(self, pipeline: PipelineSpec, consumer: int) -> bool:
        """Whether the edge into `consumer` hands over chunk by chunk."""
        spec = pipeline.stage(consumer)
        flag = self.stages[consumer].async_chunk
        enabled = self.async_chunk if flag is None else flag
        return bool(enabled and spec.chunk_processor is not None)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as exc:
        raise ConfigError(f"deploy config {path} does not exist") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"deploy config {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"deploy config {path} must be a mapping at the top level")
    return data


def _check_stage_keys(entry: dict[str, Any], where: str) -> None:
    unknown = sorted(set(entry) - STAGE_FIELDS)
    moved = [k for k in unknown if k in CORE_SHARING_FIELDS]
    if moved:
        raise ConfigError(f"{where}: {moved[0]!r} is a key of the stage's `core_sharing` block now")
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {where}{_did_you_mean(unknown[0], STAGE_FIELDS)}")


def _did_you_mean(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (allowed keys: {', '.join(sorted(known))})"


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            continue
        if key in MERGED_FIELDS and isinstance(value, dict):
            out[key] = {**out.get(key, {}), **value}
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_deploy_file(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a deploy YAML with its `base_config` chain flattened (overlay wins; stages merge by id)."""
    path = Path(path).resolve()
    if path in _seen:
        raise ConfigError(f"deploy config {path} includes itself through base_config")
    data = _read_yaml(path)
    where = str(path)
    allowed = TOP_FIELDS | (STAGE_FIELDS - {"stage_id"})
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r} in {where}{_did_you_mean(unknown[0], allowed)}")
    stages = data.get("stages") or []
    if not isinstance(stages, list):
        raise ConfigError(f"'stages' in {where} must be a list of stage entries")
    by_id: dict[int, dict[str, Any]] = {}
    for i, entry in enumerate(stages):
        if not isinstance(entry, dict) or "stage_id" not in entry:
            raise ConfigError(f"stages[{i}] in {where} needs a stage_id")
        _check_stage_keys(entry, f"stages[{i}] (stage {entry['stage_id']}) of {where}")
        by_id[int(entry["stage_id"])] = entry
    flat = {k: v for k, v in data.items() if k not in ("stages", "base_config")}
    flat["stages"] = by_id
    flat["sources"] = [where]
    if data.get("base_config"):
        base = load_deploy_file(path.parent / data["base_config"], (*_seen, path))
        merged = {k: v for k, v in base.items() if k not in ("stages", "connectors", "sources")}
        merged.update({k: v for k, v in flat.items() if k not in ("stages", "connectors", "sources")})
        merged["connectors"] = {**base.get("connectors", {}), **flat.get("connectors", {})}
        merged["limits"] = {**(base.get("limits") or {}), **(flat.get("limits") or {})}
        stages_merged = dict(base["stages"])
        for sid, entry in by_id.items():
            stages_merged[sid] = _merge(stages_merged.get(sid, {}), entry)
        merged["stages"] = stages_merged
        merged["sources"] = base["sources"] + [where]
        return merged
    return flat


def parse_stage_overrides(text: str | dict | None) -> dict[int, dict[str, Any]]:
    """`--stage-overrides '{"0": {"max_num_seqs": 4}}'` → {0: {...}}, keys checked."""
    if not text:
        return {}
    try:
        data = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--stage-overrides is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError("--stage-overrides must be a JSON object keyed by stage id")
    out = {}
    for key, entry in data.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"--stage-overrides[{key!r}] must be an object")
        _check_stage_keys(entry, f"--stage-overrides[{key!r}]")
        out[int(key)] = entry
    return out


def _builtin_defaults(kind: StageKind) -> dict[str, Any]:
    if kind is StageKind.DIFFUSION:
        return {"max_num_seqs": 4}
    return {}


def resolve_deploy(
    pipeline: PipelineSpec,
    deploy_config: str | Path | dict | None = None,
    cli: dict[str, Any] | None = None,
    stage_overrides: str | dict | None = None,
) -> DeploySpec:
    """Combine pipeline defaults, the deploy YAML (or the pipeline's bundled one), CLI flags and per-stage
    CLI overrides into one `DeploySpec`."""
    if deploy_config is None and pipeline.default_deploy:
        deploy_config = pipeline.default_deploy
    if isinstance(deploy_config, dict):
        raw = {"stages": {}, "sources": ["<dict>"], **copy.deepcopy(deploy_config)}
        if isinstance(raw["stages"], list):
            for entry in raw["stages"]:
                _check_stage_keys(entry, "deploy dict")
            raw["stages"] = {int(e["stage_id"]): e for e in raw["stages"]}
        unknown = sorted(set(raw) - TOP_FIELDS - {"sources"} - (STAGE_FIELDS - {"stage_id"}))
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r} in deploy config")
    elif deploy_config is not None:
        raw = load_deploy_file(deploy_config)
    else:
        raw = {"stages": {}, "sources": []}

    cli = {k: v for k, v in (cli or {}).items() if v is not None}
    _check_stage_keys(cli, "CLI flags")
    per_stage = parse_stage_overrides(stage_overrides)
    ids = {s.stage_id for s in pipeline.stages}
    for sid in list(raw["stages"]) + list(per_stage):
        if sid not in ids:
            raise ConfigError(f"deploy refers to stage {sid}, but {pipeline.name!r} has stages {sorted(ids)}")

    connectors = raw.get("connectors") or {}
    for name, spec in connectors.items():
        if not isinstance(spec, dict) or spec.get("type") not in CONNECTORS:
            raise ConfigError(f"connector {name!r} needs type in {CONNECTORS}")
    pipeline_wide = {k: v for k, v in raw.items() if k in STAGE_FIELDS}
    stages = {}
    for spec in pipeline.stages:
        layer = {"stage_id": spec.stage_id, **_builtin_defaults(spec.kind)}
        layer = _merge(
            layer, {"engine_args": dict(spec.engine_args), "default_params": dict(spec.default_params)}
        )
        for over in (
            pipeline_wide,
            raw["stages"].get(spec.stage_id, {}),
            cli,
            per_stage.get(spec.stage_id, {}),
        ):
            layer = _merge(layer, over)
        layer["stage_id"] = spec.stage_id
        stages[spec.stage_id] = _validated(StageDeploy(**layer), connectors)
    async_chunk = raw.get("async_chunk", True)
    if len(pipeline.stages) == 1:
        async_chunk = False
    where = f"limits of {', '.join(raw.get('sources') or ['the deploy config'])}"
    deploy = DeploySpec(
        stages=stages,
        connectors=connectors,
        async_chunk=bool(async_chunk),
        sources=raw.get("sources", []),
        limits=pipeline.capabilities.limits.replaced(raw.get("limits"), where),
    )
    for spec in pipeline.stages:
        if deploy.edge_async(pipeline, spec.stage_id) and len(spec.inputs) != 1:
            raise ConfigError(
                f"stage {spec.stage_id} ({spec.name}): async-chunk handoff needs exactly one input"
            )
    return deploy


def _core_sharing(value: Any, where: str) -> CoreSharingSettings:
    """The `core_sharing` block (a mapping, merged across layers) as checked settings."""
    if isinstance(value, CoreSharingSettings):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: core_sharing must be a mapping")
    unknown = sorted(set(value) - CORE_SHARING_FIELDS)
    if unknown:
        hint = _did_you_mean(unknown[0], CORE_SHARING_FIELDS)
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} in core_sharing{hint}")
    sharing = CoreSharingSettings(**value)
    if not isinstance(sharing.yield_to_first_outputs, bool):
        raise ConfigError(f"{where}: core_sharing.yield_to_first_outputs must be true or false")
    solo = sharing.solo_threads
    if solo is not None and (isinstance(solo, bool) or not isinstance(solo, int) or solo < 0):
        raise ConfigError(f"{where}: core_sharing.solo_threads must be a non-negative integer (0: off)")
    settle = sharing.burst_settle_ms
    if isinstance(settle, bool) or not isinstance(settle, int | float) or not 0 <= settle <= 20:
        message = "core_sharing.burst_settle_ms must be a number of milliseconds in [0, 20]"
        raise ConfigError(f"{where}: {message}")
    return sharing


def _validated(stage: StageDeploy, connectors: dict[str, dict[str, Any]]) -> StageDeploy:
    where = f"stage {stage.stage_id}"
    if stage.placement not in PLACEMENTS:
        raise ConfigError(f"{where}: placement must be one of {PLACEMENTS}, got {stage.placement!r}")
    if stage.dtype not in DTYPES:
        raise ConfigError(f"{where}: dtype must be one of {DTYPES}, got {stage.dtype!r}")
    for field in ("replicas", "max_num_seqs", "max_num_batched_tokens"):
        if not isinstance(getattr(stage, field), int) or getattr(stage, field) < 1:
            raise ConfigError(f"{where}: {field} must be a positive integer")
    stage.core_sharing = _core_sharing(stage.core_sharing, where)
    if (
        isinstance(stage.max_restarts, bool)
        or not isinstance(stage.max_restarts, int)
        or stage.max_restarts < 0
    ):
        raise ConfigError(f"{where}: max_restarts must be a non-negative integer")
    timeout = stage.startup_timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ConfigError(f"{where}: startup_timeout_s must be a positive number of seconds")
    if stage.placement == "inline" and stage.replicas != 1:
        raise ConfigError(f"{where}: inline placement runs exactly one replica")
    for field in ("num_cpus", "num_gpus"):
        value = getattr(stage, field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise ConfigError(f"{where}: {field} must be a non-negative number")
    if not isinstance(stage.resources, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in stage.resources.values()
    ):
        raise ConfigError(f"{where}: resources must map resource names to non-negative numbers")
    if isinstance(stage.devices, str):
        stage.devices = [int(d) for d in stage.devices.split(",") if d.strip()]
    for key, name in stage.input_connectors.items():
        if not key.startswith("from_stage_"):
            raise ConfigError(f"{where}: input_connectors keys look like from_stage_<id>, got {key!r}")
        if name not in CONNECTORS and name not in connectors:
            raise ConfigError(f"{where}: connector {name!r} is not defined under 'connectors'")
    return stage
