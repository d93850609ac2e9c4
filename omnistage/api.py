"""Python entry points: `AsyncOmni` (async, streaming) and `Omni` (sync, offline batches).

Both resolve the model to a pipeline, merge deployment settings, start every stage through the
orchestrator (which runs on its own thread) and submit requests to it. Validation happens here, in the
caller's thread, so bad input raises before anything is queued.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from omnistage.config.capabilities import Capabilities
from omnistage.config.deploy import DeploySpec, resolve_deploy
from omnistage.config.pipeline import PipelineSpec, register_family
from omnistage.errors import ConfigError, InvalidRequestError, OverloadedError
from omnistage.families.resolve import resolve_pipeline
from omnistage.outputs import OmniRequestOutput
from omnistage.params import apply_constraints, layer_params, params_class
from omnistage.prompts import as_prompt
from omnistage.runtime.orchestrator import Orchestrator
from omnistage.runtime.request_state import RequestState
from omnistage.stages.engine_args import check_engine_args

logger = logging.getLogger(__name__)


class StageParamsResolver:
    """A request's params, stage by stage: pipeline defaults < deploy YAML < request (`layer_params`),
    with each stage's sampling constraints on top. Apart from the runtime, so the rule can be checked
    without starting any stage."""

    def __init__(self, pipeline: PipelineSpec, deploy: DeploySpec):
        self.pipeline = pipeline
        self.deploy = deploy
        self._defaults = {s.stage_id: self._default_params(s.stage_id) for s in pipeline.stages}

    @property
    def capabilities(self) -> Capabilities:
        """What this runtime serves: the pipeline's declaration with the deploy's limits."""
        return dataclasses.replace(self.pipeline.capabilities, limits=self.deploy.limits)

    def default_fields(self, sid: int) -> dict[str, Any]:
        """The fields stage `sid`'s defaults name (pipeline defaults < deploy YAML), before the request."""
        return dict(self.deploy.stage(sid).default_params)

    def _default_params(self, sid: int) -> Any:
        spec = self.pipeline.stage(sid)
        try:
            return self._layered(sid, None)
        except InvalidRequestError as exc:
            raise ConfigError(f"default params of stage {sid} ({spec.name}): {exc.message}") from exc

    def _layered(self, sid: int, request: Any) -> Any:
        """Defaults < request (`layer_params`), then the model's sampling constraints on top."""
        cls = params_class(self.pipeline.stage(sid).kind)
        params = layer_params(cls, self.deploy.stage(sid).default_params, request)
        constraints = self.pipeline.stage(sid).sampling_constraints
        return apply_constraints(params, constraints) if constraints else params

    def resolve(self, params: Any) -> dict[int, Any]:
        """One params object (for the first stage that takes its type) or one per stage (a params object, a
        dict of fields or None), each layered over that stage's defaults."""
        stages = self.pipeline.stages
        chosen = dict(self._defaults)
        if params is None:
            return chosen
        if isinstance(params, Sequence) and not isinstance(params, str | bytes):
            if len(params) != len(stages):
                raise InvalidRequestError(
                    f"params has {len(params)} entries but {self.pipeline.name!r} has {len(stages)} stages",
                    param="params",
                )
            for spec, value in zip(stages, params, strict=True):
                if value is not None:
                    chosen[spec.stage_id] = self._check_type(spec.stage_id, value)
            return chosen
        for spec in stages:
            if isinstance(params, params_class(spec.kind)):
                chosen[spec.stage_id] = self._layered(spec.stage_id, params)
                return chosen
        kinds = ", ".join(f"{s.name}: {params_class(s.kind).__name__}" for s in stages)
        raise InvalidRequestError(
            f"no stage takes {type(params).__name__} (stages take {kinds})", param="params"
        )

    def _check_type(self, sid: int, value: Any) -> Any:
        spec = self.pipeline.stage(sid)
        cls = params_class(spec.kind)
        if not isinstance(value, dict | cls):
            raise InvalidRequestError(
                f"stage {sid} ({spec.name}) takes {cls.__name__}, got {type(value).__name__}", param="params"
            )
        try:
            return self._layered(sid, value)
        except InvalidRequestError as exc:
            where = f"params for stage {sid} ({spec.name})"
            raise InvalidRequestError(f"{where}: {exc.message}", param=exc.param) from exc


