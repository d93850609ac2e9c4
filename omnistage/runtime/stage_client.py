"""Stage clients: how the orchestrator reaches one stage replica.

`InlineStageClient` runs the worker on a thread of this process (no serialization at all);
`ProcessStageClient` runs it in a subprocess and speaks ZMQ + msgspec. Both run the same worker loop
(`runtime/stage_process.py:serve_stage`) and deliver every message from the stage through `on_message`,
called on the orchestrator's event loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import torch
import zmq

from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageSpec
from omnistage.connectors.shm import ShmConnector
from omnistage.runtime.launch import WorkerConfig, refs_to_paths, stage_to_dict
from omnistage.runtime.messages import INLINE_LIMIT, Codec, Shutdown, ToWorker
from omnistage.runtime.stage_board import BoardSeat
from omnistage.runtime.stage_process import create_engine, serve_stage

logger = logging.getLogger(__name__)
SEND_WAIT_S = 5.0  # the longest a send waits for a worker to (re)connect (see ProcessStageClient._deliver)
REPORT_WAIT_S = 3.0  # the longest a start-up timeout waits for a stuck stage process to dump its stacks
STACK_FRAMES = 25  # innermost frames of a stuck stage's stack, in the start-up timeout's message
OnMessage = Callable[[Any], None]


class StageClient:
    def __init__(
        self,
        stage: StageSpec,
        deploy: StageDeploy,
        replica: int,
        model_dir: str | None,
        on_message: OnMessage,
        stream_tensors: bool,
        board_seat: BoardSeat | None = None,
        family: str | None = None,
    ):
        self.family = family  # the pipeline's family: registered in the stage process before its engine
        self.stage = stage
        self.deploy = deploy
        self.replica = replica
        self.model_dir = model_dir
        self.on_message = on_message
        self.stream_tensors = stream_tensors
        self.board_seat = board_seat  # on the pipeline's stage board, if it has one
        self.ready = False
        self.dead = False
        self.load = 0  # requests bound to this replica
        self.pid: int | None = None

    @property
    def label(self) -> str:
        return f"stage {self.stage.stage_id} ({self.stage.name}) replica {self.replica}"

    @property
    def alive(self) -> bool:
        return not self.dead

    def exit_reason(self) -> str | None:
        """Why the replica's process or actor is gone, or None while it runs (or where it cannot tell)."""
        return None

    def describe_wait(self) -> str:
        """What a replica that is not ready yet may be waiting for (the start-up timeout names it)."""
        return "no Ready yet"

    def placement(self) -> dict[str, Any]:
        """Where the replica runs, for `/health` (a Ray actor names its node)."""
        return {}

    def log_tail(self, lines: int = 30) -> str:
        return ""

    def startup_report(self) -> str:
        """What a replica that is late for Ready is doing (its threads' stacks where it can say), for the
        start-up timeout's message. Called off the orchestrator's loop; bounded."""
        return self.log_tail()

    def start(self) -> None:
        raise NotImplementedError

    def send(self, msg: Any) -> None:
        raise NotImplementedError

    def hold(self) -> None:
        """Keep what is sent from now until `release()` and deliver it then, all at once."""

    def release(self) -> None:
        pass

    def close(self, timeout: float = 5.0) -> None:
        raise NotImplementedError


# Inline stages of one process build their engines one at a time: concurrent first imports of
# `transformers` (a lazy module) from several threads fail with "cannot import name ...", and
# `from_pretrained` builds modules on the meta device through process-global patches, so two loads at once
# can leave each other's weights on meta ("Cannot copy out of meta tensor").
_ENGINE_BUILD_LOCK = threading.Lock()


class QueueInbox:
    """An in-process queue as a worker's inbox (inline placement): messages pass by reference."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.head: list[Any] = []  # what `wait` took off the queue, handed out first by `take`

    def put(self, msg: Any) -> None:
        self.queue.put(msg)

    def wait(self, timeout_s: float) -> bool:
        if not self.head:
            try:
                self.head.append(self.queue.get(timeout=timeout_s) if timeout_s else self.queue.get_nowait())
            except queue.Empty:
                return False
        return True

    def take(self) -> list[Any]:
        msgs, self.head = self.head, []
        while True:
            try:
                msgs.append(self.queue.get_nowait())
            except queue.Empty:
                return msgs


class InlineStageClient(StageClient):
    """The worker on a thread of the orchestrator's process: objects pass by reference."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.inbox = QueueInbox()
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"stage-{self.stage.stage_id}", daemon=True)
        self.thread.start()

    def send(self, msg: Any) -> None:
        self.inbox.put(msg)

    def startup_report(self) -> str:
        frame = sys._current_frames().get(self.thread.ident) if self.thread is not None else None
        if frame is None:
            return "(its thread has ended)"
        return f"thread {self.thread.name}:\n" + "".join(traceback.format_stack(frame)[-STACK_FRAMES:])

    def _build(self) -> tuple[Any, str]:
        # Inline stages share this process: no affinity or thread changes, only the device choice.
        gpu = self.deploy.devices and torch.cuda.is_available()
        device = f"cuda:{self.deploy.devices[0]}" if gpu else "cpu"
        with _ENGINE_BUILD_LOCK:
            return create_engine(self.stage, self.deploy, self.model_dir, device), device

    def _run(self) -> None:
        started = serve_stage(
            self.stage,
            self.replica,
            self._build,
            self.inbox,
            self.on_message,
            # Threads are per process: an inline stage never takes solo threads (its process is the server's).
            sharing=dataclasses.replace(self.deploy.core_sharing, solo_threads=None),
            seat=self.board_seat,
            stream_tensors=self.stream_tensors,
        )
        if not started:
            self.dead = True

    def close(self, timeout: float = 5.0) -> None:
        self.send(Shutdown())
        if self.thread is not None:
            self.thread.join(timeout)
        self.dead = True


