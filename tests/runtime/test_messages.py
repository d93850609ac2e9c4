"""The wire codec: tensors, arrays and images cross as raw buffers (inline or shared memory), unpickled."""

import os

import msgspec
import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.connectors.base import Payload
from omnistage.connectors.shm import ShmConnector, live_segments, release
from omnistage.outputs import StageOutput
from omnistage.params import SamplingParams
from omnistage.prompts import AudioPrompt, TextPrompt
from omnistage.runtime.messages import Codec, FromWorker, Outputs, StartRequest, ToWorker

pytestmark = pytest.mark.unit


def roundtrip(value, connector=None):
    sender = Codec(FromWorker, connector=connector)
    receiver = Codec(FromWorker)
    msg = receiver.decode(sender.encode(Outputs(0, 0, [StageOutput("r", tensors={"x": value})])))
    return msg.items[0].tensors["x"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float16])
def test_tensors_roundtrip_inline(dtype):
    value = (torch.randn(3, 5) * 10).to(dtype)
    back = roundtrip(value)
    assert back.dtype == dtype and torch.equal(back, value)
    assert roundtrip(torch.empty(0, 4)).shape == (0, 4)


def test_large_tensor_goes_through_shared_memory_and_is_released_on_read():
    connector = ShmConnector()
    before = set(live_segments(os.getpid()))
    value = torch.randn(100_000)
    sender = Codec(FromWorker, connector=connector)
    frame = sender.encode(Outputs(0, 0, [StageOutput("r", tensors={"x": value})]))
    assert len(frame) < 1000  # only the header travels in the frame
    created = set(live_segments(os.getpid())) - before
    assert len(created) == 1
    back = Codec(FromWorker).decode(frame).items[0].tensors["x"]
    assert torch.equal(back, value)
    assert not (set(live_segments(os.getpid())) - before)  # the receiver owned and released it


def test_lazy_decode_passes_references_through():
    connector = ShmConnector()
    value = torch.arange(50_000, dtype=torch.float32)
    frame = Codec(FromWorker, connector=connector).encode(
        Outputs(0, 0, [StageOutput("r", tensors={"x": value})])
    )
    orchestrator = Codec(FromWorker, lazy=True)
    handle = orchestrator.decode(frame).items[0].tensors["x"]
    assert isinstance(handle, Payload) and not handle.ref.owned
    forwarded = Codec(ToWorker).encode(StartRequest("r", AudioPrompt(audio=handle), SamplingParams()))
    worker_view = Codec(ToWorker).decode(forwarded)
    assert torch.equal(worker_view.prompt.audio, value)
    assert handle.ref.key in live_segments()  # not owned by the reader: the orchestrator's ledger frees it
    release(handle.ref.key)


def test_arrays_images_and_params_roundtrip():
    array = np.random.rand(4, 3).astype(np.float64)
    assert np.array_equal(roundtrip(array), array)
    image = Image.fromarray(np.random.randint(0, 255, (8, 6, 3), dtype=np.uint8))
    back = roundtrip(image)
    assert back.size == image.size and np.array_equal(np.asarray(back), np.asarray(image))
    params = SamplingParams(temperature=0.3, stop=["x"])
    codec = Codec(ToWorker)
    back = codec.decode(codec.encode(StartRequest("r", TextPrompt(text="p"), params)))
    assert back.params == params and back.prompt == TextPrompt(text="p")


@pytest.mark.parametrize("reason", [7, "\n\n", None])
def test_a_stop_token_id_or_string_crosses_as_the_stop_reason(reason):
    """A sequence ended by one of its `stop_token_ids` reports that id (an int, as vLLM does), a stop string
    that string: both must cross between processes."""
    codec = Codec(FromWorker)
    out = codec.decode(codec.encode(Outputs(0, 0, [StageOutput("r", stop_reason=reason, finished=True)])))
    assert out.items[0].stop_reason == reason


def test_unsupported_objects_are_refused_not_pickled():
    with pytest.raises(TypeError, match="cannot send a object"):
        Codec(FromWorker).encode(Outputs(0, 0, [StageOutput("r", data={"x": object()})]))


def test_a_message_whose_payload_is_gone_names_its_request_and_the_next_is_served(tmp_path):
    """A request's segments are freed when it ends; its message still queued at a stage must not take the
    stage down: the inbox hands it over as `Unreadable` naming the request (the worker fails that request
    alone), then the next message as usual (a real ZMQ socket pair and real shared memory). So does a
    message that breaks the schema (a `prompt` of a type no prompt has)."""
    import zmq

    from omnistage.runtime.messages import Unreadable
    from omnistage.runtime.stage_process import _SocketInbox

    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    try:
        address = f"ipc://{tmp_path / 'inbox'}"
        pull.bind(address)
        push.connect(address)
        sender = Codec(ToWorker, connector=ShmConnector())
        before = set(live_segments(os.getpid()))
        ended = sender.encode(
            StartRequest("ended", AudioPrompt(audio=torch.randn(100_000)), SamplingParams())
        )
        (segment,) = set(live_segments(os.getpid())) - before
        release(segment)  # the request ended before the stage read its message
        live = torch.randn(100_000)
        push.send(ended)
        odd = {"type": "StartRequest", "request_id": "odd", "prompt": 3.5, "params": None}
        push.send(msgspec.msgpack.encode(odd))
        push.send(sender.encode(StartRequest("live", AudioPrompt(audio=live), SamplingParams())))
        inbox = _SocketInbox(pull, Codec(ToWorker).decode)
        taken = []
        while len(taken) < 3:
            assert inbox.wait(10.0)
            taken += inbox.take()
        gone, broken, served = taken
        assert isinstance(gone, Unreadable) and gone.request_ids == ["ended"]
        assert isinstance(gone.error, FileNotFoundError)
        assert isinstance(broken, Unreadable) and broken.request_ids == ["odd"]
        assert isinstance(broken.error, msgspec.ValidationError) and "prompt" in str(broken.error)
        assert isinstance(served, StartRequest) and served.request_id == "live"
        assert torch.equal(served.prompt.audio, live)
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        context.term()
