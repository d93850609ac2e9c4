"""The TCP connector on its own: a payload put by a producer is fetched by reference from another thread
(its bytes and header intact), a taken or dropped payload is gone, and the deploy schema checks the actor
resources."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from omnistage.config.deploy import resolve_deploy
from omnistage.connectors.tcp import TcpConnector, drop, fetch, is_tcp_key
from omnistage.errors import ConfigError
from omnistage.outputs import StageOutput
from omnistage.runtime.messages import Codec, Outputs
from tests.support.polling import wait_until
from tests.support.toy_stages import speech_pipeline

pytestmark = pytest.mark.unit


@pytest.fixture
def producer():
    connector = TcpConnector("127.0.0.1")
    yield connector
    connector.close()


def test_fetch_by_reference_then_take_and_drop(producer):
    tensor = torch.arange(40_000, dtype=torch.float32).reshape(200, 200)
    ref = producer.put(tensor)
    assert is_tcp_key(ref.key) and ref.shape == (200, 200) and ref.nbytes == tensor.nbytes
    got = {}
    reader = threading.Thread(target=lambda: got.update(value=fetch(ref, release_after=False)))
    reader.start()
    reader.join(30)
    assert torch.equal(got["value"], tensor)
    assert torch.equal(fetch(ref, release_after=True), tensor)  # take: the producer forgets it
    with pytest.raises(KeyError, match="gone"):
        fetch(ref)
    other = producer.put(np.ones((3, 4), np.int16))
    drop(other.key)
    wait_until(lambda: not producer.store, 10, "the dropped payload forgotten")
    assert producer.stats["dropped"] == 1


def test_codec_sends_large_payloads_by_tcp_reference(producer):
    audio = torch.randn(50_000)
    codec = Codec(Outputs, connector=producer, inline_limit=1024)
    frame = codec.encode(Outputs(2, 0, [StageOutput("r", audio=audio, finished=True)]))
    assert len(frame) < 1024  # the header travelled, not the 200 kB
    decoded = Codec(Outputs).decode(frame)
    assert torch.equal(decoded.items[0].audio, audio) and not producer.store  # read once, taken


def test_deploy_checks_ray_resources():
    pipeline = speech_pipeline()
    deploy = resolve_deploy(pipeline, {"placement": "ray", "num_cpus": 0.5, "resources": {"node_a": 1}})
    assert deploy.stage(1).connector_from(0, deploy.connectors) == {"type": "tcp"}
    assert deploy.stage(2).resources == {"node_a": 1} and deploy.stage(0).num_cpus == 0.5
    with pytest.raises(ConfigError, match="num_gpus"):
        resolve_deploy(pipeline, {"placement": "ray", "num_gpus": -1})
    with pytest.raises(ConfigError, match="resources"):
        resolve_deploy(pipeline, {"placement": "ray", "resources": {"node_a": "x"}})