class _OmniBase:
    def __init__(
        self,
        model: str | Path | PipelineSpec,
        deploy_config: str | Path | dict | None = None,
        *,
        model_dir: str | Path | None = None,
        stage_overrides: str | dict | None = None,
        max_queued_requests: int = 1024,
        startup_timeout: float | None = None,
        **cli_flags: Any,
    ):
        hub_id = None
        if isinstance(model, PipelineSpec):
            self.pipeline = model
            self.model_dir = str(model_dir) if model_dir else None
            register_family(model.family)  # its engine registrations, for stages in this process
        else:
            self.pipeline, info = resolve_pipeline(model)
            self.model_dir = str(info.path)
            hub_id = info.hub_id
        # a hub id serves under the id (its snapshot directory is named by a commit hash)
        self.model_name = hub_id or (Path(self.model_dir).name if self.model_dir else self.pipeline.name)
        if startup_timeout is not None:  # every stage's deadline, as the --startup-timeout-s flag sets it
            cli_flags["startup_timeout_s"] = startup_timeout
        self.deploy = resolve_deploy(self.pipeline, deploy_config, cli_flags, stage_overrides)
        for spec in self.pipeline.stages:  # typed, and every function they name loads: before any start
            check_engine_args(spec, self.deploy.stage(spec.stage_id).engine_args)
        self.max_queued_requests = max_queued_requests
        self.resolver = StageParamsResolver(self.pipeline, self.deploy)
        self._inflight = 0
        self._inflight_ids: set[str] = set()
        self._lock = threading.Lock()
        self.orchestrator = Orchestrator(self.pipeline, self.deploy, self.model_dir)
        self.orchestrator.start()

    # ---- parameters ----------------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        return self.resolver.capabilities

    def default_fields(self, sid: int) -> dict[str, Any]:
        return self.resolver.default_fields(sid)

    def resolve_params(self, params: Any) -> dict[int, Any]:
        return self.resolver.resolve(params)

    # ---- submission ----------------------------------------------------------------------------------
    def _submit(self, prompt: Any, params: Any, request_id: str | None, modalities: Any, sink: Any) -> str:
        if prompt is None:
            raise InvalidRequestError("prompt is required", param="prompt")
        prompt = as_prompt(prompt)  # typed from here on (omnistage/prompts.py)
        resolved = self.resolve_params(params)
        needed, finals = self.pipeline.stages_for(modalities)
        rid = request_id or uuid.uuid4().hex
        with self._lock:
            if rid in self._inflight_ids:
                raise InvalidRequestError(f"request id {rid!r} is already in flight", param="request_id")
            if self._inflight >= self.max_queued_requests:
                raise OverloadedError(
                    f"{self._inflight} requests in flight (limit {self.max_queued_requests})"
                )
            self._inflight += 1
            self._inflight_ids.add(rid)

        def deliver(out: OmniRequestOutput) -> None:
            if out.finished:
                with self._lock:
                    self._inflight -= 1
                    self._inflight_ids.discard(rid)
            sink(out)

        state = RequestState(
            rid, prompt, resolved, needed, finals, self.pipeline, deliver, self.orchestrator.materialize
        )
        self.orchestrator.call_soon(self.orchestrator.submit, state)
        return rid

    @property
    def num_inflight(self) -> int:
        return self._inflight

    # ---- control -------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self.orchestrator.health()

    def _close(self) -> None:
        self.orchestrator.close()


class AsyncOmni(_OmniBase):
    """Serve a pipeline from asyncio code: `async for out in omni.generate(prompt): ...`."""

    async def generate(
        self,
        prompt: Any,
        params: Any = None,
        request_id: str | None = None,
        modalities: Sequence[str] | None = None,
    ) -> AsyncIterator[OmniRequestOutput]:
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[OmniRequestOutput] = asyncio.Queue()
        rid = self._submit(
            prompt,
            params,
            request_id,
            modalities,
            lambda out: loop.call_soon_threadsafe(outputs.put_nowait, out),
        )
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                finished = out.finished
                yield out
        finally:
            if not finished:  # the caller stopped listening (disconnect, cancel): stop the work everywhere
                self.orchestrator.call_soon(self.orchestrator.abort, rid)

    async def abort(self, request_id: str) -> None:
        self.orchestrator.call_soon(self.orchestrator.abort, request_id)

    async def stats(self) -> dict[str, Any]:
        orch = self.orchestrator
        stages = await asyncio.wrap_future(orch.run(orch.call("stats")))
        return {
            "stages": stages,
            "edges": dict(orch.edge_stats),
            "payloads": dict(orch.payload_stats),
            "requests": {"in_flight": self._inflight, "tracked": len(orch.requests)},
        }

    async def sleep(self, level: int = 1, stage_ids: list[int] | None = None) -> list[dict[str, Any]]:
        orch = self.orchestrator
        return await asyncio.wrap_future(orch.run(orch.call("sleep", [level], stage_ids)))

    async def wake_up(self, stage_ids: list[int] | None = None) -> list[dict[str, Any]]:
        orch = self.orchestrator
        return await asyncio.wrap_future(orch.run(orch.call("wake_up", [], stage_ids)))

    async def shutdown(self) -> None:
        await asyncio.to_thread(self._close)

    async def __aenter__(self) -> AsyncOmni:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()


class Omni(_OmniBase):
    """Offline batches: `Omni(model).generate(prompts, params)` returns one final output per prompt."""

    def generate(
        self, prompts: Any, params: Any = None, modalities: Sequence[str] | None = None, use_tqdm: bool = True
    ) -> list[OmniRequestOutput]:
        single = not isinstance(prompts, list)
        prompts = [prompts] if single else prompts
        done: queue.SimpleQueue[OmniRequestOutput] = queue.SimpleQueue()
        order = []
        for prompt in prompts:
            order.append(
                self._submit(
                    prompt, params, None, modalities, lambda out: done.put(out) if out.finished else None
                )
            )
        results: dict[str, OmniRequestOutput] = {}
        with tqdm(total=len(order), disable=not use_tqdm, desc="omnistage", unit="req") as bar:
            while len(results) < len(order):
                out = done.get()
                results[out.request_id] = out
                bar.update(1)
        return [results[rid] for rid in order]

    def stats(self) -> dict[str, Any]:
        orch = self.orchestrator
        return {"stages": orch.run(orch.call("stats")).result(), "edges": dict(orch.edge_stats)}

    def shutdown(self) -> None:
        self._close()

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
