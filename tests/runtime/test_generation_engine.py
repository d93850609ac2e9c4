"""Generation engine: batching, full handoff in one pass, chunked decoding with context."""

import pytest
import torch

from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageKind, StageSpec
from omnistage.stages.base import EngineContext, StageRequest
from omnistage.stages.generation.engine import GenerationEngine, create_engine, one_unit, window_by_window
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.support.toy_stages import ToyVocoder

pytestmark = pytest.mark.engine


def drain(engine):
    outs = []
    while engine.has_work():
        outs.extend(engine.step())
    return outs


def joined(outs, rid):
    return torch.cat([o.audio for o in outs if o.request_id == rid])


def test_full_handoff_is_one_pass_per_batch():
    vocoder = ToyVocoder(outputs_per_frame=10)
    engine = GenerationEngine(vocoder, max_num_seqs=4)
    codes = {f"r{i}": torch.randint(0, 64, (5 + i,)) for i in range(3)}
    for rid, c in codes.items():
        engine.add_request(StageRequest(rid, inputs=GenerationInputs(c)))
    outs = drain(engine)
    assert engine.passes == 1 and all(o.finished for o in outs)
    for rid, c in codes.items():
        assert torch.equal(joined(outs, rid), vocoder.generate([c], [None])[0])
    assert engine.stats()["num_requests"] == 0


def test_chunked_decoding_with_context_equals_one_pass():
    vocoder = ToyVocoder(outputs_per_frame=10)
    codes = torch.randint(0, 64, (11,))
    reference = vocoder.generate([codes], [None])[0]
    engine = GenerationEngine(vocoder, chunk_size=3, left_context=1, right_context=1)
    engine.add_request(StageRequest("r", inputs=GenerationInputs(codes[:2]), streaming_input=True))
    assert not engine.has_work()  # 2 frames < chunk + lookahead: wait for more input
    outs = []
    for start in range(2, 11, 2):
        engine.add_chunk("r", GenerationInputs(codes[start : start + 2]), last=start + 2 >= 11)
        outs.extend(drain(engine))
    assert outs[-1].finished and sum(o.finished for o in outs) == 1
    assert len(outs) > 2  # audio came out in pieces, before the input was complete
    assert torch.allclose(joined(outs, "r"), reference, atol=1e-6)


def test_without_context_chunk_edges_differ():
    vocoder = ToyVocoder(outputs_per_frame=10)
    codes = torch.randint(0, 64, (9,))
    engine = GenerationEngine(vocoder, chunk_size=3)
    engine.add_request(StageRequest("r", inputs=GenerationInputs(codes), streaming_input=False))
    assert not torch.allclose(joined(drain(engine), "r"), vocoder.generate([codes], [None])[0])


def test_abort_and_empty_final_chunk():
    engine = GenerationEngine(ToyVocoder(outputs_per_frame=4), chunk_size=2)
    engine.add_request(
        StageRequest("a", inputs=GenerationInputs(torch.tensor([1, 2, 3])), streaming_input=True)
    )
    engine.add_request(StageRequest("b", inputs=GenerationInputs(torch.tensor([1, 2])), streaming_input=True))
    engine.abort("a")
    outs = drain(engine)
    assert [o.request_id for o in outs] == ["b"] and not outs[0].finished
    engine.add_chunk("b", {}, last=True)  # input ends with nothing new: the request still ends
    outs = drain(engine)
    assert outs[-1].finished and outs[-1].audio.numel() == 0
    assert engine.stats()["num_requests"] == 0


def test_factory_reads_engine_args():
    stage = StageSpec(0, "voc", StageKind.GENERATION, final_output=True, output_modality="audio")
    deploy = StageDeploy(
        stage_id=0,
        max_num_seqs=3,
        engine_args={
            "generator": "tests.support.toy_stages:make_vocoder",
            "chunk_size": 4,
            "left_context": 2,
        },
    )
    engine = create_engine(EngineContext(stage, deploy, None))
    assert (engine.max_num_seqs, engine.chunk_size, engine.left_context) == (3, 4, 2)
    with pytest.raises(ValueError, match="engine_args.generator"):
        create_engine(EngineContext(stage, StageDeploy(stage_id=0), None))


