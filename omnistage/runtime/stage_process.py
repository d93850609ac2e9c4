"""The stage worker: one engine, driven by control messages.

`StageWorker` holds the logic (input processors, chunk handoff, output shaping, fault isolation) and
`serve_stage` is its one loop, shared by both placements: `inline` runs it on a thread of the orchestrator's
process with an in-process queue as its inbox, `process` runs it in `main()` here, a subprocess whose
inbox is a ZMQ socket. Only the `Inbox` and the `send` function differ.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import torch

from omnistage.config.deploy import CoreSharingSettings, StageDeploy
from omnistage.config.pipeline import StageSpec, load_ref, register_family
from omnistage.outputs import StageOutput, StageResult, error_output
from omnistage.processes import watch_parent
from omnistage.runtime.core_sharing import CoreSharing
from omnistage.runtime.messages import (
    Abort,
    Call,
    CallResult,
    ChunkInput,
    Outputs,
    Ready,
    Shutdown,
    StartRequest,
    StartupFailed,
    ToWorker,
    Unreadable,
    salvage,
)
from omnistage.runtime.stage_board import BoardSeat
from omnistage.stages.base import EngineContext, StageInputContext, StageRequest

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 1.0  # an idle worker wakes this often even with nothing to do (cheap; keeps the loop simple)


def default_input_processor(ctx: StageInputContext) -> StageRequest:
    """Entry stages get the user's prompt; others get their upstream stages' tokens as the prompt (a stage
    that takes more, such as tensors, names an input processor that builds its engine's inputs)."""
    if not ctx.upstream:
        return StageRequest(ctx.request_id, prompt=ctx.prompt, params=ctx.params)
    token_ids = [t for sid in ctx.stage.inputs for t in ctx.upstream[sid].token_ids]
    return StageRequest(ctx.request_id, prompt=token_ids, params=ctx.params)


def create_engine(stage: StageSpec, deploy: StageDeploy, model_dir: str | None, device: str) -> Any:
    factory = load_ref(stage.engine_ref)
    return factory(EngineContext(stage=stage, deploy=deploy, model_dir=model_dir, device=device))


class StageWorker:
    """Turns control messages into engine calls and engine outputs into deltas for the orchestrator.

    `stream_tensors=False` (a stage whose tensors only feed full-handoff stages) keeps tensor deltas here
    and sends them once, joined, with the request's final output: one transfer instead of one per step.

    `sharing` (runtime/core_sharing.py) is how its steps share CPU cores with the other stages.
    """

    def __init__(
        self,
        stage: StageSpec,
        engine: Any,
        emit: Callable[[list[StageOutput]], None],
        stream_tensors: bool = True,
        sharing: CoreSharing | None = None,
    ):
        self.stage = stage
        self.engine = engine
        self.emit = emit
        self.stream_tensors = stream_tensors
        self.input_processor = load_ref(stage.input_processor) or default_input_processor
        self.chunk_processor = load_ref(stage.chunk_processor)
        self.active: set[str] = set()
        self.chunk_contexts: dict[str, StageInputContext] = {}
        self.held: dict[str, StageResult] = {}
        lend = getattr(engine, "input_resources", None)
        self.resources = lend() if lend is not None else None
        self.requests_started = 0
        self.stopped = False
        self.sharing = sharing or CoreSharing.plain(engine)

    # ---- control -------------------------------------------------------------------------------------
    def handle(self, msg: Any) -> Any:
        if isinstance(msg, StartRequest):
            self._guard(msg.request_id, self._start, msg)
        elif isinstance(msg, ChunkInput):
            self._guard(msg.request_id, self._chunk, msg)
        elif isinstance(msg, Abort):
            for rid in msg.request_ids:
                self._forget(rid)
                with contextlib.suppress(Exception):
                    self.engine.abort(rid)
        elif isinstance(msg, Call):
            return self.call(msg.method, msg.args)
        elif isinstance(msg, Shutdown):
            self.stopped = True
        return None

    def call(self, method: str, args: list[Any]) -> Any:
        if method == "stats":
            stats = dict(self.engine.stats())
            stats["worker_requests"] = len(self.active)
            stats["requests_started"] = self.requests_started
            stats["pid"] = os.getpid()
            stats.update(self.sharing.stats())
            return stats
        if method in ("sleep", "wake_up"):
            return getattr(self.engine, method)(*args)
        if method == "ping":
            return "pong"
        raise ValueError(f"unknown stage call {method!r}")

    def _start(self, msg: StartRequest) -> None:
        ctx = StageInputContext(
            msg.request_id, msg.prompt, msg.params, dict(msg.upstream), self.stage, self.resources
        )
        ctx.upstream_choices = dict(msg.upstream_choices)
        ctx.modalities = tuple(msg.modalities)
        self._add(self.input_processor(ctx))

    def _chunk(self, msg: ChunkInput) -> None:
        rid = msg.request_id
        source = self.stage.inputs[0]
        if msg.first:
            upstream = {source: StageResult(stage_id=source)}
            self.chunk_contexts[rid] = StageInputContext(
                rid, msg.prompt, msg.params, upstream, self.stage, self.resources
            )
            self.chunk_contexts[rid].modalities = tuple(msg.modalities)
        ctx = self.chunk_contexts.get(rid)
        if ctx is None:  # aborted meanwhile
            return
        ctx.upstream[source].add(msg.chunk)
        made = self.chunk_processor(ctx, msg.chunk, msg.last)
        if isinstance(made, StageRequest):
            made.streaming_input = not msg.last
            self._add(made)
        elif rid in self.active and (made is not None or msg.last):
            self.engine.add_chunk(rid, made, msg.last)
        if msg.last:
            self.chunk_contexts.pop(rid, None)
            if rid not in self.active:
                raise ValueError("the chunk processor built no request from the whole upstream stream")

    def _add(self, request: StageRequest) -> None:
        self.engine.add_request(request)
        self.active.add(request.request_id)
        self.requests_started += 1

    # ---- stepping ------------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.engine.has_work()

    def step(self) -> None:
        self.sharing.before_step()
        try:
            outputs = self.engine.step()
        except Exception as exc:  # the engine is in an unknown state for everything it held
            logger.exception("stage %s engine step failed", self.stage.name)
            self._fail(list(self.active), exc)
            return
        finally:
            self.sharing.after_step()
        ready = [out for out in outputs if out.request_id in self.active]
        for out in ready:
            if not self.stream_tensors:
                self._hold_tensors(out)
            if out.finished:
                self._forget(out.request_id)
        if ready:
            try:
                self.emit(ready)
            except Exception as exc:  # e.g. an output that cannot be sent: fail those requests, not the stage
                logger.exception("stage %s could not send outputs", self.stage.name)
                self._fail([out.request_id for out in ready], exc)

    def close(self) -> None:
        """The worker's exit: the engine releases what it holds (helper processes, caches), then the seat."""
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception:
                logger.exception("stage %s engine shutdown failed", self.stage.name)
        self.sharing.close()

    def _hold_tensors(self, out: StageOutput) -> None:
        if out.has_bulk():
            held = self.held.setdefault(out.request_id, StageResult(stage_id=self.stage.stage_id))
            held.add(out.take_bulk())
        if out.finished and out.request_id in self.held:
            self.held.pop(out.request_id).joined_bulk(out)

    def _forget(self, rid: str) -> None:
        self.active.discard(rid)
        self.chunk_contexts.pop(rid, None)
        self.held.pop(rid, None)

    def _guard(self, rid: str, fn: Callable[[Any], None], msg: Any) -> None:
        try:
            fn(msg)
        except Exception as exc:
            logger.info("stage %s rejected %s: %s", self.stage.name, rid, exc)
            self._fail([rid], exc)

    def _fail(self, rids: list[str], exc: BaseException) -> None:
        outs = []
        for rid in rids:
            self._forget(rid)
            with contextlib.suppress(Exception):
                self.engine.abort(rid)
            outs.append(error_output(rid, exc))
        if outs:
            self.emit(outs)


class Inbox(Protocol):
    """Where a worker's control messages arrive: an in-process queue (inline) or a ZMQ socket (process)."""

    def wait(self, timeout_s: float) -> bool:
        """Block up to `timeout_s` (0: not at all) for a message; whether one is waiting."""
        ...

    def take(self) -> list[Any]:
        """Every message waiting now, in order, without blocking."""
        ...


def serve_stage(
    stage: StageSpec,
    replica: int,
    build: Callable[[], tuple[Any, str]],
    inbox: Inbox,
    send: Callable[[Any], None],
    sharing: CoreSharingSettings | None = None,
    seat: BoardSeat | None = None,
    stream_tensors: bool = True,
) -> bool:
    """Build the engine (`build` returns it and its device), say Ready, and drive it until Shutdown; the
    worker closes (and shuts its engine down) however the loop ends. False if the engine could not be built
    (StartupFailed was sent)."""
    sid = stage.stage_id
    try:
        engine, device = build()
    except BaseException as exc:
        send(StartupFailed(sid, replica, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
        return False
    # Stages on accelerators share no cores: the plain policy there.
    policy = CoreSharing(sharing or CoreSharingSettings(), seat, engine) if device == "cpu" else None
    emit = lambda items: send(Outputs(sid, replica, items))  # noqa: E731
    worker = StageWorker(stage, engine, emit, stream_tensors=stream_tensors, sharing=policy)
    send(Ready(sid, replica, os.getpid(), {"device": device}))

    def deliver() -> None:
        for msg in inbox.take():
            if isinstance(msg, Unreadable):  # fail what it was about; the rest goes on
                if msg.request_ids:
                    send(Outputs(sid, replica, [error_output(rid, msg.error) for rid in msg.request_ids]))
                if isinstance(call_id := msg.plain.get("call_id"), int):
                    error = f"{type(msg.error).__name__}: {msg.error}"
                    send(CallResult(sid, replica, call_id, error=error))
                continue
            if not isinstance(msg, Call):
                worker.handle(msg)
                continue
            try:
                send(CallResult(sid, replica, msg.call_id, result=worker.handle(msg)))
            except Exception as exc:
                send(CallResult(sid, replica, msg.call_id, error=f"{type(exc).__name__}: {exc}"))

    try:
        while not worker.stopped:
            idle = not worker.has_work()
            if inbox.wait(IDLE_WAIT_S if idle else 0):
                deliver()
                if idle:  # the rest of a burst that woke the engine, so it starts as one batch
                    worker.sharing.settle(inbox.wait, deliver)
            if worker.has_work() and not worker.stopped:
                worker.step()
    finally:
        worker.close()
    return True


def apply_devices(deploy: StageDeploy) -> str:
    """Pin the stage to its devices: CUDA devices where there are GPUs, CPU cores and threads otherwise."""
    if deploy.devices and torch.cuda.is_available():
        return "cuda:0"  # CUDA_VISIBLE_DEVICES was set by the parent for this process
    if deploy.devices and hasattr(os, "sched_setaffinity"):
        cores = [d for d in deploy.devices if d < (os.cpu_count() or 1)]
        if cores:
            os.sched_setaffinity(0, cores)
    threads = deploy.num_threads or (len(deploy.devices) if deploy.devices else None)
    if threads:
        torch.set_num_threads(threads)
    return "cpu"


# ---- subprocess entry point --------------------------------------------------------------------------
class _SocketInbox:
    """A ZMQ PULL socket as an inbox; a held delivery (a multipart message) is read part by part."""

    def __init__(self, socket: Any, decode: Callable[[Any], Any]):
        self.socket = socket
        self.decode = decode

    def wait(self, timeout_s: float) -> bool:
        return bool(self.socket.poll(int(timeout_s * 1000)))

    def take(self) -> list[Any]:
        import zmq

        msgs = []
        while True:
            try:
                raw = self.socket.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return msgs
            try:
                msgs.append(self.decode(raw.buffer))
            except FileNotFoundError as exc:
                # The orchestrator frees a request's shared-memory payloads when the request ends (done,
                # aborted, failed) and tells every stage that holds it; a message still on its way here for
                # such a request finds a segment gone. It fails that request alone (the orchestrator
                # ignores outputs of requests that have ended), and the stage serves the rest.
                logger.warning("a message whose payload is gone (its request has ended?): %s", exc)
                msgs.append(salvage(raw.buffer, exc))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # a sender broke the schema
                logger.error("an unreadable message (its request fails): %s", exc)
                msgs.append(salvage(raw.buffer, exc))


def _stop(signum: int, frame: Any) -> None:
    """SIGTERM/SIGINT sent to this process itself (the orchestrator stops stages with Shutdown, and starts
    them in their own session, out of reach of the signals a terminal or a service manager sends the
    server): leave through the loop's exit, so the engine still shuts down (its helper processes too)."""
    raise SystemExit(0)


def main(config_path: str) -> None:
    import msgspec

    from omnistage.runtime.launch import WorkerConfig

    watch_parent()
    # SIGUSR1: every thread's stack into the log (what a start-up timeout reports a stuck stage doing).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    with open(config_path, "rb") as f:
        cfg = msgspec.json.decode(f.read(), type=WorkerConfig)
    stage = cfg.stage_spec()
    logging.basicConfig(
        level=os.environ.get("OMNISTAGE_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s [stage {stage.stage_id}.{cfg.replica}] %(levelname)s %(message)s",
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    code: Any = 1
    try:
        code = 0 if run_config(cfg) else 1
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        traceback.print_exc()
    _exit_now(code)


def _exit_now(code: Any) -> None:
    """Leave without the interpreter's module teardown: with torch and transformers loaded it takes 1.5 s
    here, paid by every stage's shutdown. The atexit handlers (helper processes, logging) still run."""
    import atexit
    import sys

    if isinstance(code, str):  # SystemExit("why"): said on stderr, as the interpreter would
        print(code, file=sys.stderr)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def run_config(cfg: Any) -> bool:
    """The worker of one `WorkerConfig` over ZMQ (a stage process's, or a Ray actor's): connect, serve
    until Shutdown; False if the engine could not be built."""
    import zmq

    from omnistage.connectors.shm import ShmConnector
    from omnistage.connectors.tcp import TcpConnector
    from omnistage.runtime.messages import Codec, FromWorker

    stage = cfg.stage_spec()
    zctx = zmq.Context()
    inbox = zctx.socket(zmq.PULL)
    inbox.connect(cfg.inbox)
    outbox = zctx.socket(zmq.PUSH)
    outbox.setsockopt(zmq.LINGER, 2000)  # what was sent last (StartupFailed, final outputs) still leaves
    outbox.connect(cfg.outbox)
    connector: Any = None
    if cfg.output_connector == "shm":
        connector = ShmConnector(owner_pid=cfg.owner_pid)
    elif cfg.output_connector == "tcp":
        connector = TcpConnector(cfg.host or None)
    encoder = Codec(FromWorker, connector=connector, inline_limit=cfg.inline_limit)

    def send(msg: Any) -> None:
        outbox.send(encoder.encode(msg), copy=False)

    def build() -> tuple[Any, str]:
        device = apply_devices(cfg.deploy)
        register_family(cfg.family)
        return create_engine(stage, cfg.deploy, cfg.model_dir, device), device

    try:
        started = serve_stage(
            stage,
            cfg.replica,
            build,
            _SocketInbox(inbox, Codec(ToWorker).decode),
            send,
            sharing=cfg.deploy.core_sharing,
            seat=cfg.board_seat,
            stream_tensors=cfg.stream_tensors,
        )
    finally:
        outbox.close()
        inbox.close(linger=0)
        zctx.term()
        if isinstance(connector, TcpConnector):
            connector.close()
    return started
