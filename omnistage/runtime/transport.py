"""How the orchestrator reaches each stage replica: the client for its placement (a thread, a process,
a Ray actor) and the connectors its edges use (shared memory, socket frames, TCP). One factory, so the
orchestrator only routes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from omnistage.config.deploy import DeploySpec
from omnistage.config.pipeline import PipelineSpec, StageSpec, ref_to_path
from omnistage.runtime.messages import INLINE_LIMIT
from omnistage.runtime.ray_client import RayStageClient, driver_ip
from omnistage.runtime.stage_board import BoardSeat
from omnistage.runtime.stage_client import InlineStageClient, ProcessStageClient, StageClient


class Transport:
    def __init__(
        self,
        pipeline: PipelineSpec,
        deploy: DeploySpec,
        model_dir: str | None,
        *,
        ipc_dir: Path,
        zmq_context: zmq.Context,
        outbox: str,
        ray_outbox: str | None,
        on_message: Callable[[Any], None],
        on_message_threadsafe: Callable[[Any], None],
    ):
        self.pipeline, self.deploy, self.model_dir = pipeline, deploy, model_dir
        self.ipc_dir, self.zmq, self.outbox, self.ray_outbox = ipc_dir, zmq_context, outbox, ray_outbox
        self.on_message, self.on_message_threadsafe = on_message, on_message_threadsafe

    def client(self, spec: StageSpec, replica: int, board_seat: BoardSeat | None) -> StageClient:
        """A new client for replica `replica` of `spec`, by its placement; not started."""
        settings = self.deploy.stage(spec.stage_id)
        stream = spec.final_output or any(
            self.deploy.edge_async(self.pipeline, c.stage_id) for c in self.pipeline.consumers(spec.stage_id)
        )
        common = dict(
            stage=spec,
            deploy=settings,
            replica=replica,
            model_dir=self.model_dir,
            stream_tensors=stream,
            board_seat=board_seat,
            family=ref_to_path(self.pipeline.family),
        )
        if settings.placement == "inline":
            return InlineStageClient(on_message=self.on_message_threadsafe, **common)
        if settings.placement == "ray":
            common["board_seat"] = None  # the board is shared memory: one host's
            return RayStageClient(
                on_message=self.on_message,
                outbox=self.ray_outbox,
                host=driver_ip(),
                output_connector=self.output_connector(spec),
                inline_limit=self.inline_limit(spec),
                zmq_context=self.zmq,
                **common,
            )
        return ProcessStageClient(
            on_message=self.on_message,
            ipc_dir=self.ipc_dir,
            outbox=self.outbox,
            owner_pid=os.getpid(),
            output_connector=self.output_connector(spec),
            input_connector=self.input_connector(spec),
            zmq_context=self.zmq,
            inline_limit=self.inline_limit(spec),
            **common,
        )

    def edge_type(self, src: int, dst: int) -> str:
        return self.deploy.stage(dst).connector_from(src, self.deploy.connectors)["type"]

    def output_connector(self, spec: StageSpec) -> str:
        """One per producer: TCP if any edge out of it asks for it; a Ray actor's outputs otherwise ride
        in its frames (shared memory is one host's); a process's go through shared memory unless every edge
        says socket."""
        kinds = {self.edge_type(spec.stage_id, c.stage_id) for c in self.pipeline.consumers(spec.stage_id)}
        if "tcp" in kinds:
            return "tcp"
        if self.deploy.stage(spec.stage_id).placement == "ray":
            return "socket"
        return "socket" if kinds == {"socket"} else "shm"

    def inline_limit(self, spec: StageSpec) -> int:
        """The smallest `inline_limit` the TCP connectors of its outgoing edges name (bytes up to which a
        payload rides in the frame rather than waiting at the producer)."""
        specs = [
            self.deploy.stage(c.stage_id).connector_from(spec.stage_id, self.deploy.connectors)
            for c in self.pipeline.consumers(spec.stage_id)
        ]
        limits = [s.get("inline_limit") for s in specs]
        return min([int(n) for n in limits if n is not None], default=INLINE_LIMIT)

    def input_connector(self, spec: StageSpec) -> str:
        kinds = {self.edge_type(src, spec.stage_id) for src in spec.inputs}
        return "socket" if kinds == {"socket"} else "shm"