class ProcessStageClient(StageClient):
    """The worker in its own process. The child watches a pipe from us and exits when we vanish."""

    def __init__(
        self,
        *args: Any,
        ipc_dir: Path,
        outbox: str,
        owner_pid: int,
        output_connector: str,
        input_connector: str,
        zmq_context: zmq.Context,
        inline_limit: int = INLINE_LIMIT,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.inline_limit = inline_limit  # the worker's: payloads up to this size ride in its frames
        self.ipc_dir = ipc_dir
        self.outbox = outbox
        self.owner_pid = owner_pid
        self.output_connector = output_connector
        name = f"{self.stage.stage_id}-{self.replica}"
        self.inbox = f"ipc://{ipc_dir}/in-{name}"
        self.log_path = ipc_dir / f"stage-{name}.log"
        self.socket = zmq_context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(self.inbox)
        connector = ShmConnector(owner_pid) if input_connector == "shm" else None
        self.codec = Codec(ToWorker, connector=connector)
        self.proc: subprocess.Popen | None = None
        self.held: list[Any] | None = None

    def exit_reason(self) -> str | None:
        code = self.proc.poll() if self.proc is not None else None
        return None if code is None else f"process {self.pid} exited with code {code}"

    def start(self) -> None:
        deploy = dataclasses.replace(self.deploy, engine_args=refs_to_paths(self.deploy.engine_args))
        cfg = WorkerConfig(
            stage=stage_to_dict(self.stage),
            deploy=deploy,
            model_dir=self.model_dir,
            replica=self.replica,
            inbox=self.inbox,
            outbox=self.outbox,
            owner_pid=self.owner_pid,
            output_connector=self.output_connector,
            stream_tensors=self.stream_tensors,
            board_seat=self.board_seat,
            inline_limit=self.inline_limit,
            family=self.family,
        )
        path = self.ipc_dir / f"stage-{self.stage.stage_id}-{self.replica}.json"
        path.write_bytes(msgspec.json.encode(cfg))
        env = dict(os.environ)
        env.update(self.deploy.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        if self.deploy.devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in self.deploy.devices)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from omnistage.runtime.stage_process import main; main(sys.argv[1])",
                    str(path),
                ],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                close_fds=True,
                # Its own session: the SIGINT/SIGTERM a terminal or a service manager sends the server's
                # process group reach the server alone, which drains and then stops its stages with
                # Shutdown, instead of every stage dying at once under the requests still in flight.
                start_new_session=True,
            )
        self.pid = self.proc.pid

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def startup_report(self) -> str:
        """The process's threads' stacks, which it writes into its log on SIGUSR1 (faulthandler, set up by
        the stage process's main), then the log's end."""
        if self.proc is not None and self.proc.poll() is None:
            size = self._log_size()
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGUSR1)
            deadline = time.monotonic() + REPORT_WAIT_S
            while self._log_size() == size and time.monotonic() < deadline and self.proc.poll() is None:
                time.sleep(0.02)
            time.sleep(0.05)  # the rest of the dump: it is written in one go, in well under this
        return self.log_tail(STACK_FRAMES * 3)

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def send(self, msg: Any) -> None:
        if not self.alive:
            return
        frame = self.codec.encode(msg)
        if self.held is None:
            self._deliver(lambda flags: self.socket.send(frame, flags, copy=False))
        else:
            self.held.append(frame)

    def _deliver(self, send: Callable[[int], Any]) -> None:
        """Send without ever blocking the orchestrator's loop for good. A PUSH socket blocks a send while no
        worker is connected (its high-water mark is off), and a dying worker's socket closes before its
        process exits: a blocking send then would hang the loop, and with it the monitor that fails the
        replica's requests. So: non-blocking; with no worker connected, retried until it reconnects or its
        process is gone (then dropped, the monitor fails its requests), at most `SEND_WAIT_S`."""
        deadline = time.monotonic() + SEND_WAIT_S
        while True:
            try:
                send(zmq.NOBLOCK)
                return
            except zmq.Again:
                if not self.alive or time.monotonic() > deadline:
                    logger.warning("%s: a message was dropped, no worker is connected", self.label)
                    return
                time.sleep(0.001)

    def hold(self) -> None:
        if self.held is None:
            self.held = []

    def release(self) -> None:
        """One multipart message: ZMQ delivers its parts together, so the worker reads them all before it
        steps again (each part is one encoded message)."""
        frames, self.held = self.held, None
        if frames and self.alive:
            self._deliver(lambda flags: self.socket.send_multipart(frames, flags, copy=False))

    def close(self, timeout: float = 5.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.socket.send(self.codec.encode(Shutdown()), zmq.NOBLOCK)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(2)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        if self.proc is not None and self.proc.stdin:
            with contextlib.suppress(Exception):
                self.proc.stdin.close()
        self.socket.close(linger=0)
        self.dead = True
