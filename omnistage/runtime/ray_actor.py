"""The Ray actor one stage replica runs in.

It runs the stage process's worker (`runtime/stage_process.py:run_config`) unchanged: the same ZMQ sockets and
msgspec frames, connected over TCP to the orchestrator instead of IPC, so the orchestrator treats an actor
like a process. Ray only places it (resources, nodes) and tells us when it dies.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import msgspec


class StageActor:
    """Threaded (max_concurrency 2): `run` holds one thread for the worker's life, `describe` answers on the
    other."""

    def describe(self) -> dict[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        return {"pid": os.getpid(), "node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address()}

    def stacks(self) -> str:
        """Every thread's stack but this one's (what a start-up timeout reports a stuck actor doing)."""
        import threading
        import traceback

        names = {t.ident: t.name for t in threading.enumerate()}
        me = threading.get_ident()
        return "\n".join(
            f"thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frame)[-25:])
            for ident, frame in sys._current_frames().items()
            if ident != me
        )

    def run(self, config: bytes, sys_path: list[str], env: dict[str, str]) -> bool:
        """Serve the stage until Shutdown. The driver's import paths come first so that the stage's
        engine and processors (import paths in the config) resolve as they do in the driver."""
        import ray

        from omnistage.runtime.launch import WorkerConfig
        from omnistage.runtime.stage_process import run_config

        sys.path[:0] = [p for p in sys_path if p and p not in sys.path]
        os.environ.update(env)
        cfg = msgspec.json.decode(config, type=WorkerConfig)
        cfg.host = cfg.host or ray.util.get_node_ip_address()
        logging.basicConfig(
            level=os.environ.get("OMNISTAGE_LOG_LEVEL", "WARNING"),
            format=f"%(asctime)s [stage {cfg.stage['stage_id']}.{cfg.replica}] %(levelname)s %(message)s",
        )
        return run_config(cfg)
