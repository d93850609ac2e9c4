"""The replicas of one logical stage, and which replica holds which request.

Binding is sticky: every message about a request goes to the replica that took it, and the least-loaded
live replica takes new requests.
"""

from __future__ import annotations

from omnistage.config.pipeline import StageSpec
from omnistage.errors import StageDeadError
from omnistage.runtime.stage_client import StageClient


class StagePool:
    def __init__(self, stage: StageSpec, replicas: list[StageClient]):
        self.stage = stage
        self.replicas = replicas

    @property
    def alive(self) -> bool:
        return any(r.alive for r in self.replicas)

    @property
    def ready(self) -> bool:
        return all(r.ready and r.alive for r in self.replicas)

    def pick(self) -> StageClient:
        live = [r for r in self.replicas if r.alive and r.ready]
        if not live:
            raise StageDeadError("no live replica", stage_id=self.stage.stage_id, stage_name=self.stage.name)
        return min(live, key=lambda r: r.load)

    def replica(self, index: int) -> StageClient:
        return self.replicas[index]
