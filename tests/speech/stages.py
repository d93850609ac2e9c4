"""What the server's /metrics says about its stages: whether a model's stages hold any request, and how
many of its requests ended aborted (the server's own count, so a test can tell an abort from a finish)."""

from __future__ import annotations

import httpx

from tests.support.polling import wait_until


def metric(http: httpx.Client, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` (0 if there is none yet)."""
    total = 0.0
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def in_stages(http: httpx.Client, model: str) -> float:
    return metric(http, "omnistage_stage_requests", model=model)


def aborted(http: httpx.Client, model: str) -> float:
    return metric(http, "omnistage_requests_finished_total", model=model, finish_reason="abort")


def wait_idle(http: httpx.Client, model: str) -> None:
    """Until no stage of `model` holds a request and the server runs none of its requests."""

    def idle() -> bool:
        in_flight = metric(http, "omnistage_requests_in_flight", model=model)
        return in_stages(http, model) == 0 and in_flight == 0

    wait_until(idle, 60, f"{model} idle")
