"""Placement ray on a local two-node cluster (one per module). The toy speech pipeline: stages pinned to
nodes, the TCP connector on both edges, two vocoder replicas (one per node) sharing bursts, abort, sleep and
wake, a killed actor, a restarted replica, nothing left after shutdown. Tiny Qwen2.5-Omni with its stages as
actors on both nodes: equal to process placement (same worker, same threads: the same numbers)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import torch

from omnistage import AsyncOmni, SamplingParams
from omnistage.errors import StageDeadError, StageError, StartupTimeoutError
from omnistage.families.llm.tiny import tiny_llm_dir
from omnistage.families.qwen2_5_omni.tiny import qwen2_5_omni_dir
from omnistage.serving.app import create_app
from tests.qwen2_5_omni.conftest import PROMPTS as OMNI_PROMPTS
from tests.qwen2_5_omni.conftest import greedy_params as omni_params
from tests.ray.conftest import actor_states, pinned_overrides, ray
from tests.startup.stuck_loader import LOCK_VARIABLE, doing_in
from tests.support.polling import wait_until, wait_until_async
from tests.support.toy_stages import open_gate, speech_pipeline

pytestmark = pytest.mark.e2e

PROMPTS = ["same prompt", "another one", "third"]
PARAMS = SamplingParams(max_tokens=6)


def toy_deploy(gates) -> tuple[dict, dict]:
    """Every tensor over the TCP connector (inline_limit 0: even the thinker's 64-byte hidden rows)."""
    deploy = {"connectors": {"wire": {"type": "tcp", "inline_limit": 0}}}
    overrides = pinned_overrides(max_restarts=0)  # a killed actor stays dead until the test restarts it
    overrides["0"]["engine_args"] = {"gate_dir": str(gates)}
    overrides["1"]["input_connectors"] = {"from_stage_0": "wire"}
    overrides["2"]["input_connectors"] = {"from_stage_1": "wire"}
    return deploy, overrides


@pytest.fixture(scope="module")
def gates(tmp_path_factory):
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def ray_omni(ray_cluster, gates):
    deploy, overrides = toy_deploy(gates)
    omni = AsyncOmni(speech_pipeline(), deploy, stage_overrides=overrides, startup_timeout=120)
    yield omni
    omni._close()


async def final_of(omni, prompt, **kw):
    outs = [out async for out in omni.generate(prompt, PARAMS, **kw)]
    assert sum(o.finished for o in outs) == 1 and outs[-1].finished
    return outs[-1]


async def per_replica(omni, key: str = "requests_started") -> dict[tuple[int, int], int]:
    return {(s["stage_id"], s["replica"]): s["result"][key] for s in (await omni.stats())["stages"]}


async def wait_idle(omni):
    async def idle():
        stats = await omni.stats()
        busy = [s for s in stats["stages"] if s["result"]["num_requests"] or s["result"]["worker_requests"]]
        return stats if not busy and stats["requests"]["tracked"] == 0 else None

    return await wait_until_async(idle, 60, "every actor idle")


async def test_pinned_stages_equal_process_placement_and_report_each_replica(ray_omni):
    nodes = {
        (s["stage_id"], r["replica"]): r["node"]["node_id"]
        for s in ray_omni.health()["stages"]
        for r in s["replicas"]
    }
    assert nodes[(0, 0)] != nodes[(1, 0)] and nodes[(2, 0)] != nodes[(2, 1)]
    ray_finals = [await final_of(ray_omni, p) for p in PROMPTS]
    async with AsyncOmni(speech_pipeline(), placement="process") as local:
        process_finals = [await final_of(local, p) for p in PROMPTS]
    for got, want in zip(ray_finals, process_finals, strict=True):
        assert got.error is None and got.token_ids == want.token_ids and len(got.token_ids) == 6
        assert torch.equal(got.audio, want.audio)
    # every tensor crossed by reference (a TCP key), none inline
    edge = (await ray_omni.stats())["edges"]["0->1"]
    assert edge["transfers"] >= 3 * 6 and edge["shm_transfers"] == edge["transfers"]

    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app({"toy": ray_omni})), base_url="http://test"
    )
    health = await client.get("/health")
    assert health.status_code == 200
    replicas = health.json()["models"]["toy"]["stages"][2]["replicas"]
    assert [r["alive"] for r in replicas] == [True, True] and all(r["node"]["node_ip"] for r in replicas)
    metrics = (await client.get("/metrics")).text
    assert 'stage="2"' in metrics and 'replica="1"' in metrics and 'replica="0"' in metrics
    await client.aclose()


