"""Core sharing (runtime/core_sharing.py, on the stage board): stages that give way while another replica
computes a streaming request's first chunk, and stages that take idle cores."""

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch

from omnistage import AsyncOmni, SamplingParams
from omnistage.config.deploy import CoreSharingSettings, resolve_deploy
from omnistage.config.pipeline import StageKind, StageSpec
from omnistage.connectors.shm import live_segments
from omnistage.errors import ConfigError
from omnistage.params import GenerationParams
from omnistage.runtime import stage_board
from omnistage.runtime.core_sharing import CoreSharing
from omnistage.runtime.messages import StartRequest
from omnistage.runtime.stage_board import HOLD_S, BoardSeat, StageBoard
from omnistage.runtime.stage_process import StageWorker
from omnistage.stages.base import StageRequest
from omnistage.stages.generation.engine import GenerationEngine
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.support.toy_stages import ToyVocoder, speech_pipeline

VOCODER = StageSpec(0, "voc", StageKind.GENERATION, final_output=True, output_modality="audio")
YIELDS = CoreSharingSettings(yield_to_first_outputs=True)


def sharing_worker(engine, emitted: list, board, slot: int, settings: CoreSharingSettings) -> StageWorker:
    """A stage worker on seat `slot` of `board`, sharing cores as `settings` say (runtime/core_sharing.py)."""
    policy = CoreSharing(settings, BoardSeat(board.name, slot), engine)
    return StageWorker(VOCODER, engine, emitted.extend, sharing=policy)


@pytest.fixture
def board():
    board = StageBoard.create(os.getpid(), 3)
    yield board
    board.unlink()
    assert board.name not in live_segments()


CHILD_SEAT = """
import sys
from omnistage.runtime.stage_board import StageBoard
board = StageBoard(sys.argv[1])
for line in sys.stdin:
    board.publish(2, line.strip() == "pending")
    print("done", flush=True)
board.close()
"""


def test_a_seat_published_in_another_process_counts_until_cleared_or_lapsed(board, monkeypatch):
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
    assert board.others_pending(0)
    later = time.monotonic() + HOLD_S + 0.01  # the board's clock, moved past the deadline
    monkeypatch.setattr(stage_board, "time", SimpleNamespace(monotonic=lambda: later))
    assert not board.others_pending(0)


def start(worker, rid, codes):
    worker.handle(StartRequest(rid, prompt=codes, params=GenerationParams()))


def test_a_yielding_worker_steps_only_after_the_first_output_is_out(board, monkeypatch):
    emitted = []
    worker = sharing_worker(GenerationEngine(ToyVocoder(outputs_per_frame=2)), emitted, board, 0, YIELDS)
    start(worker, "r", [1, 2, 3])
    board.publish(1, True)
    polls = []

    def poll_then_clear(seconds):  # the waiting worker's pause: seat 1's first output is out meanwhile
        assert not emitted  # it has not stepped yet
        polls.append(seconds)
        board.publish(1, False)

    monkeypatch.setattr(stage_board, "time", SimpleNamespace(monotonic=time.monotonic, sleep=poll_then_clear))
    worker.step()
    monkeypatch.undo()
    assert polls == [stage_board.POLL_S]  # it waited, once, and stepped as soon as the seat was clear
    assert [o.request_id for o in emitted] == ["r"] and emitted[0].finished
    assert worker.sharing.yielded["steps"] == 1
    assert worker.call("stats", [])["first_output_yields"]["steps"] == 1

    engine = GenerationEngine(ToyVocoder(outputs_per_frame=2))
    keeps_going = sharing_worker(engine, emitted, board, 2, CoreSharingSettings())
    start(keeps_going, "s", [4, 5])
    board.publish(1, True)
    keeps_going.step()  # a stage deployed without yield_to_first_outputs does not wait
    assert emitted[-1].request_id == "s" and keeps_going.sharing.yielded["steps"] == 0


class TwoUnitVocoder(ToyVocoder):
    """Decodes its windows in one unit and returns them in a second, as code2wav pauses between ODE steps."""

    def run(self, batch):
        outs = self.generate(batch.windows, batch.params)
        yield
        return outs


