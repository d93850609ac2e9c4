"""Prometheus metrics of one server: per-route traffic and latency, per-model TTFT and time to first
audio, and per-stage queue depth and KV-cache usage (read from the runtime at scrape time).

Each app owns its registry, so several servers (or tests) in one process never share counters.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnistage.serving.loop_watch import LoopWatch

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Engine stats keys, in order of preference, that mean "requests waiting" and "KV-cache fraction used".
QUEUE_KEYS = ("num_waiting", "waiting", "queue_depth", "num_queued")
KV_KEYS = ("kv_cache_usage", "kv_usage", "kv_cache_utilization")


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.loop = LoopWatch(r)  # the event loop's stalls (serving/loop_watch.py)
        self.slow_clients = Counter(
            "omnistage_slow_clients_dropped",
            "connections dropped because the client took nothing sent to it for --send-timeout",
            ["kind"],
            registry=r,
        )
        self.requests = Counter(
            "omnistage_http_requests",
            "HTTP requests by route, method and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "omnistage_http_request_duration_seconds",
            "Time from request start to the last response byte",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "omnistage_time_to_first_token_seconds",
            "Time to the first text token",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttfa = Histogram(
            "omnistage_time_to_first_audio_seconds",
            "Time to the first audio chunk",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "omnistage_requests_in_flight", "Requests being generated", ["model"], registry=r
        )
        self.finished = Counter(
            "omnistage_requests_finished",
            "Generation requests by how they ended",
            ["model", "finish_reason"],
            registry=r,
        )
        labels = ["model", "stage", "stage_name", "replica"]
        self.stage_requests = Gauge(
            "omnistage_stage_requests", "Requests held by a stage engine", labels, registry=r
        )
        self.stage_queue = Gauge(
            "omnistage_stage_queue_depth", "Requests waiting in a stage engine", labels, registry=r
        )
        self.stage_started = Gauge(
            "omnistage_stage_requests_started",
            "Requests a stage has been given since it started",
            labels,
            registry=r,
        )
        self.stage_kv = Gauge(
            "omnistage_stage_kv_cache_usage", "KV-cache fraction in use (AR stages)", labels, registry=r
        )
        self.stage_alive = Gauge(
            "omnistage_stage_alive",
            "1 while the stage is alive",
            ["model", "stage", "stage_name"],
            registry=r,
        )

    def observe_stages(self, model: str, stats: dict[str, Any], health: dict[str, Any]) -> None:
        """Refresh the per-stage gauges from `AsyncOmni.stats()` and `health()`."""
        for gauge in (self.stage_requests, self.stage_queue, self.stage_kv, self.stage_started):
            _drop_model(gauge, model)
        names = {s.get("stage_id"): s.get("name", "") for s in health.get("stages", [])}
        for entry in _stage_entries(stats):
            stage_id = entry.get("stage_id")
            labels = (model, str(stage_id), str(names.get(stage_id, "")), str(entry.get("replica", 0)))
            self.stage_requests.labels(*labels).set(float(entry.get("num_requests", 0) or 0))
            self.stage_started.labels(*labels).set(float(entry.get("requests_started", 0) or 0))
            queue = _first(entry, QUEUE_KEYS)
            if queue is not None:
                self.stage_queue.labels(*labels).set(float(queue))
            kv = _first(entry, KV_KEYS)
            if kv is not None:
                self.stage_kv.labels(*labels).set(float(kv))
        for stage in health.get("stages", []):
            self.stage_alive.labels(model, str(stage.get("stage_id", "")), str(stage.get("name", ""))).set(
                1.0 if stage.get("alive", False) else 0.0
            )

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _stage_entries(stats: dict[str, Any]) -> Iterable[dict[str, Any]]:
    """Per-replica engine stats: `{"stage_id", "replica", "result": {engine stats}}` entries, flattened."""
    for entry in stats.get("stages", []):
        if isinstance(entry, dict):
            result = entry.get("result")
            yield {**entry, **result} if isinstance(result, dict) else entry


def _first(entry: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = entry.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def _drop_model(gauge: Gauge, model: str) -> None:
    """Forget a model's old stage series so a replica that went away does not linger."""
    for labels in list(gauge._metrics):  # prometheus_client keeps children keyed by label tuples
        if labels and labels[0] == model:
            gauge.remove(*labels)


class MetricsMiddleware:
    """Counts requests and measures their latency up to the last body byte (streams included)."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.requests.labels(path, scope["method"], str(status)).inc()
            self.metrics.latency.labels(path, scope["method"]).observe(time.perf_counter() - start)
