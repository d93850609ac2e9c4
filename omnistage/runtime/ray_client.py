"""`RayStageClient`: a stage replica as a Ray actor, reached over ZMQ/TCP like a stage process.

The actor (runtime/ray_actor.py) runs the process worker unchanged; this client speaks the same frames (a
held delivery is one multipart message, as for a process), asks Ray for the resources the stage's deploy
entry names, and learns of the actor's death from the call that runs the worker: it returns when the worker
stops and raises when the actor dies. Ray is imported only here, so it stays an optional extra.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from typing import Any

import msgspec
import zmq

from omnistage.errors import ConfigError
from omnistage.runtime.launch import WorkerConfig, refs_to_paths, stage_to_dict
from omnistage.runtime.messages import Codec, Shutdown, ToWorker
from omnistage.runtime.stage_client import REPORT_WAIT_S, ProcessStageClient, StageClient

logger = logging.getLogger(__name__)


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("placement 'ray' needs the ray extra: pip install 'omnistage[ray]'") from exc
    return ray


def connect_ray() -> bool:
    """Join the cluster this process should use, unless it already has one: `RAY_ADDRESS` (what
    `--ray-address` sets: `host:port`, or `auto` for the `ray start` cluster on this host), else a new
    local cluster of its own. True if this call connected (the caller disconnects at close)."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS") or "local"
    ray.init(address=address, include_dashboard=False if address == "local" else None, log_to_driver=False)
    return True


def driver_ip() -> str:
    """This process's address on the cluster's network (where actors connect back to)."""
    return import_ray().util.get_node_ip_address()


class RayStageClient(StageClient):
    """One replica's actor. Its inbox is a PUSH socket bound here on TCP; it sends to the orchestrator's
    TCP outbox."""

    hold = ProcessStageClient.hold

    def __init__(
        self,
        *args: Any,
        outbox: str,
        host: str,
        output_connector: str,
        inline_limit: int,
        zmq_context: zmq.Context,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.outbox = outbox
        self.output_connector = output_connector
        self.inline_limit = inline_limit
        self.socket = zmq_context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.SNDHWM, 0)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(f"tcp://{host}:*")
        self.inbox = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.codec = Codec(ToWorker)  # values ride in the frame: the actor may be on another host
        self.held: list[Any] | None = None
        self.actor: Any = None
        self.done: Any = None  # the `run` call: ready when the worker stopped or the actor died
        self._describe: Any = None
        self._node: dict[str, Any] | None = None
        self._exit: str | None = None

    def start(self) -> None:
        ray = import_ray()
        from omnistage.runtime.ray_actor import StageActor

        deploy = dataclasses.replace(self.deploy, engine_args=refs_to_paths(self.deploy.engine_args))
        cfg = WorkerConfig(
            stage=stage_to_dict(self.stage),
            deploy=deploy,
            model_dir=self.model_dir,
            replica=self.replica,
            inbox=self.inbox,
            outbox=self.outbox,
            owner_pid=os.getpid(),
            output_connector=self.output_connector,
            stream_tensors=self.stream_tensors,
            inline_limit=self.inline_limit,
            family=self.family,
        )
        options: dict[str, Any] = {
            "num_cpus": 1 if self.deploy.num_cpus is None else self.deploy.num_cpus,
            "resources": dict(self.deploy.resources),
            "max_concurrency": 2,
            "max_restarts": 0,
        }
        if self.deploy.num_gpus:
            options["num_gpus"] = self.deploy.num_gpus
        self.actor = ray.remote(StageActor).options(**options).remote()
        self.done = self.actor.run.remote(msgspec.json.encode(cfg), list(sys.path), dict(self.deploy.env))
        self._describe = self.actor.describe.remote()

    @property
    def alive(self) -> bool:
        return not self.dead and self.actor is not None

    def send(self, msg: Any) -> None:
        if not self.alive:
            return
        frame = self.codec.encode(msg)
        if self.held is None:
            self._push([frame])
        else:
            self.held.append(frame)

    def release(self) -> None:
        """What was held, as one multipart message (the process client's contract)."""
        frames, self.held = self.held, None
        if frames and self.alive:
            self._push(frames)

    def _push(self, frames: list[Any]) -> None:
        # A PUSH socket whose only peer is gone blocks a send; an actor that died a moment before the
        # monitor saw it must not stall the orchestrator's loop, and its requests fail anyway.
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            logger.warning("%s is not connected; a message to it was dropped", self.label)

    def exit_reason(self) -> str | None:
        """Why the actor stopped, once it has (None while it runs)."""
        if self._exit is not None or self.done is None:
            return self._exit
        ray = import_ray()
        ready, _ = ray.wait([self.done], timeout=0)
        if not ready:
            return None
        try:
            ray.get(self.done)
            self._exit = f"actor {self.actor_id} stopped"
        except Exception as exc:  # RayActorError and kin: the actor, its worker process or its node died
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self._exit = f"actor {self.actor_id} died ({type(exc).__name__}: {first})"
        return self._exit

    @property
    def actor_id(self) -> str:
        return self.actor._actor_id.hex() if self.actor is not None else ""

    @property
    def node(self) -> dict[str, Any] | None:
        """Where the actor runs (pid, node id and address), once it has told us."""
        if self._node is None and self._describe is not None:
            ray = import_ray()
            ready, _ = ray.wait([self._describe], timeout=0)
            if ready:
                with contextlib.suppress(Exception):
                    self._node = ray.get(self._describe)
                self._describe = None
        return self._node

    def placement(self) -> dict[str, Any]:
        return {"node": self.node}

    def describe_wait(self) -> str:
        """Why it may not be ready: an actor waits for a node that has what it asks for."""
        asks = {"CPU": 1 if self.deploy.num_cpus is None else self.deploy.num_cpus, **self.deploy.resources}
        if self.deploy.num_gpus:
            asks["GPU"] = self.deploy.num_gpus
        placed = "placed" if self.node is not None else "not placed yet"
        return f"Ray actor {placed}; it asks for {asks} (ray status shows what the nodes have)"

    def log_tail(self, lines: int = 30) -> str:
        return "(a Ray actor's log is in the Ray session's logs/worker-*.err on its node)"

    def startup_report(self) -> str:
        """The actor's threads' stacks, asked on its second thread (the worker holds the first); an actor
        that is not placed yet has none."""
        if self.actor is None or self.node is None:
            return "(the actor is not running yet)"
        ray = import_ray()
        try:
            return ray.get(self.actor.stacks.remote(), timeout=REPORT_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - a report, never a second failure
            return f"(the actor did not say: {type(exc).__name__})"

    def kill(self) -> None:
        """End the actor at once, as a crash would (tests, and a replica that stopped answering)."""
        if self.actor is not None:
            import_ray().kill(self.actor, no_restart=True)

    def close(self, timeout: float = 5.0) -> None:
        ray = import_ray()
        if self.actor is not None and self.ready and self.exit_reason() is None:  # else: nothing to drain
            with contextlib.suppress(Exception):
                self.socket.send(self.codec.encode(Shutdown()), zmq.NOBLOCK)
            ray.wait([self.done], timeout=timeout)
        if self.actor is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.actor, no_restart=True)
        self.actor = self.done = self._describe = None
        self.socket.close(linger=0)
        self.dead = True