async def test_replicas_on_two_nodes_share_a_burst(ray_omni):
    before = await per_replica(ray_omni)
    finals = await asyncio.gather(*(final_of(ray_omni, f"burst {i}") for i in range(8)))
    assert all(f.error is None and f.audio.shape == (6 * 12000,) for f in finals)
    after = await per_replica(ray_omni)
    shares = [after[(2, r)] - before[(2, r)] for r in (0, 1)]
    assert sum(shares) == 8 and min(shares) >= 1, shares


async def test_abort_reaches_every_actor(ray_omni):
    gen = ray_omni.generate("abort me HOLD:never", PARAMS, request_id="ray-abort")
    async for out in gen:
        if out.delta_audio is not None:  # the request is in all three stages now
            break
    await ray_omni.abort("ray-abort")
    rest = [out async for out in gen]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    stats = await wait_idle(ray_omni)
    assert len(stats["stages"]) == 4  # thinker, talker, two vocoders: each dropped it


async def test_sleep_and_wake_reach_every_actor(ray_omni):
    slept = await ray_omni.sleep(1)
    assert sorted((r["stage_id"], r["replica"]) for r in slept) == [(0, 0), (1, 0), (2, 0), (2, 1)]
    assert all(r["result"] is None for r in slept), slept  # the toy engines' sleep returns nothing
    pending = asyncio.ensure_future(final_of(ray_omni, "asleep"))
    woken = await ray_omni.wake_up()
    assert len(woken) == 4 and all(r["result"] is None for r in woken), woken
    final = await pending
    assert final.error is None and len(final.token_ids) == 6


async def test_killed_actor_fails_only_its_requests_and_a_restarted_replica_serves(ray_omni, gates):
    orch = ray_omni.orchestrator
    gens = [ray_omni.generate(f"k{i} HOLD:kill", PARAMS, request_id=f"kill-{i}") for i in range(4)]
    for gen in gens:  # each has audio: it is bound to a vocoder replica
        async for out in gen:
            if out.delta_audio is not None:
                break
    bound = {f"kill-{i}": orch.requests[f"kill-{i}"].bound[2] for i in range(4)}
    assert set(bound.values()) == {0, 1}, bound
    orch.pools[2].replica(0).kill()

    async def rest(gen):
        return [out async for out in gen][-1]

    victims = [rid for rid, r in bound.items() if r == 0]

    async def victims_failed() -> bool:
        return all(rid not in orch.requests for rid in victims)

    await wait_until_async(victims_failed, 60, "victims failed")
    open_gate(gates, "kill")
    finals = dict(zip(bound, await asyncio.gather(*(rest(g) for g in gens)), strict=True))
    for rid, final in finals.items():
        if bound[rid] == 0:
            assert isinstance(final.error, StageDeadError)
            assert "stage 2 (vocoder)" in str(final.error) and "replica 0" in str(final.error)
        else:
            assert final.error is None and final.audio.shape == (6 * 12000,)
    health = ray_omni.health()
    assert [r["alive"] for r in health["stages"][2]["replicas"]] == [False, True]
    assert all(s["alive"] for s in health["stages"])
    later = await asyncio.gather(*(final_of(ray_omni, f"later {i}") for i in range(2)))
    assert all(f.error is None for f in later)

    await asyncio.wrap_future(orch.run(orch.restart_replica(2, 0)))
    assert [r["alive"] and r["ready"] for r in ray_omni.health()["stages"][2]["replicas"]] == [True, True]
    finals = await asyncio.gather(*(final_of(ray_omni, f"after restart {i}") for i in range(4)))
    assert all(f.error is None for f in finals)
    assert (await per_replica(ray_omni))[(2, 0)] >= 1  # the new actor took some of them


