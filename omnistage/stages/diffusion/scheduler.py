"""Who runs next. The scheduler decides; the runner executes; the engine loops.

Request mode (`RequestBatchScheduler`): waves of whole requests. The oldest waiting request defines the wave's
batch key; every waiting request with that key (up to `max_num_seqs`) joins it. With
`request_batch_max_wait_ms > 0` an idle engine holds a partial wave back until it is full, arrivals have been
quiet for a short stable window, or the oldest request has waited the maximum.

Step mode (`StepScheduler`): up to `max_num_seqs` requests are admitted (encoded, latents drawn) and each
tick one *group* of admitted requests with the same step key advances by one denoise step in one transformer
forward. Requests join and leave at step boundaries. An optional token budget (`step_token_budget`: latent
tokens x rows per forward) caps the group; the most urgent request always runs. The policy picks the group:
  - "srpt" (default): shortest remaining work first, where work = remaining steps x latent volume x CFG
    branches, discounted by how long the request has waited (`aging_s`), so short requests overtake long
    videos while a long request's priority grows until it runs;
  - "fcfs": the group holding the oldest request.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from omnistage.stages.diffusion.request import DiffusionRequest

Key = tuple


@dataclasses.dataclass
class Wave:
    """What request mode runs next: a batch, or how long to hold back for more arrivals."""

    requests: list[DiffusionRequest]
    wait_s: float = 0.0


class RequestBatchScheduler:
    def __init__(self, key: Callable[[DiffusionRequest], Key], max_num_seqs: int, max_wait_ms: float = 0.0):
        self.key = key
        self.max_num_seqs = max_num_seqs
        self.max_wait_s = max(0.0, max_wait_ms) / 1000.0
        self.waiting: list[DiffusionRequest] = []

    def add(self, req: DiffusionRequest) -> None:
        self.waiting.append(req)

    def remove(self, request_id: str) -> bool:
        before = len(self.waiting)
        self.waiting = [r for r in self.waiting if r.request_id != request_id]
        return len(self.waiting) != before

    def __len__(self) -> int:
        return len(self.waiting)

    def next_wave(self, now: float | None = None) -> Wave:
        if not self.waiting:
            return Wave([])
        now = time.monotonic() if now is None else now
        head = min(self.waiting, key=lambda r: (-r.priority, r.arrival_time))
        head_key = self.key(head)
        batch = [r for r in self.waiting if self.key(r) == head_key][: self.max_num_seqs]
        wait = self._admission_wait(batch, now)
        if wait > 0:
            return Wave([], wait)
        ids = {r.request_id for r in batch}
        self.waiting = [r for r in self.waiting if r.request_id not in ids]
        return Wave(batch)

    def _admission_wait(self, batch: list[DiffusionRequest], now: float) -> float:
        """Seconds to hold a partial wave back for compatible arrivals (0: run now)."""
        if self.max_wait_s <= 0 or self.max_num_seqs <= 1 or len(batch) >= self.max_num_seqs:
            return 0.0
        stable_window = min(0.05, self.max_wait_s / 5)
        deadline = min(r.arrival_time for r in batch) + self.max_wait_s
        quiet_until = max(r.arrival_time for r in self.waiting) + stable_window
        return max(0.0, min(deadline, quiet_until) - now)


class StepScheduler:
    def __init__(
        self,
        key: Callable[[DiffusionRequest], Key],
        cost: Callable[[DiffusionRequest], float],
        max_num_seqs: int,
        policy: str = "srpt",
        aging_s: float = 30.0,
        tokens: Callable[[DiffusionRequest], int] | None = None,
        token_budget: int | None = None,
    ):
        if policy not in ("srpt", "fcfs"):
            raise ValueError(f"step_policy must be 'srpt' or 'fcfs', got {policy!r}")
        self.key = key
        self.cost = cost
        self.max_num_seqs = max_num_seqs
        self.policy = policy
        self.aging_s = aging_s
        self.tokens = tokens
        self.token_budget = token_budget
        self.waiting: list[DiffusionRequest] = []
        self.running: list[DiffusionRequest] = []

    def add(self, req: DiffusionRequest) -> None:
        self.waiting.append(req)

    def remove(self, request_id: str) -> DiffusionRequest | None:
        for queue in (self.waiting, self.running):
            for i, req in enumerate(queue):
                if req.request_id == request_id:
                    return queue.pop(i)
        return None

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    def _score(self, req: DiffusionRequest, now: float) -> tuple:
        if self.policy == "fcfs":
            return (-req.priority, req.arrival_time)
        remaining = self.cost(req) * (req.num_steps - req.steps_done)
        return (
            -req.priority,
            remaining / (1.0 + max(0.0, now - req.arrival_time) / self.aging_s),
            req.arrival_time,
        )

    def admit(self, now: float | None = None) -> list[DiffusionRequest]:
        """Waiting requests that join the running set now (the engine prepares them)."""
        now = time.monotonic() if now is None else now
        admitted = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            best = min(self.waiting, key=lambda r: self._score(r, now))
            self.waiting.remove(best)
            self.running.append(best)
            admitted.append(best)
        return admitted

    def next_group(self, now: float | None = None) -> list[DiffusionRequest]:
        """The admitted, prepared requests that advance one step together this tick."""
        now = time.monotonic() if now is None else now
        ready = [r for r in self.running if r.state is not None and not r.state.done]
        if not ready:
            return []
        ready.sort(key=lambda r: self._score(r, now))
        best_key = self.key(ready[0])
        group = [r for r in ready if self.key(r) == best_key]
        if self.token_budget is None or self.tokens is None:
            return group
        chosen, used = [], 0
        for req in group:
            need = self.tokens(req)
            if chosen and used + need > self.token_budget:
                break
            chosen.append(req)
            used += need
        return chosen

    def finish(self, request_id: str) -> None:
        self.remove(request_id)
