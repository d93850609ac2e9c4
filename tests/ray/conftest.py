"""A local two-node Ray cluster per test module, gone before the rest of the suite runs. Node "a" and
node "b" carry different custom resources, so a deploy entry can pin a stage to one. Each carries one
`voc`, so two replicas that ask for one each land on different nodes."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="placement ray needs the ray extra: pip install 'omnistage[ray]'")

STAGE_CPUS = 0.5  # four actors fit on the two nodes' two CPUs each


@pytest.fixture(scope="module")
def ray_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"node_a": 4, "voc": 1}}
    )
    cluster.add_node(num_cpus=2, resources={"node_b": 4, "voc": 1})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    cluster.wait_for_nodes()
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def actor_states() -> list[str]:
    """The state of every actor this cluster has seen (GCS's table; no dashboard needed)."""
    return [a["State"] for a in ray._private.state.actors().values()]


def pinned_overrides(voc_replicas: int = 2, **stage2) -> dict:
    """Per-stage overrides of a 3-stage speech pipeline: stage 0 on node a, stage 1 on node b, stage 2's
    replicas one per node (`stage2` adds to its entry)."""
    common = {"placement": "ray", "num_cpus": STAGE_CPUS}
    return {
        "0": {**common, "resources": {"node_a": 1}},
        "1": {**common, "resources": {"node_b": 1}},
        "2": {**common, "replicas": voc_replicas, "resources": {"voc": 1}, **stage2},
    }