def test_a_worker_publishes_its_streaming_first_chunk_while_computing_it(board):
    engine = GenerationEngine(TwoUnitVocoder(outputs_per_frame=2), chunk_size=2, right_context=1)
    emitted = []
    worker = sharing_worker(engine, emitted, board, 0, YIELDS)
    engine.add_request(StageRequest("r", inputs=GenerationInputs(torch.arange(3)), streaming_input=True))
    worker.active.add("r")
    assert engine.first_output_pending()  # ready, not started yet
    worker.step()
    assert not emitted and board.others_pending(1)  # its first chunk is half done: seat 0 is marked
    worker.step()
    assert [o.request_id for o in emitted] == ["r"] and not board.others_pending(1)
    assert worker.sharing.yielded["steps"] == 0  # it did not wait for its own seat
    engine.add_chunk("r", GenerationInputs(torch.arange(3, 6)), last=True)
    worker.step()
    assert not board.others_pending(1)  # a later chunk is not a first output
    engine.add_request(StageRequest("whole", inputs=GenerationInputs(torch.arange(4))))
    assert engine.has_work() and not engine.first_output_pending()  # full handoff: not a streaming chunk
    worker.close()


def test_a_solo_worker_takes_its_solo_threads_only_while_every_other_seat_is_idle(board, monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = GenerationEngine(TwoUnitVocoder(outputs_per_frame=2))
        worker = sharing_worker(engine, [], board, 0, CoreSharingSettings(solo_threads=2))
        start(worker, "r", [1, 2, 3])  # each request takes two steps
        worker.step()  # alone on the board: solo threads, and its own seat marked busy mid-request
        assert torch.get_num_threads() == 2 and worker.sharing.solo_steps == 1
        assert board.others_busy(1, quiet_s=0) and not board.others_busy(0, quiet_s=0)
        board.set_busy(2, True)  # another replica has work: back to the deployment's threads
        worker.step()
        assert torch.get_num_threads() == 1 and worker.sharing.solo_steps == 1
        assert not worker.has_work() and not board.others_busy(2, quiet_s=0)  # done: its seat is idle

        start(worker, "s", [4, 5])
        board.set_busy(2, False)
        monkeypatch.setattr(stage_board, "SOLO_QUIET_S", 60.0)
        worker.step()  # the other replica went idle less than SOLO_QUIET_S ago: it may be back at once
        assert torch.get_num_threads() == 1 and worker.sharing.solo_steps == 1
        monkeypatch.setattr(stage_board, "SOLO_QUIET_S", 0.0)
        worker.step()
        assert torch.get_num_threads() == 2 and worker.sharing.solo_steps == 2
        assert worker.call("stats", [])["solo_steps"] == 2
        worker.close()
    finally:
        torch.set_num_threads(threads)


def sharing(**block) -> dict:
    return {"1": {"core_sharing": block}}


def test_the_options_are_validated():
    with pytest.raises(ConfigError, match="core_sharing.yield_to_first_outputs must be true or false"):
        resolve_deploy(speech_pipeline(), stage_overrides=sharing(yield_to_first_outputs="yes"))
    for bad in (-1, "2", True):
        with pytest.raises(ConfigError, match="stage 1: core_sharing.solo_threads must be a non-negative"):
            resolve_deploy(speech_pipeline(), stage_overrides=sharing(solo_threads=bad))
    with pytest.raises(
        ConfigError, match="unknown key 'solo_thread' in core_sharing; did you mean 'solo_threads'"
    ):
        resolve_deploy(speech_pipeline(), stage_overrides=sharing(solo_thread=2))
    with pytest.raises(ConfigError, match="'solo_threads' is a key of the stage's `core_sharing` block"):
        resolve_deploy(speech_pipeline(), stage_overrides={"1": {"solo_threads": 2}})
    off = resolve_deploy(speech_pipeline(), stage_overrides=sharing(solo_threads=0))
    assert off.stage(1).core_sharing.solo_threads == 0


async def test_the_orchestrator_seats_every_replica_and_removes_the_board():
    """...and a stage process deployed with solo_threads counts its solo steps."""
    omni = AsyncOmni(
        speech_pipeline(),
        stage_overrides={
            "0": {"core_sharing": {"yield_to_first_outputs": True}},
            "1": {"core_sharing": {"yield_to_first_outputs": True}},
            "2": {"core_sharing": {"solo_threads": 2}},
        },
    )
    try:
        name = omni.orchestrator.board.name
        assert name in live_segments(os.getpid())
        outs = [o async for o in omni.generate("hello", SamplingParams(max_tokens=8))]
        assert outs[-1].finished and outs[-1].error is None and len(outs[-1].token_ids) == 8
        stats = await omni.stats()
        assert all("first_output_yields" in s["result"] for s in stats["stages"])
        assert ["solo_steps" in s["result"] for s in stats["stages"]] == [False, False, True]
    finally:
        omni._close()
    assert name not in live_segments()
