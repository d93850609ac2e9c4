"""The orchestrator: request state and routing over the stage graph.

It runs on its own thread and event loop, owns every stage client, and routes *control*: which stage
gets a request when, with which upstream results (full handoff) or chunks (async chunk). Bulk tensors
stay in connectors and travel as references; the orchestrator's per-request ledger releases them when
the request ends, whichever way it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from omnistage.config.deploy import DeploySpec
from omnistage.config.pipeline import PipelineSpec, StageSpec
from omnistage.connectors.base import Payload
from omnistage.connectors.shm import ShmConnector, live_segments, sweep_stale_segments
from omnistage.connectors.shm import release as release_segment
from omnistage.connectors.tcp import drop, fetch, is_tcp_key
from omnistage.errors import OmniError, StageDeadError, StageError, StartupTimeoutError
from omnistage.outputs import OmniRequestOutput, StageOutput, StageResult
from omnistage.runtime.messages import (
    Abort,
    Call,
    CallResult,
    ChunkInput,
    Codec,
    FromWorker,
    Outputs,
    Ready,
    StartRequest,
    StartupFailed,
    Unreadable,
    iter_payloads,
    salvage,
)
from omnistage.runtime.ray_client import connect_ray, driver_ip, import_ray
from omnistage.runtime.request_state import RequestState, RequestStatus
from omnistage.runtime.stage_board import BoardSeat, StageBoard
from omnistage.runtime.stage_client import InlineStageClient, StageClient
from omnistage.runtime.stage_pool import StagePool
from omnistage.runtime.transport import Transport

logger = logging.getLogger(__name__)
RESTART_WINDOW_S = 600.0  # a replica is restarted at most its deploy's max_restarts times in this window


def release(key: str) -> None:
    """Free a payload wherever it waits: a shared-memory segment here, or its producer's TCP store."""
    if is_tcp_key(key):
        drop(key)
    else:
        release_segment(key)