def test_a_request_behind_catches_up_in_longer_spans():
    """Input that got ahead of decoding is decoded in whole-chunk spans up to max_chunk_size."""
    vocoder = ToyVocoder(outputs_per_frame=2)
    codes = torch.randint(0, 64, (11,))
    engine = GenerationEngine(vocoder, chunk_size=3, max_chunk_size=7, left_context=1, right_context=1)
    engine.add_request(StageRequest("r", inputs=GenerationInputs(codes[:4]), streaming_input=True))
    first = engine.step()
    assert first[0].audio.numel() == 3 * 2
    engine.add_chunk("r", GenerationInputs(codes[4:10]), last=False)
    behind = engine.step()
    assert behind[0].audio.numel() == 6 * 2  # 6 frames ready: two whole chunks in one span
    engine.add_chunk("r", GenerationInputs(codes[10:]), last=True)
    outs = first + behind + drain(engine)
    assert outs[-1].finished
    assert torch.allclose(joined(outs, "r"), vocoder.generate([codes], [None])[0], atol=1e-6)


def test_first_output_is_one_chunk_however_much_is_ready():
    """Time to first audio: a request that arrives with much input ready still plays after one chunk."""
    vocoder = ToyVocoder(outputs_per_frame=2)
    codes = torch.randint(0, 64, (20,))
    engine = GenerationEngine(vocoder, chunk_size=3, max_chunk_size=9, left_context=1, right_context=1)
    for rid, last in (("streaming", False), ("complete", True)):
        engine.add_request(StageRequest(rid, inputs=GenerationInputs(codes), streaming_input=not last))
    first = engine.step()
    assert sorted(o.request_id for o in first) == ["complete", "streaming"]
    assert all(o.audio.numel() == 3 * 2 for o in first)
    second = engine.step()  # then catch-up spans
    assert all(o.audio.numel() == 9 * 2 for o in second) and len(second) == 2
    engine.add_chunk("streaming", {}, last=True)
    outs = first + second + drain(engine)
    # the rest of an ended input: its whole chunks, then the tail alone (the spans of a stage that kept up)
    assert [o.audio.numel() // 2 for o in outs if o.request_id == "complete"] == [3, 9, 6, 2]
    for rid in ("streaming", "complete"):
        assert torch.allclose(joined(outs, rid), vocoder.generate([codes], [None])[0], atol=1e-6)


def test_a_smaller_first_chunk_then_whole_chunks():
    vocoder = ToyVocoder(outputs_per_frame=2)
    codes = torch.randint(0, 64, (14,))
    engine = GenerationEngine(vocoder, chunk_size=4, first_chunk_size=2, left_context=1, right_context=1)
    engine.add_request(StageRequest("r", inputs=GenerationInputs(codes[:3]), streaming_input=True))
    outs = drain(engine)
    assert [o.audio.numel() for o in outs] == [2 * 2]  # 3 frames: first chunk + right context
    engine.add_chunk("r", GenerationInputs(codes[3:10]), last=False)
    outs += drain(engine)
    assert [o.audio.numel() for o in outs] == [2 * 2, 4 * 2]  # then whole chunks of 4
    engine.add_chunk("r", GenerationInputs(codes[10:]), last=True)
    outs += drain(engine)
    assert outs[-1].finished
    assert torch.allclose(joined(outs, "r"), vocoder.generate([codes], [None])[0], atol=1e-6)


def test_first_chunks_go_first_and_alone():
    """A request that has output nothing yet is decoded before, and without, requests already playing."""
    engine = GenerationEngine(ToyVocoder(outputs_per_frame=2), chunk_size=2, max_chunk_size=8)
    engine.add_request(StageRequest("old", inputs=GenerationInputs(torch.arange(2)), streaming_input=True))
    assert [o.request_id for o in engine.step()] == ["old"]
    engine.add_chunk("old", GenerationInputs(torch.arange(6)), last=False)
    engine.add_request(StageRequest("new", inputs=GenerationInputs(torch.arange(2)), streaming_input=True))
    assert [o.request_id for o in engine.step()] == ["new"]
    outs = engine.step()  # then the one behind catches up in one longer span
    assert [o.request_id for o in outs] == ["old"] and outs[0].audio.numel() == 6 * 2


def test_a_first_chunk_with_less_look_ahead():
    """`first_right_context` lets the first chunk start on fewer input frames; later chunks keep the full
    look-ahead, and once the input ends the joined output is what the window sizes give."""
    vocoder = ToyVocoder(outputs_per_frame=2)
    codes = torch.randint(0, 64, (12,))
    engine = GenerationEngine(vocoder, chunk_size=2, left_context=1, right_context=3, first_right_context=1)
    engine.add_request(StageRequest("r", inputs=GenerationInputs(codes[:3]), streaming_input=True))
    outs = drain(engine)
    assert [o.audio.numel() for o in outs] == [2 * 2]  # 2 frames + 1 ahead suffice
    engine.add_chunk("r", GenerationInputs(codes[3:6]), last=False)
    outs += drain(engine)
    assert len(outs) == 1  # 4 more frames: a chunk of 2 still needs 3 ahead
    engine.add_chunk("r", GenerationInputs(codes[6:7]), last=False)
    outs += drain(engine)
    assert [o.audio.numel() for o in outs] == [2 * 2, 2 * 2]
    engine.add_chunk("r", GenerationInputs(codes[7:]), last=True)
    outs += drain(engine)
    # The toy's conv sees one frame each side: one frame of look-ahead is already exact for it.
    assert outs[-1].finished
    assert torch.allclose(joined(outs, "r"), vocoder.generate([codes], [None])[0], atol=1e-6)


class StepwiseVocoder(ToyVocoder):
    """ToyVocoder that pauses after each window, as code2wav pauses after each ODE step."""

    def run(self, batch):
        outs = []
        for window in batch.windows:
            outs.extend(self.generate([window], batch.params))
            yield
        return outs


def test_a_first_chunk_overtakes_a_pass_in_progress():
    """A request's first chunk runs between the units of a longer pass already under way; nobody's audio
    changes, and a request aborted inside the paused pass gets no output."""

    def run(vocoder, abort=False):
        engine = GenerationEngine(vocoder, chunk_size=2, max_chunk_size=8, left_context=1, right_context=1)
        for rid in ("a", "b", "c"):
            engine.add_request(
                StageRequest(rid, inputs=GenerationInputs(torch.arange(3)), streaming_input=True)
            )
        outs = drain(engine)  # their first chunks
        for rid in ("a", "b", "c"):
            engine.add_chunk(rid, GenerationInputs(torch.arange(5, 10)), last=True)
        outs.extend(engine.step())  # starts the catch-up pass of a, b, c (6 frames: whole chunks, no tail)
        order = [o.request_id for o in outs[3:]]
        engine.add_request(StageRequest("new", inputs=GenerationInputs(torch.arange(20, 22))))
        if abort:
            engine.abort("b")
        while engine.has_work():
            step = engine.step()
            order.extend(o.request_id for o in step)
            outs.extend(step)
        return engine, order, outs

    engine, order, outs = run(StepwiseVocoder(outputs_per_frame=2))
    assert order == ["new", "a", "b", "c"]  # "new" finished while the others' pass was paused
    _, plain_order, plain_outs = run(ToyVocoder(outputs_per_frame=2))
    assert plain_order == ["a", "b", "c", "new"]  # a generator that cannot pause runs its pass whole
    for rid in ("a", "b", "c", "new"):
        assert torch.equal(joined(outs, rid), joined(plain_outs, rid))
    assert engine.stats()["num_requests"] == 0 and engine.first_pass is None and engine.pass_ is None

    engine, order, _ = run(StepwiseVocoder(outputs_per_frame=2), abort=True)
    assert order == ["new", "a", "c"] and engine.stats()["num_requests"] == 0


class WindowByWindowVocoder(ToyVocoder):
    """ToyVocoder decoding its windows one after the other, each sent as soon as it is decoded."""

    def run(self, batch):
        return window_by_window(
            lambda i: self.generate([batch.windows[i]], batch.params)[0], len(batch.windows)
        )


def test_each_window_of_a_pass_is_sent_as_soon_as_it_is_decoded():
    """Of a pass of first chunks, a request's audio leaves after its own window, not after the pass: step k
    sends request k's; the audio is the one-unit generator's; a request aborted before its window is decoded
    gets nothing, one aborted after it was sent gets nothing more; the pass's slot is free at the end."""

    def run(vocoder, abort=None):
        engine = GenerationEngine(vocoder, chunk_size=2, left_context=1, right_context=1)
        for i, rid in enumerate(("a", "b", "c")):
            codes = torch.arange(i, i + 3)
            engine.add_request(StageRequest(rid, inputs=GenerationInputs(codes), streaming_input=True))
        steps = []
        while engine.has_work():
            if abort is not None and len(steps) == abort[1]:
                engine.abort(abort[0])
            steps.append(engine.step())
        return engine, steps

    engine, steps = run(WindowByWindowVocoder(outputs_per_frame=2))
    assert [[o.request_id for o in step] for step in steps] == [["a"], ["b"], ["c"]]
    assert engine.first_pass is None and engine.pass_ is None and engine.passes == 1
    _, plain = run(ToyVocoder(outputs_per_frame=2))
    assert [[o.request_id for o in step] for step in plain] == [["a", "b", "c"]]  # one unit: all at the end
    sent = [o for step in steps for o in step]
    for rid in ("a", "b", "c"):
        assert torch.equal(joined(sent, rid), joined(plain[0], rid))
    _, steps = run(WindowByWindowVocoder(outputs_per_frame=2), abort=("c", 1))
    assert [[o.request_id for o in step] for step in steps] == [["a"], ["b"], []]
    engine, steps = run(WindowByWindowVocoder(outputs_per_frame=2), abort=("a", 1))
    assert [[o.request_id for o in step] for step in steps] == [["a"], ["b"], ["c"]]
    assert "a" not in engine.requests and not any(s.in_flight for s in engine.requests.values())


class RunningSum:
    """A causal generator that carries its streams: frame t's output is the sum of the stream's codes up to
    t, repeated `outputs_per_frame` times. It counts the frames it is fed."""

    outputs_per_frame, sample_rate = 3, 16000

    def __init__(self):
        self.streams: dict[str, float] = {}
        self.fed = 0

    def generate(self, windows, params, stream_ids=None):
        outs = []
        for i, codes in enumerate(windows):
            start = self.streams.get(stream_ids[i], 0.0) if stream_ids else 0.0
            sums = start + torch.cumsum(codes.double(), 0)
            if stream_ids:
                self.streams[stream_ids[i]] = float(sums[-1]) if len(sums) else start
            self.fed += len(codes)
            outs.append(sums.repeat_interleave(self.outputs_per_frame))
        return outs

    def run(self, batch):
        return one_unit(lambda: self.generate(batch.windows, batch.params, batch.stream_ids))

    def end_stream(self, stream_id):
        self.streams.pop(stream_id, None)


def test_streams_feed_each_frame_once_and_end_with_their_requests():
    """A streaming generator gets every frame once, context frames first (decoded, never emitted); the
    joined chunks equal the one-pass output; its state goes when the request ends or is aborted."""
    gen = RunningSum()
    engine = GenerationEngine(gen, chunk_size=4, first_chunk_size=2, streams=True)
    codes = torch.arange(1, 24)
    engine.add_request(
        StageRequest("r", inputs=GenerationInputs(codes[:5], context_frames=3), streaming_input=True)
    )
    outs = drain(engine)
    for start in range(5, 23, 5):
        engine.add_chunk("r", GenerationInputs(codes[start : start + 5]), last=start + 5 >= 23)
        outs.extend(drain(engine))
    assert outs[-1].finished and len(outs) > 2
    one_pass = torch.cumsum(codes.double(), 0).repeat_interleave(3)
    assert torch.equal(joined(outs, "r"), one_pass[3 * 3 :])  # the context frames' output is not emitted
    assert gen.fed == len(codes) and gen.streams == {}
    engine.add_request(StageRequest("cut", inputs=GenerationInputs(codes[:6]), streaming_input=True))
    assert not drain(engine)[-1].finished and "cut" in gen.streams
    engine.abort("cut")
    assert gen.streams == {}
    with pytest.raises(ValueError, match="no left or right context"):
        GenerationEngine(gen, chunk_size=4, left_context=2, streams=True)
    with pytest.raises(ValueError, match="cannot carry streams"):
        GenerationEngine(ToyVocoder(), chunk_size=4, streams=True)