def test_shutdown_leaves_no_actor_and_no_object(ray_omni):
    """Last in the module: closes the shared deployment."""
    assert actor_states().count("ALIVE") == 4
    ray_omni._close()
    wait_until(lambda: "ALIVE" not in actor_states(), 60, "every actor dead")
    refs = ray._private.worker.global_worker.core_worker.get_all_reference_counts()
    assert not refs, refs


def test_an_actor_no_node_can_host_is_named_at_start_up(ray_cluster):
    vocoder = {"stage_id": 2, "placement": "ray", "num_cpus": 0.5, "resources": {"gpu_node": 1}}
    deploy = {"placement": "inline", "stages": [vocoder]}  # the others start at once, on threads
    """No node carries `gpu_node`: start-up fails naming the replica and what it asks for, and the pending
    actor is removed."""
    waiting = r"stage 2 \(vocoder\) replica 0 \(Ray actor not placed yet.*gpu_node"
    with pytest.raises(StageError, match=waiting):
        AsyncOmni(speech_pipeline(), deploy, startup_timeout=3)
    wait_until(lambda: {"ALIVE", "PENDING_CREATION"}.isdisjoint(actor_states()), 60, "no actor left")


def test_an_actor_stuck_in_its_loader_is_named_with_its_stack(ray_cluster, tmp_path):
    """A placed actor whose model loader waits on a stale lock: start-up fails at its deadline, naming the
    replica and the wait it is stuck in (its threads' stacks, asked of the actor), and the actor is gone."""
    lock = tmp_path / "lock"
    lock.write_text("")
    stage = {"placement": "ray", "num_cpus": 0.5, "env": {LOCK_VARIABLE: str(lock)}}
    stage["engine_args"] = {"model_loader": "tests.startup.stuck_loader:wait_on_stale_lock"}
    # A fresh Ray worker imports torch and transformers before it reaches the loader: ~9 s on a quiet 2-core
    # machine, past 45 s on a loaded CI one. Its stack shows the wait, or the import the deadline caught.
    stuck = r"(?s)stage 0 \(llm\) replica 0 \(Ray actor placed.*startup_timeout_s of 20 s.*it was doing:"
    with pytest.raises(StartupTimeoutError, match=stuck) as failed:
        AsyncOmni(str(tiny_llm_dir("qwen2")), stage_overrides={"0": stage}, startup_timeout=20)
    assert doing_in(str(failed.value))
    wait_until(lambda: {"ALIVE", "PENDING_CREATION"}.isdisjoint(actor_states()), 60, "no actor left")


async def omni_final(omni, prompt):
    outs = [out async for out in omni.generate(prompt, omni_params())]
    assert sum(o.finished for o in outs) == 1
    return outs[-1], [o for o in outs if o.delta_audio is not None and o.delta_audio.numel()]


async def test_qwen2_5_omni_on_two_nodes_equals_process_placement(ray_cluster):
    model = str(qwen2_5_omni_dir("tiny"))
    one_code2wav = {"2": {"replicas": 1}}  # one request: a second replica would only cost its start
    overrides = pinned_overrides(1)
    overrides["2"]["resources"] = {"node_a": 1}  # code2wav beside the thinker, whoever holds the `voc`s
    async with AsyncOmni(model, stage_overrides=overrides, startup_timeout=300) as omni:
        nodes = [r["node"]["node_id"] for s in omni.health()["stages"] for r in s["replicas"]]
        assert nodes[0] != nodes[1]  # thinker and talker on different nodes
        on_ray, ray_chunks = await omni_final(omni, OMNI_PROMPTS["text"])
    async with AsyncOmni(model, stage_overrides=one_code2wav) as omni:
        on_processes, _ = await omni_final(omni, OMNI_PROMPTS["text"])
    assert on_ray.error is None and on_processes.error is None
    assert on_ray.token_ids == on_processes.token_ids and len(on_ray.token_ids) > 0
    assert len(ray_chunks) >= 2  # async chunk: the audio streamed across nodes
    assert torch.equal(on_ray.audio, on_processes.audio)
