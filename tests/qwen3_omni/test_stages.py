"""The three Qwen3-Omni stages chained by hand (engines and input processors in this process, no
orchestrator), so that every stage's output can be compared with the reference `generate`: thinker tokens,
the talker's 16-codebook frames, and the waveform in full-handoff and async-chunk mode, for text, image,
audio and video prompts. (The reference fails on image + audio in one prompt: its talker's get_rope_index
reads `audio_config.n_window`, which the talker config lacks; that combination is not compared.)"""

import pytest
import torch

from tests.qwen3_omni.conftest import FRAMES, PROMPTS, frame_chunks, greedy_params, run_stage, stream_stage

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("name", list(PROMPTS))
def test_stage_outputs_equal_reference(name, engines, references):
    ref, prompt, params = references[name], PROMPTS[name], greedy_params()
    assert ref.codes.shape == (FRAMES, 16) and float(ref.waveform.std()) > 0.05  # audible, not ~1e-7
    results, thinker_deltas = {}, []
    results[0] = run_stage(0, engines[0], prompt, params[0], results, thinker_deltas)
    assert results[0].prompt_token_ids == ref.prompt_ids
    assert results[0].token_ids == ref.text_ids
    results[1] = run_stage(1, engines[1], prompt, params[1], results)
    assert results[1].token_ids == ref.talker_ids[:FRAMES]
    assert torch.equal(results[1].codes, ref.codes)

    # Async chunk into the talker: it starts while the thinker is still writing and, held back until each
    # text row has arrived, speaks exactly the same frames.
    assert len(thinker_deltas) == len(ref.text_ids)
    streamed, early = stream_stage(1, engines[1], prompt, params[1], thinker_deltas)
    assert torch.equal(streamed.codes, ref.codes)
    assert 0 < early < FRAMES

    full = run_stage(2, engines[2], prompt, params[2], results).audio
    assert full.shape == ref.waveform.shape
    assert float((full - ref.waveform).abs().max()) <= 1e-4

    passes = engines[3].passes
    chunked, _ = stream_stage(2, engines[3], prompt, params[2], frame_chunks(results[1].codes))
    assert engines[3].passes - passes >= 2  # decoded window by window while frames arrived
    assert chunked.audio.shape == ref.waveform.shape
    assert float((chunked.audio - ref.waveform).abs().max()) <= 1e-4
