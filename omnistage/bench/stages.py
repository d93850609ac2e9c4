"""Per-stage breakdown of a run against an omnistage server, read from its Prometheus `/metrics`: how many
requests each stage was given during the run, the most it held and queued at once, its peak KV-cache use,
and the server's own mean TTFT / time to first audio. Another server (no `omnistage_` series) gets none.

The stage gauges are sampled while the run goes on (peaks) and diffed between the start and the end
(counts), so the breakdown covers this run only even on a server that has served before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

SAMPLE_S = 0.25
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(client: httpx.AsyncClient) -> Series | None:
    """`{(sample name, sorted labels): value}` of the server's omnistage series; None when it has none."""
    try:
        resp = await client.get("/metrics")
    except httpx.HTTPError:
        return None
    if resp.status_code != 200 or "omnistage_" not in resp.text:
        return None
    series: Series = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            if sample.name.startswith("omnistage_"):
                series[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return series


class StageMonitor:
    """Samples `/metrics` from `start()` to `stop()`; `breakdown()` then summarizes model `model`'s stages."""

    def __init__(self, client: httpx.AsyncClient, model: str):
        self.client, self.model = client, model
        self.first: Series | None = None
        self.samples: list[Series] = []
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self.first = await scrape(self.client)
        if self.first is not None:
            self._task = asyncio.create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            last = await scrape(self.client)
            if last is not None:
                self.samples.append(last)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            sample = await scrape(self.client)
            if sample is not None:
                self.samples.append(sample)

    def breakdown(self) -> dict[str, Any] | None:
        if self.first is None or not self.samples:
            return None
        last = self.samples[-1]
        fields = ("requests", "peak_requests", "peak_queue_depth", "peak_kv_cache_usage")
        stages: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: dict.fromkeys(fields, 0.0))
        for key, value in last.items():
            stage = self._stage(key, "omnistage_stage_requests_started")
            if stage is not None:
                stages[stage]["requests"] += value - self.first.get(key, 0.0)
        peaks = {
            "peak_requests": "omnistage_stage_requests",
            "peak_queue_depth": "omnistage_stage_queue_depth",
            "peak_kv_cache_usage": "omnistage_stage_kv_cache_usage",
        }
        for sample in self.samples:
            for field, name in peaks.items():
                totals: dict[tuple[str, str], float] = defaultdict(float)
                for key, value in sample.items():
                    stage = self._stage(key, name)
                    if stage is not None:  # replicas add up (KV usage: the busiest replica)
                        totals[stage] = max(totals[stage], value) if "kv" in name else totals[stage] + value
                for stage, total in totals.items():
                    stages[stage][field] = max(stages[stage][field], total)
        rows = [
            {"stage": int(sid) if sid.isdigit() else sid, "stage_name": name, **values}
            for (sid, name), values in sorted(stages.items())
        ]
        return {
            "stages": rows,
            "server_mean_ttft_ms": self._mean_ms("omnistage_time_to_first_token_seconds", last),
            "server_mean_ttfa_ms": self._mean_ms("omnistage_time_to_first_audio_seconds", last),
        }

    def _stage(self, key: tuple[str, tuple[tuple[str, str], ...]], name: str) -> tuple[str, str] | None:
        sample_name, labels = key
        label = dict(labels)
        if sample_name != name or label.get("model") != self.model:
            return None
        return label.get("stage", ""), label.get("stage_name", "")

    def _mean_ms(self, histogram: str, last: Series) -> float | None:
        """Mean of the histogram's observations made during the run, in ms."""
        labels = (("model", self.model),)
        sum_key, count_key = (f"{histogram}_sum", labels), (f"{histogram}_count", labels)
        count = last.get(count_key, 0.0) - self.first.get(count_key, 0.0)
        if count <= 0:
            return None
        return (last.get(sum_key, 0.0) - self.first.get(sum_key, 0.0)) / count * 1e3
