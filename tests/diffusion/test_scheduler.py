"""Scheduling policy, without models: batch keys, admission waits, shortest-remaining-work-first."""

from __future__ import annotations

import pytest
import torch

from omnistage.params import DiffusionParams
from omnistage.stages.diffusion.request import DiffusionRequest, StepState
from omnistage.stages.diffusion.scheduler import RequestBatchScheduler, StepScheduler

pytestmark = pytest.mark.unit


def req(rid: str, frames: int = 5, steps: int = 4, arrival: float = 0.0, priority: int = 0, height: int = 32):
    params = DiffusionParams(height=height, width=32, num_frames=frames, num_inference_steps=steps, seed=0)
    return DiffusionRequest(rid, "p", params, priority=priority, arrival_time=arrival)


def prepared(r: DiffusionRequest, done_steps: int = 0) -> DiffusionRequest:
    r.state = StepState(torch.zeros(1), torch.arange(r.num_steps), None, {}, step_index=done_steps)
    return r


def shape_key(r: DiffusionRequest) -> tuple:
    return (r.params.height, r.params.num_frames)


def volume(r: DiffusionRequest) -> float:
    return float(r.params.height * r.params.num_frames)


def test_request_waves_group_by_key_in_arrival_order():
    s = RequestBatchScheduler(shape_key, max_num_seqs=2)
    for r in [req("a"), req("b", frames=9), req("c"), req("d")]:
        s.add(r)
    assert [r.request_id for r in s.next_wave(now=10).requests] == ["a", "c"]
    assert [r.request_id for r in s.next_wave(now=10).requests] == ["b"]
    assert [r.request_id for r in s.next_wave(now=10).requests] == ["d"]
    assert s.next_wave(now=10).requests == []


def test_request_waves_honour_priority():
    s = RequestBatchScheduler(shape_key, max_num_seqs=4)
    s.add(req("low", frames=9, arrival=0))
    s.add(req("high", arrival=1, priority=5))
    assert [r.request_id for r in s.next_wave(now=10).requests] == ["high"]


def test_admission_wait_holds_a_partial_batch_until_quiet_or_deadline():
    s = RequestBatchScheduler(shape_key, max_num_seqs=4, max_wait_ms=100)
    s.add(req("a", arrival=0.0))
    wave = s.next_wave(now=0.001)
    assert wave.requests == [] and wave.wait_s > 0
    s.add(req("b", arrival=0.015))
    assert s.next_wave(now=0.02).requests == []  # arrivals still coming: wait for the stable window
    assert [r.request_id for r in s.next_wave(now=0.04).requests] == ["a", "b"]  # 20 ms of quiet


def test_admission_wait_ends_when_the_batch_is_full():
    s = RequestBatchScheduler(shape_key, max_num_seqs=2, max_wait_ms=1000)
    s.add(req("a", arrival=0.0))
    s.add(req("b", arrival=0.0))
    assert len(s.next_wave(now=0.0).requests) == 2


def test_step_scheduler_admits_up_to_capacity_and_groups_by_key():
    s = StepScheduler(shape_key, volume, max_num_seqs=3)
    for r in [req("a"), req("b"), req("long", frames=81), req("c")]:
        s.add(r)
    admitted = s.admit(now=0)
    assert len(admitted) == 3 and len(s.waiting) == 1
    for r in admitted:
        prepared(r)
    group = s.next_group(now=0)
    assert {r.request_id for r in group} <= {"a", "b", "c"} and len(group) >= 2
    assert all(shape_key(r) == shape_key(group[0]) for r in group)


def test_srpt_runs_short_requests_before_a_long_video():
    s = StepScheduler(shape_key, volume, max_num_seqs=8)
    long_video = prepared(req("long", frames=81, steps=20, arrival=0.0))
    shorts = [prepared(req(f"s{i}", frames=9, steps=20, arrival=0.1)) for i in range(3)]
    for r in [long_video, *shorts]:
        s.add(r)
    s.admit(now=0.2)
    assert {r.request_id for r in s.next_group(now=0.2)} == {"s0", "s1", "s2"}


def test_fcfs_runs_the_oldest_request_first():
    s = StepScheduler(shape_key, volume, max_num_seqs=8, policy="fcfs")
    s.add(prepared(req("long", frames=81, arrival=0.0)))
    s.add(prepared(req("short", frames=9, arrival=0.1)))
    s.admit(now=0.2)
    assert [r.request_id for r in s.next_group(now=0.2)] == ["long"]


def test_aging_lets_a_long_request_overtake_eventually():
    s = StepScheduler(shape_key, volume, max_num_seqs=8, aging_s=1.0)
    s.add(prepared(req("long", frames=81, steps=4, arrival=0.0)))
    s.add(prepared(req("short", frames=9, steps=4, arrival=99.0)))
    s.admit(now=100.0)
    assert [r.request_id for r in s.next_group(now=100.0)] == ["long"]


def test_remaining_work_shrinks_as_steps_complete():
    s = StepScheduler(shape_key, volume, max_num_seqs=8)
    s.add(prepared(req("fresh", frames=9, steps=20)))
    s.add(prepared(req("almost", frames=81, steps=20), done_steps=19))
    s.admit(now=0)
    assert [r.request_id for r in s.next_group(now=0)] == ["almost"]


def test_remove_forgets_waiting_and_running_requests():
    s = StepScheduler(shape_key, volume, max_num_seqs=1)
    s.add(req("a"))
    s.add(req("b"))
    s.admit(now=0)
    assert s.remove("a").request_id == "a" and s.remove("b").request_id == "b"
    assert len(s) == 0 and s.remove("a") is None


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match="step_policy"):
        StepScheduler(shape_key, volume, max_num_seqs=1, policy="random")


def test_token_budget_caps_a_group_but_always_runs_the_most_urgent():
    tokens = lambda r: r.params.num_frames * 10  # noqa: E731
    s = StepScheduler(shape_key, volume, max_num_seqs=8, tokens=tokens, token_budget=100)
    for i, done in enumerate([3, 1, 2]):  # 50 tokens each: two fit in the budget
        s.add(prepared(req(f"r{i}", frames=5, steps=4), done_steps=done))
    s.add(prepared(req("huge", frames=81, steps=1)))  # 810 tokens, alone over budget
    s.admit(now=0)
    assert [r.request_id for r in s.next_group(now=0)] == ["r0", "r2"]  # least remaining work first
    s.remove("r0"), s.remove("r1"), s.remove("r2")
    assert [r.request_id for r in s.next_group(now=0)] == ["huge"]
