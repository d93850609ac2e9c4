"""The first-output board: stages that give way while another replica computes a streaming request's first
chunk (runtime/first_outputs.py)."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

from omnistage import AsyncOmni, SamplingParams
from omnistage.config.deploy import resolve_deploy
from omnistage.config.pipeline import StageKind, StageSpec
from omnistage.connectors.shm import live_segments
from omnistage.errors import ConfigError
from omnistage.params import GenerationParams
from omnistage.runtime.first_outputs import HOLD_S, BoardSeat, FirstOutputBoard
from omnistage.runtime.messages import StartRequest
from omnistage.stages.base import StageRequest
from omnistage.stages.generation.engine import GenerationEngine
from omnistage.stages.worker import StageWorker
from tests.runtime.toy_stages import ToyVocoder, speech_pipeline

VOCODER = StageSpec(0, "voc", StageKind.GENERATION, final_output=True, output_modality="audio")


@pytest.fixture
def board():
    board = FirstOutputBoard.create(os.getpid(), 3)
    yield board
    board.unlink()
    assert board.name not in live_segments()


CHILD_SEAT = """
import sys
from omnistage.runtime.first_outputs import FirstOutputBoard
board = FirstOutputBoard(sys.argv[1])
for line in sys.stdin:
    board.publish(2, line.strip() == "pending")
    print("done", flush=True)
board.close()
"""


def test_a_seat_published_in_another_process_counts_until_cleared_or_lapsed(board):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_SEAT, board.name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        child.stdin.write("pending\n")
        child.stdin.flush()
        assert child.stdout.readline() == "done\n"
        assert board.others_pending(0) and board.others_pending(1)
        assert not board.others_pending(2)  # a seat never waits for itself
        child.stdin.write("clear\n")
        child.stdin.flush()
        assert child.stdout.readline() == "done\n"
        assert not board.others_pending(0)
    finally:
        child.stdin.close()
        assert child.wait(timeout=30) == 0
    board.publish(1, True)  # then never renewed, like a replica that died mid-pass
    time.sleep(HOLD_S + 0.05)
    assert not board.others_pending(0)


def start(worker, rid, codes):
    worker.handle(StartRequest(rid, prompt=codes, params=GenerationParams()))


def test_a_yielding_worker_steps_only_after_the_first_output_is_out(board):
    emitted = []
    worker = StageWorker(
        VOCODER,
        GenerationEngine(ToyVocoder(outputs_per_frame=2)),
        emitted.extend,
        seat=BoardSeat(board.name, 0),
        yields=True,
    )
    start(worker, "r", [1, 2, 3])
    board.publish(1, True)
    clear = threading.Timer(0.1, board.publish, (1, False))
    clear.start()
    worker.step()
    clear.join()
    assert [o.request_id for o in emitted] == ["r"] and emitted[0].finished
    assert worker.yielded["steps"] == 1
    assert worker.call("stats", [])["first_output_yields"]["steps"] == 1

    engine = GenerationEngine(ToyVocoder(outputs_per_frame=2))
    keeps_going = StageWorker(VOCODER, engine, emitted.extend, seat=BoardSeat(board.name, 2))
    start(keeps_going, "s", [4, 5])
    board.publish(1, True)
    keeps_going.step()  # a stage deployed without yield_to_first_outputs does not wait
    assert emitted[-1].request_id == "s" and keeps_going.yielded["steps"] == 0


class TwoUnitVocoder(ToyVocoder):
    """Decodes its windows in one unit and returns them in a second, as code2wav pauses between ODE steps."""

    def generate_steps(self, windows, params):
        outs = self.generate(windows, params)
        yield
        return outs


def test_a_worker_publishes_its_streaming_first_chunk_while_computing_it(board):
    engine = GenerationEngine(TwoUnitVocoder(outputs_per_frame=2), chunk_size=2, right_context=1)
    emitted = []
    worker = StageWorker(VOCODER, engine, emitted.extend, seat=BoardSeat(board.name, 0), yields=True)
    engine.add_request(StageRequest("r", inputs={"codes": torch.arange(3)}, streaming_input=True))
    worker.active.add("r")
    assert engine.first_output_pending()  # ready, not started yet
    worker.step()
    assert not emitted and board.others_pending(1)  # its first chunk is half done: seat 0 is marked
    worker.step()
    assert [o.request_id for o in emitted] == ["r"] and not board.others_pending(1)
    assert worker.yielded["steps"] == 0  # it did not wait for its own seat
    engine.add_chunk("r", {"codes": torch.arange(3, 6)}, last=True)
    worker.step()
    assert not board.others_pending(1)  # a later chunk is not a first output
    engine.add_request(StageRequest("whole", inputs={"codes": torch.arange(4)}))
    assert engine.has_work() and not engine.first_output_pending()  # full handoff: not a streaming chunk
    worker.close()


def test_the_option_is_validated():
    with pytest.raises(ConfigError, match="yield_to_first_outputs must be true or false"):
        resolve_deploy(speech_pipeline(), stage_overrides={"1": {"yield_to_first_outputs": "yes"}})


async def test_the_orchestrator_seats_every_replica_and_removes_the_board():
    omni = AsyncOmni(
        speech_pipeline(),
        stage_overrides={"0": {"yield_to_first_outputs": True}, "1": {"yield_to_first_outputs": True}},
    )
    try:
        name = omni.orchestrator.board.name
        assert name in live_segments(os.getpid())
        outs = [o async for o in omni.generate("hello", SamplingParams(max_tokens=8))]
        assert outs[-1].finished and outs[-1].error is None and len(outs[-1].token_ids) == 8
        stats = await omni.stats()
        assert all("first_output_yields" in s["result"] for s in stats["stages"])
    finally:
        omni._close()
    assert name not in live_segments()
