"""How the orchestrator's messages reach a stage: held messages arrive together; the one worker loop."""

import subprocess
import sys

import pytest
import zmq

from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageKind, StageSpec
from omnistage.params import GenerationParams
from omnistage.runtime.messages import (
    Abort,
    Call,
    CallResult,
    Codec,
    Ready,
    Shutdown,
    StartRequest,
    StartupFailed,
    ToWorker,
)
from omnistage.runtime.stage_client import ProcessStageClient, QueueInbox
from omnistage.runtime.stage_process import serve_stage
from omnistage.stages.generation.engine import GenerationEngine
from tests.support.toy_stages import ToyVocoder, speech_pipeline

pytestmark = pytest.mark.unit


def client_with_a_stand_in_worker(tmp_path, ctx: zmq.Context) -> ProcessStageClient:
    """The vocoder stage's process client, with a live process standing in for its worker (the client
    sends only to a live one); the test reads the inbox itself."""
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
    client.proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    return client


def test_held_messages_reach_the_worker_in_one_delivery(tmp_path):
    """Between `hold()` and `release()` nothing is delivered; then every message is, as the parts of one ZMQ
    message, so a worker that drains its inbox before stepping sees all of them or none."""
    ctx = zmq.Context()
    client = client_with_a_stand_in_worker(tmp_path, ctx)
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


def test_the_worker_loop_answers_calls_and_shuts_its_engine_down_on_shutdown():
    """The loop both placements run (here over the inline queue): a call is answered in order with the
    messages before it, Shutdown ends the loop, and the engine releases the request it still held."""
    engine = GenerationEngine(ToyVocoder(outputs_per_frame=2))
    stage = StageSpec(0, "voc", StageKind.GENERATION, final_output=True, output_modality="audio")
    inbox, sent = QueueInbox(), []
    inbox.put(StartRequest("r", prompt=[1, 2, 3], params=GenerationParams()))
    inbox.put(Call(7, "stats", []))
    inbox.put(Shutdown())
    assert serve_stage(stage, 0, lambda: (engine, "cpu"), inbox, sent.append)
    ready, answer = sent
    assert isinstance(ready, Ready) and ready.stage_id == 0
    assert isinstance(answer, CallResult) and answer.call_id == 7 and answer.result["num_requests"] == 1
    assert engine.requests == {} and not engine.has_work()  # shut down before it ever stepped


def test_a_stage_whose_engine_cannot_be_built_says_so_and_never_starts():
    def build():
        raise ValueError("no such checkpoint")

    sent = []
    assert not serve_stage(speech_pipeline().stage(0), 1, build, QueueInbox(), sent.append)
    (failed,) = sent
    assert isinstance(failed, StartupFailed) and failed.replica == 1 and "no such checkpoint" in failed.error


def test_a_send_never_blocks_for_good_once_the_worker_socket_is_gone(tmp_path):
    """A dying worker's socket closes before its process exits, and a PUSH socket blocks a send while no
    worker is connected: the send must return once the process is gone (the message dropped; the monitor
    fails the replica's requests), not hang the orchestrator's loop."""
    import threading

    from zmq.utils.monitor import recv_monitor_message

    ctx = zmq.Context()
    client = client_with_a_stand_in_worker(tmp_path, ctx)
    monitor = client.socket.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(client.inbox)
    sender = None
    try:
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_ACCEPTED
        client.send(Abort(["delivered"]))
        assert inbox.poll(5000) and Codec(ToWorker).decode(inbox.recv()).request_ids == ["delivered"]
        inbox.close(linger=0)  # the worker's socket is gone, its process not yet
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
        sender = threading.Thread(target=client.send, args=(Abort(["lost"]),))
        sender.start()
        client.proc.kill()
        client.proc.wait()
        sender.join(timeout=60)
        assert not sender.is_alive()
    finally:
        if client.proc.poll() is None:
            client.proc.kill()
            client.proc.wait()
        if sender is None or not sender.is_alive():  # a send still blocked owns its socket: leave it
            client.socket.disable_monitor()
            monitor.close(linger=0)
            client.socket.close(linger=0)
            ctx.term()
