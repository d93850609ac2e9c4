"""Tiny Qwen2.5-Omni with its stages as Ray actors pinned to two nodes: the bundled deployment's outputs,
equal to process placement's (same worker, same threads: the same numbers)."""

from __future__ import annotations

import pytest
import torch

from omnistage import AsyncOmni
from omnistage.demo.qwen2_5_omni import qwen2_5_omni_dir
from tests.omni.conftest import PROMPTS, greedy_params
from tests.ray.conftest import pinned_overrides

pytestmark = pytest.mark.e2e


async def final_of(omni, prompt):
    outs = [out async for out in omni.generate(prompt, greedy_params())]
    assert sum(o.finished for o in outs) == 1
    return outs[-1], [o for o in outs if o.delta_audio is not None and o.delta_audio.numel()]


async def test_qwen2_5_omni_on_two_nodes_equals_process_placement(ray_cluster):
    model = str(qwen2_5_omni_dir("tiny"))
    one_code2wav = {"2": {"replicas": 1}}  # one request: a second replica would only cost its start
    async with AsyncOmni(model, stage_overrides=pinned_overrides(1), startup_timeout=300) as omni:
        nodes = [r["node"]["node_id"] for s in omni.health()["stages"] for r in s["replicas"]]
        assert nodes[0] != nodes[1]  # thinker and talker on different nodes
        on_ray, ray_chunks = await final_of(omni, PROMPTS["text"])
    async with AsyncOmni(model, stage_overrides=one_code2wav) as omni:
        on_processes, _ = await final_of(omni, PROMPTS["text"])
    assert on_ray.error is None and on_processes.error is None
    assert on_ray.token_ids == on_processes.token_ids and len(on_ray.token_ids) > 0
    assert len(ray_chunks) >= 2  # async chunk: the audio streamed across nodes
    assert torch.equal(on_ray.audio, on_processes.audio)
