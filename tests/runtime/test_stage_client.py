"""How the orchestrator's messages reach a stage process: held messages arrive together."""

import subprocess
import sys

import pytest
import zmq

from omnistage.config.deploy import StageDeploy
from omnistage.runtime.messages import Abort, Codec, ToWorker
from omnistage.runtime.stage_client import ProcessStageClient
from tests.runtime.toy_stages import speech_pipeline

pytestmark = pytest.mark.unit


def test_held_messages_reach_the_worker_in_one_delivery(tmp_path):
    """Between `hold()` and `release()` nothing is delivered; then every message is, as the parts of one ZMQ
    message, so a worker that drains its inbox before stepping sees all of them or none."""
    ctx = zmq.Context()
    stage = speech_pipeline().stage(2)
    client = ProcessStageClient(
        stage,
        StageDeploy(stage_id=2),
        0,
        None,
        on_message=lambda msg: None,
        stream_tensors=True,
        ipc_dir=tmp_path,
        outbox=f"ipc://{tmp_path}/out",
        owner_pid=0,
        output_connector="inline",
        input_connector="inline",
        zmq_context=ctx,
    )
    # A live process stands in for the worker (the client sends only to a live one); we read its inbox.
    client.proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(client.inbox)
    decode = Codec(ToWorker).decode
    try:
        client.send(Abort(["before"]))
        assert inbox.poll(5000) and decode(inbox.recv()).request_ids == ["before"]
        client.hold()
        for rid in ("a", "b", "c"):
            client.send(Abort([rid]))
        assert len(client.held) == 3  # kept here, not sent
        client.release()
        assert client.held is None and inbox.poll(5000)
        parts = inbox.recv_multipart()  # one message of three parts: had one been sent alone, it came first
        assert [decode(p).request_ids for p in parts] == [["a"], ["b"], ["c"]]
        client.send(Abort(["after"]))  # released: sent at once again
        assert inbox.poll(5000) and decode(inbox.recv()).request_ids == ["after"]
    finally:
        client.proc.kill()
        client.proc.wait()
        inbox.close(linger=0)
        client.socket.close(linger=0)
        ctx.term()
