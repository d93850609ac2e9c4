"""Step-mode behaviour: progress as partial outputs, abort between steps, the scheduling policy, one terminal
output per request."""

from __future__ import annotations

import pytest

from omnistage import media
from omnistage.outputs import Progress
from tests.diffusion.helpers import BASE, drain, final_tensor, make_engine, reference, request

pytestmark = pytest.mark.engine
WAN = {**BASE, "num_frames": 5}


@pytest.fixture(scope="module")
def wan():
    return make_engine("tiny-wan21-t2v", execution="step", step_token_budget=0)


def test_progress_is_reported_step_by_step(wan):
    wan.add_request(request("p", "a cat", **{**WAN, "num_inference_steps": 3}, seed=1))
    outputs = drain(wan)["p"]
    partial, final = outputs[:-1], outputs[-1]
    assert [o.progress for o in partial] == [Progress(1, 3), Progress(2, 3)]
    assert not any(o.finished for o in partial)
    assert final.finished and final.finish_reason == "stop"
    assert final.metrics["num_steps"] == 3 and final.metrics["computed_steps"] == 3


def test_abort_between_steps_stops_the_request_and_frees_it(wan):
    wan.add_request(request("long", "a cat", **{**WAN, "num_inference_steps": 4}, seed=1))
    wan.add_request(request("keep", "a dog", **WAN, seed=2))
    first = wan.step()
    assert {o.request_id for o in first} == {"long", "keep"}  # both joined the first step's forward
    assert wan.stats()["num_requests"] == 2
    wan.abort("long")
    assert "long" not in wan.requests and wan.stats()["num_requests"] == 1
    rest = drain(wan)
    assert "long" not in rest
    assert rest["keep"][-1].finished and rest["keep"][-1].error is None
    assert wan.stats()["num_requests"] == 0


def test_on_cpu_each_forward_runs_only_the_most_urgent_request_by_default():
    eng = make_engine("tiny-wan21-t2v", execution="step")
    eng.add_request(request("long", "a cat", **{**WAN, "num_inference_steps": 3}, seed=1))
    eng.add_request(request("short", "a dog", **{**WAN, "num_inference_steps": 2}, seed=2))
    advanced = []
    while eng.has_work():
        advanced.append(sorted(o.request_id for o in eng.step()))
    assert advanced == [["short"], ["short"], ["long"], ["long"], ["long"]]


def test_abort_of_a_waiting_request_in_request_mode():
    eng = make_engine("tiny-wan21-t2v", execution="request")
    eng.add_request(request("a", "a cat", **WAN, seed=1))
    eng.add_request(request("b", "a cat", **{**WAN, "height": 48}, seed=1))
    assert [o.request_id for o in eng.step()] == ["a"]
    eng.abort("b")
    assert not eng.has_work() and eng.step() == [] and eng.stats()["num_requests"] == 0


def test_short_requests_finish_before_a_long_video(wan):
    """SRPT: a 9-frame video that arrived first yields to two 5-frame requests."""
    wan.add_request(request("long", "a cat", **{**WAN, "num_frames": 9, "num_inference_steps": 3}, seed=1))
    wan.add_request(request("s1", "a dog", **WAN, seed=2))
    wan.add_request(request("s2", "a fox", **WAN, seed=3))
    order = []
    while wan.has_work():
        order += [o.request_id for o in wan.step() if o.finished]
    assert order == ["s1", "s2", "long"] or order == ["s2", "s1", "long"]


def test_fcfs_policy_keeps_arrival_order():
    eng = make_engine("tiny-wan21-t2v", execution="step", step_policy="fcfs")
    eng.add_request(request("long", "a cat", **{**WAN, "num_frames": 9}, seed=1))
    eng.add_request(request("short", "a dog", **WAN, seed=2))
    order = []
    while eng.has_work():
        order += [o.request_id for o in eng.step() if o.finished]
    assert order == ["long", "short"]


def test_default_output_is_uint8_video_with_fps(wan):
    wan.add_request(request("v", "a cat", **{**WAN, "output_format": None, "fps": 8}, seed=5))
    out = drain(wan)["v"][-1]
    video = final_tensor(out)
    assert video.dtype.is_floating_point is False and video.shape == (1, 5, 32, 32, 3)
    assert out.fps == 8 and out.data["seed"] == 5
    expected = media.to_uint8(reference("tiny-wan21-t2v", "a cat", seed=5))
    assert (video.int() - expected.int()).abs().max() <= 1  # float rounding at .5 boundaries


def test_stats_and_duplicate_ids(wan):
    wan.add_request(request("dup", "a cat", **WAN, seed=1))
    with pytest.raises(ValueError, match="already active"):
        wan.add_request(request("dup", "a cat", **WAN, seed=1))
    assert wan.stats()["num_waiting"] == 1 and wan.stats()["mode"] == "step"
    drain(wan)
    assert wan.stats()["num_requests"] == 0