class Orchestrator:
    def __init__(
        self,
        pipeline: PipelineSpec,
        deploy: DeploySpec,
        model_dir: str | None,
    ):
        self.pipeline = pipeline
        self.deploy = deploy
        self.model_dir = model_dir
        self.requests: dict[str, RequestState] = {}
        self.pools: dict[int, StagePool] = {}
        self.reader = ShmConnector()
        self.edge_stats: dict[str, dict[str, float]] = {}
        self.payload_stats = {"received": 0, "bytes": 0}
        self._calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._startup_errors: list[str] = []
        self._closed = False
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="orchestrator", daemon=True)
        self.ipc_dir = Path(tempfile.mkdtemp(prefix="omnistage-"))
        self.zmq = zmq.Context()
        self._tasks: list[asyncio.Task] = []
        self._restarts: dict[tuple[int, int], list[float]] = {}  # when each replica was last restarted
        self._holding: list[StageClient] | None = None  # clients holding messages (see _on_message)
        self.board: StageBoard | None = None  # where stages yield to first outputs or take idle cores
        self._ray_connected = False  # this orchestrator joined a Ray cluster, and leaves it at close

    # ---- lifecycle (called from the frontend thread) -------------------------------------------------
    def start(self) -> None:
        sweep_stale_segments()
        self.thread.start()
        try:
            self.run(self._start()).result()
        except BaseException:
            self.close()
            raise

    def run(self, coro: Any) -> Future:
        """Run a coroutine on the orchestrator loop from another thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, fn: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.thread.is_alive():
            with contextlib.suppress(Exception):
                self.run(self._shutdown()).result(timeout=60)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        else:
            for client in self._clients():
                with contextlib.suppress(Exception):
                    client.close()
        if self.board is not None:
            self.board.unlink()
        for key in live_segments(os.getpid()):
            release(key)
        if self._ray_connected:
            import_ray().shutdown()
        self.zmq.term()
        shutil.rmtree(self.ipc_dir, ignore_errors=True)

    # ---- start-up --------------------------------------------------------------------------------------
    async def _start(self) -> None:
        self._changed = asyncio.Event()
        self.outbox = f"ipc://{self.ipc_dir}/out"
        self.pull = zmq.asyncio.Context.shadow(self.zmq).socket(zmq.PULL)
        self.pull.setsockopt(zmq.RCVHWM, 0)
        self.pull.bind(self.outbox)
        if any(self.deploy.stage(spec.stage_id).placement == "ray" for spec in self.pipeline.stages):
            self._ray_connected = connect_ray()
            self.pull.bind(f"tcp://{driver_ip()}:*")  # the same PULL socket: actors send here
            self.ray_outbox = self.pull.getsockopt_string(zmq.LAST_ENDPOINT)
        self.codec = Codec(FromWorker, lazy=True)
        self.transport = Transport(
            self.pipeline,
            self.deploy,
            self.model_dir,
            ipc_dir=self.ipc_dir,
            zmq_context=self.zmq,
            outbox=self.outbox,
            ray_outbox=getattr(self, "ray_outbox", None),
            on_message=self._on_message,
            on_message_threadsafe=lambda m: self.loop.call_soon_threadsafe(self._on_message, m),
        )
        self._tasks.append(asyncio.create_task(self._receive()))
        settings = [self.deploy.stage(spec.stage_id) for spec in self.pipeline.stages]
        if any(s.core_sharing.needs_board for s in settings):
            self.board = StageBoard.create(os.getpid(), sum(s.replicas for s in settings))
        seats = itertools.count()
        for spec, stage in zip(self.pipeline.stages, settings, strict=True):
            replicas = [self._make_client(spec, i, next(seats)) for i in range(stage.replicas)]
            self.pools[spec.stage_id] = StagePool(spec, replicas)
        for client in self._clients():
            client.start()
        await self._wait_ready(self._clients())
        self._tasks.append(asyncio.create_task(self._monitor()))

    async def _wait_ready(self, clients: list[StageClient]) -> None:
        """Until every client is Ready. A replica that exits first, or is not Ready by its deploy entry's
        `startup_timeout_s`, fails start-up with a message that names it and says what it was doing (its
        threads' stacks and the end of its log); the caller stops whatever was started."""
        started = time.monotonic()
        while not all(c.ready for c in clients):
            for c in clients:
                if not c.ready and not c.dead and (reason := c.exit_reason()) is not None:
                    c.dead = True
                    self._startup_errors.append(f"{c.label}: {reason} during start-up:\n{c.log_tail()}")
            if self._startup_errors:
                errors, self._startup_errors = self._startup_errors, []
                raise StageError("; ".join(errors), stage_id=None, stage_name="start-up")
            now = time.monotonic()
            late = [c for c in clients if not c.ready and now - started > c.deploy.startup_timeout_s]
            if late:
                reports = await asyncio.gather(*(asyncio.to_thread(c.startup_report) for c in late))
                raise StartupTimeoutError(
                    "; ".join(
                        f"{c.label} ({c.describe_wait()}) was not ready within its startup_timeout_s of "
                        f"{c.deploy.startup_timeout_s:g} s; it was doing:\n{report}"
                        for c, report in zip(late, reports, strict=True)
                    ),
                    stage_id=late[0].stage.stage_id,
                    stage_name=late[0].stage.name,
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 0.2)

    def _make_client(self, spec: StageSpec, replica: int, slot: int) -> StageClient:
        board_seat = BoardSeat(self.board.name, slot) if self.board else None
        return self.transport.client(spec, replica, board_seat)

    def _clients(self) -> list[StageClient]:
        return [c for pool in self.pools.values() for c in pool.replicas]

    # ---- messages from stages ------------------------------------------------------------------------
    async def _receive(self) -> None:
        while True:
            try:
                frame = await self.pull.recv(copy=False)
            except (asyncio.CancelledError, zmq.ContextTerminated, zmq.ZMQError):
                return
            try:
                msg = self.codec.decode(frame.buffer)
            except Exception as exc:
                logger.exception("undecodable message from a stage")
                self._on_unreadable(salvage(frame.buffer, exc))
                continue
            self._on_message(msg)

    def _on_unreadable(self, msg: Unreadable) -> None:
        """A stage's message that does not fit its schema: the requests (or the call) it was about fail with
        the reason, and its payloads are freed; dropped alone, its requests would wait forever."""
        for ref in msg.segments:
            release(ref.key)
        fields = msg.plain
        sid = fields.get("stage_id")
        name = self.pipeline.stage(sid).name if sid in self.pools else None

        def error() -> StageError:
            reason = f"it sent a message the server cannot read ({msg.error})"
            return StageError(reason, stage_id=sid, stage_name=name, exc_type=type(msg.error).__name__)

        for rid in msg.request_ids:
            rs = self.requests.get(rid)
            if rs is not None:
                self._fail(rs, error())
        fut = self._calls.pop(fields.get("call_id"), None) if fields.get("type") == "CallResult" else None
        if fut is not None and not fut.done():
            fut.set_exception(error())

    def _on_message(self, msg: Any) -> None:
        if isinstance(msg, Outputs):
            # What one engine step produced reaches each downstream replica as one delivery: a replica
            # never starts work on part of it (say a first-chunk pass for one request whose batch-mates'
            # codes, from the same talker step, would have arrived a millisecond later).
            self._holding = []
            try:
                for out in msg.items:
                    try:
                        self._on_output(msg.stage_id, out)
                    except Exception as exc:  # a routing fault fails the request, never the orchestrator
                        logger.exception("routing output of %s failed", out.request_id)
                        rs = self.requests.get(out.request_id)
                        if rs is not None:
                            self._fail(
                                rs,
                                StageError(str(exc), stage_id=msg.stage_id, exc_type=type(exc).__name__),
                            )
            finally:
                held, self._holding = self._holding, None
                for client in held:
                    client.release()
        elif isinstance(msg, CallResult):
            fut = self._calls.pop(msg.call_id, None)
            if fut is not None and not fut.done():
                if msg.error:
                    fut.set_exception(StageError(msg.error, stage_id=msg.stage_id))
                else:
                    fut.set_result(msg.result)
        elif isinstance(msg, Ready):
            client = self.pools[msg.stage_id].replica(msg.replica)
            client.ready = True
            client.pid = msg.pid
            self._changed.set()
        elif isinstance(msg, StartupFailed):
            spec = self.pipeline.stage(msg.stage_id)
            self._startup_errors.append(f"stage {msg.stage_id} ({spec.name}) failed to start: {msg.error}")
            self.pools[msg.stage_id].replica(msg.replica).dead = True
            self._changed.set()

    def _on_output(self, sid: int, out: StageOutput) -> None:
        rs = self.requests.get(out.request_id)
        payloads = list(iter_payloads(out))
        if rs is None or rs.terminal:
            for p in payloads:
                release(p.ref.key)
            return
        rs.payloads.extend(payloads)
        self.payload_stats["received"] += len(payloads)
        self.payload_stats["bytes"] += sum(p.ref.nbytes for p in payloads)
        spec = self.pipeline.stage(sid)
        if out.error:
            error = StageError(
                out.error, stage_id=sid, stage_name=spec.name, exc_type=out.error_type, param=out.error_param
            )
            self._fail(rs, error)
            return
        rs.record(sid, out)
        if out.finished and sid in rs.bound:
            self.pools[sid].replica(rs.bound[sid]).load -= 1
        update = rs.partial(sid, out) if sid in rs.finals else None
        for consumer in self.pipeline.consumers(sid):
            if consumer.stage_id not in rs.needed:
                continue
            if self.deploy.edge_async(self.pipeline, consumer.stage_id):
                self._send_chunk(rs, consumer, out)
            elif out.finished and all(rs.stage_finished(i) for i in consumer.inputs):
                self._start_stage(rs, consumer.stage_id)
            if rs.terminal:
                return
        if rs.all_finals_finished:
            final = rs.final_output()
            if update is not None:
                final.stage_id, final.modality = update.stage_id, update.modality
                final.delta_text, final.delta_token_ids = update.delta_text, update.delta_token_ids
                final.delta_audio = update.delta_audio
            self._finish(rs, RequestStatus.FINISHED, final)
        elif update is not None:
            rs.sink(update)

    # ---- routing -------------------------------------------------------------------------------------
    def submit(self, rs: RequestState) -> None:
        """Admit a request: send it to its entry stages."""
        if self._closed:
            self._fail(rs, StageDeadError("the server is shutting down"))
            return
        self.requests[rs.request_id] = rs
        for sid in sorted(rs.needed):
            if not self.pools[sid].alive:
                spec = self.pipeline.stage(sid)
                self._fail(rs, StageDeadError("stage is dead", stage_id=sid, stage_name=spec.name))
                return
        for spec in self.pipeline.stages:
            if spec.stage_id in rs.needed and not spec.inputs:
                self._start_stage(rs, spec.stage_id)
                if rs.terminal:
                    return

    def _bind(self, rs: RequestState, sid: int) -> StageClient:
        client = self.pools[sid].pick()
        client.load += 1
        rs.bound[sid] = client.replica
        rs.started.add(sid)
        return client

    def _modalities(self, rs: RequestState) -> list[str]:
        return sorted({self.pipeline.stage(sid).output_modality for sid in rs.finals})

    def _start_stage(self, rs: RequestState, sid: int) -> None:
        spec = self.pipeline.stage(sid)
        try:
            client = self._bind(rs, sid)
        except OmniError as exc:
            self._fail(rs, exc)
            return
        upstream = {i: rs.results[i] for i in spec.inputs}
        choices = {i: [r for _, r in sorted(rs.choices[i].items())] for i in spec.inputs if rs.choices.get(i)}
        for src in spec.inputs:
            self._count_edge(src, sid, rs.results[src])
        start = StartRequest(
            rs.request_id, rs.prompt, rs.params.get(sid), upstream, choices, self._modalities(rs)
        )
        self._send(client, rs, start)

    def _send_chunk(self, rs: RequestState, consumer: StageSpec, out: StageOutput) -> None:
        sid = consumer.stage_id
        first = sid not in rs.started
        if first:
            try:
                client = self._bind(rs, sid)
            except OmniError as exc:
                self._fail(rs, exc)
                return
        else:
            client = self.pools[sid].replica(rs.bound[sid])
        self._count_edge(consumer.inputs[0], sid, out)
        msg = ChunkInput(
            rs.request_id,
            out,
            out.finished,
            rs.prompt if first else None,
            rs.params.get(sid) if first else None,
            first,
            self._modalities(rs) if first else [],
        )
        self._send(client, rs, msg)

    def _send(self, client: StageClient, rs: RequestState, msg: Any) -> None:
        if isinstance(client, InlineStageClient):
            client.send(self.materialize(msg))
            return
        if self._holding is not None and client not in self._holding:
            client.hold()
            self._holding.append(client)
        client.codec.ledger = rs.payloads
        try:
            client.send(msg)
        finally:
            client.codec.ledger = None

    def _count_edge(self, src: int, dst: int, value: StageOutput | StageResult) -> None:
        """Per-edge traffic: tensors and references handed over, their bytes, and for shared-memory
        payloads the time from the producer's write to this hand-over."""
        stats = self.edge_stats.setdefault(
            f"{src}->{dst}", {"transfers": 0, "bytes": 0, "shm_transfers": 0, "shm_in_flight_s": 0.0}
        )
        now = time.time()
        for item in iter_payloads(value, values=True):
            stats["transfers"] += 1
            if isinstance(item, Payload):
                stats["bytes"] += item.ref.nbytes
                stats["shm_transfers"] += 1
                stats["shm_in_flight_s"] += max(0.0, now - item.ref.created)
            else:
                stats["bytes"] += int(item.nbytes) if hasattr(item, "nbytes") else 0

    def materialize(self, obj: Any) -> Any:
        """The same structure with every `Payload` replaced by its data (read, not released)."""
        if isinstance(obj, Payload):
            if is_tcp_key(obj.ref.key):
                return fetch(obj.ref, release_after=False)
            return self.reader.get(obj.ref, release_after=False)
        if isinstance(obj, dict):
            return {k: self.materialize(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.materialize(v) for v in obj]
        if isinstance(obj, msgspec.Struct):
            return msgspec.structs.replace(
                obj,
                **{
                    f: self.materialize(getattr(obj, f))
                    for f in obj.__struct_fields__
                    if isinstance(getattr(obj, f), dict | list | Payload | msgspec.Struct)
                },
            )
        return obj

    # ---- endings -------------------------------------------------------------------------------------
    def abort(self, request_id: str) -> None:
        rs = self.requests.get(request_id)
        if rs is not None and not rs.terminal:
            self._finish(rs, RequestStatus.ABORTED, rs.final_output(reason="abort"))

    def _fail(self, rs: RequestState, error: OmniError) -> None:
        if rs.terminal:
            return
        self.requests.setdefault(rs.request_id, rs)
        try:
            final = rs.final_output(error=error, reason="error")
        except Exception:  # what it produced so far cannot be assembled: the error alone still ends it
            logger.exception("assembling the output of failed request %s failed", rs.request_id)
            final = OmniRequestOutput(rs.request_id, finished=True, error=error, finish_reason="error")
        self._finish(rs, RequestStatus.FAILED, final)

    def _finish(self, rs: RequestState, status: RequestStatus, final: Any) -> None:
        """The single exit of every request: tell stages that still hold it, free its payloads, report."""
        rs.status = status
        for sid in rs.started:
            if not rs.stage_finished(sid):
                client = self.pools[sid].replica(rs.bound[sid])
                client.load -= 1
                if client.alive:
                    client.send(Abort([rs.request_id]))
        for p in rs.payloads:
            release(p.ref.key)
        rs.payloads.clear()
        self.requests.pop(rs.request_id, None)
        rs.sink(final)

    # ---- health --------------------------------------------------------------------------------------
    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            if self._closed:  # closing stops every stage: an exit from now on is no death
                return
            for client in self._clients():
                if client.ready and not client.dead and (reason := client.exit_reason()) is not None:
                    self._on_death(client, reason)

    def _on_death(self, client: StageClient, reason: str) -> None:
        client.dead = True
        sid = client.stage.stage_id
        logger.error("%s died: %s; its log ends with:\n%s", client.label, reason, client.log_tail())
        error = StageDeadError(
            f"replica {client.replica}: {reason}", stage_id=sid, stage_name=client.stage.name
        )
        for rs in list(self.requests.values()):
            if rs.bound.get(sid) == client.replica and not rs.stage_finished(sid):
                self._fail(rs, error)
        self._restart_later(client)

    def _restart_later(self, client: StageClient) -> None:
        """A dead replica comes back on its own, at most `max_restarts` times in `RESTART_WINDOW_S` (a stage
        that dies at every start is left dead, and says so, rather than restarted forever)."""
        limit = client.deploy.max_restarts
        history = self._restarts.setdefault((client.stage.stage_id, client.replica), [])
        now = time.monotonic()
        history[:] = [t for t in history if now - t < RESTART_WINDOW_S]
        if len(history) >= limit:
            logger.error(
                "%s is not restarted: it died %d times within %.0f s (max_restarts %d)",
                client.label,
                len(history),
                RESTART_WINDOW_S,
                limit,
            )
            return
        history.append(now)
        self._tasks.append(asyncio.create_task(self._restart(client.stage.stage_id, client.replica)))

    async def _restart(self, stage_id: int, replica: int) -> None:
        try:
            await self.restart_replica(stage_id, replica)
            logger.warning("%s restarted", self.pools[stage_id].replica(replica).label)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("stage %d replica %d could not be restarted", stage_id, replica)

    def health(self) -> dict[str, Any]:
        stages = []
        for sid, pool in self.pools.items():
            stages.append(
                {
                    "stage_id": sid,
                    "name": pool.stage.name,
                    "kind": str(pool.stage.kind),
                    "alive": pool.alive,
                    "ready": pool.ready,
                    "replicas": [
                        {
                            "replica": c.replica,
                            "alive": c.alive,
                            "ready": c.ready,
                            "pid": c.pid,
                            "load": c.load,
                            **c.placement(),
                        }
                        for c in pool.replicas
                    ],
                }
            )
        ready = bool(stages) and all(s["alive"] and s["ready"] for s in stages) and not self._closed
        return {"ready": ready, "stages": stages}

    async def restart_replica(self, stage_id: int, replica: int) -> None:
        """Replace a dead replica with a fresh one (same slot, same settings) and wait until it is ready;
        requests already failed stay failed, new ones may bind to it."""
        pool = self.pools[stage_id]
        old = pool.replica(replica)
        if old.alive and old.exit_reason() is None:
            raise StageError(f"{old.label} is alive: only a dead replica is restarted", stage_id=stage_id)
        await asyncio.to_thread(old.close)
        slot = old.board_seat.slot if old.board_seat else 0
        client = self._make_client(pool.stage, replica, slot)
        pool.replicas[replica] = client
        client.start()
        try:
            await self._wait_ready([client])
        except StageError:
            client.dead = True
            await asyncio.to_thread(client.close)
            raise

    async def call(
        self,
        method: str,
        args: list[Any] | None = None,
        stage_ids: list[int] | None = None,
        timeout: float = 30.0,
    ) -> list[dict[str, Any]]:
        """Run a control call on every live replica of the chosen stages."""
        waits = []
        for sid, pool in self.pools.items():
            if stage_ids is not None and sid not in stage_ids:
                continue
            for client in pool.replicas:
                if client.alive:
                    call_id = next(self._call_ids)
                    fut = self.loop.create_future()
                    self._calls[call_id] = fut
                    client.send(Call(call_id, method, list(args or [])))
                    waits.append((sid, client.replica, fut))
        results = []
        for sid, replica, fut in waits:
            try:
                value = await asyncio.wait_for(fut, timeout)
            except (TimeoutError, OmniError) as exc:
                value = {"error": str(exc)}
            results.append({"stage_id": sid, "replica": replica, "result": value})
        return results

    async def _shutdown(self) -> None:
        for rs in list(self.requests.values()):
            self._fail(rs, StageDeadError("the server is shutting down"))
        for task in self._tasks:
            task.cancel()
        clients = self._clients()
        await asyncio.gather(*(asyncio.to_thread(c.close) for c in clients), return_exceptions=True)
        self.pull.close(linger=0)
