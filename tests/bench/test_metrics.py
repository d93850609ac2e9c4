"""The benchmark's metric definitions and datasets, on hand-made request records (no server)."""

from __future__ import annotations

import json
import math

import pytest

from omnistage.bench.datasets import load_dataset
from omnistage.bench.metrics import RequestOutput, meets, parse_slos, summarize, underrun

pytestmark = pytest.mark.unit


def test_underrun_is_the_worst_deficit_of_a_realtime_player():
    # 0.5 s of audio at t=0, the next 0.5 s at t=0.8: the player ran dry for 0.3 s.
    assert underrun([(0.0, 0.5), (0.8, 0.5), (1.0, 1.0)]) == pytest.approx(0.3)
    # Audio ahead of playback never underruns.
    assert underrun([(0.2, 1.0), (0.5, 1.0), (1.9, 1.0)]) == 0.0


def test_tpot_rtf_and_slos_of_one_request():
    out = RequestOutput(success=True, latency_s=1.0, ttft_s=0.1, output_tokens=10)
    out.audio_chunks = [(0.2, 2.0), (0.5, 2.0)]
    out.audio_ttfp_s = 0.2
    assert out.tpot_s == pytest.approx(0.1)
    assert out.audio_rtf == pytest.approx(0.25)
    assert meets(out, parse_slos("ttft:200 tpot:150 rtf:0.5"))
    assert not meets(out, parse_slos("ttfp:100"))
    assert not meets(RequestOutput(success=False), {})
    with pytest.raises(ValueError, match="ttft"):
        parse_slos("latency:5")


def test_summary_counts_throughputs_and_ordered_percentiles():
    outputs = [
        RequestOutput(
            success=True, latency_s=0.1 * (i + 1), ttft_s=0.01 * (i + 1), prompt_tokens=5, output_tokens=4
        )
        for i in range(10)
    ]
    outputs.append(RequestOutput(success=False, error="HTTP 500"))
    result = summarize(outputs, duration_s=2.0, percentiles=(50, 90, 99), slos={"e2el": 500})
    assert (result["num_requests"], result["completed"], result["failed"]) == (11, 10, 1)
    assert result["total_output_tokens"] == 40
    assert result["output_throughput"] == pytest.approx(20.0)
    assert result["total_token_throughput"] == pytest.approx(45.0)
    assert result["good_requests"] == 5  # latencies 0.1 .. 0.5 s
    assert result["slo_attainment"] == pytest.approx(5 / 11)
    assert result["mean_e2el_ms"] == pytest.approx(550.0)
    assert result["p50_e2el_ms"] <= result["p90_e2el_ms"] <= result["p99_e2el_ms"] == pytest.approx(1000.0)
    assert "mean_audio_ttfp_ms" not in result  # no audio came back


def test_random_datasets_are_seeded_and_sized():
    first = load_dataset("random", 4, seed=3, input_len=10, output_len=7)
    assert [r.prompt for r in first] == [r.prompt for r in load_dataset("random", 4, seed=3, input_len=10)]
    assert all(len(r.prompt.split()) == r.input_len == 10 and r.output_len == 7 for r in first)
    ranged = load_dataset("random", 50, seed=1, input_len=20, range_ratio=0.5)
    assert {r.input_len for r in ranged} <= set(range(10, 31)) and len({r.input_len for r in ranged}) > 3
    mm = load_dataset("random-mm", 2, mm_images=2, mm_size=(16, 8))
    assert all(len(r.images) == 2 and r.images[0].startswith("data:image/png;base64,") for r in mm)


def test_file_datasets(tmp_path):
    sharegpt = tmp_path / "sharegpt.json"
    conversation = [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "one two three"}]
    sharegpt.write_text(json.dumps([{"conversations": conversation}, {"conversations": []}]))
    requests = load_dataset("sharegpt-file", 3, path=str(sharegpt))
    assert [(r.prompt, r.output_len) for r in requests] == [("hi there", 3)] * 3
    meta = tmp_path / "meta.lst"
    meta.write_text("smoke001|||Good morning.\nA plain line.\n\n")
    prompts = [r.prompt for r in load_dataset("tts-file", 2, path=str(meta))]
    assert prompts == ["Good morning.", "A plain line."]
    with pytest.raises(ValueError, match="--dataset-path"):
        load_dataset("tts-file", 1)
    assert math.isnan(summarize([], 1.0)["slo_attainment"])


def test_audio_file_dataset_is_24k_pcm16(tmp_path):
    """A directory's clips (sorted) or a list file's, each mixed to mono and resampled to the realtime API's
    24 kHz PCM16: a 16 kHz stereo second of a tone comes out as one second of mono samples."""
    import numpy as np
    import soundfile

    t = np.arange(16000) / 16000
    tone = 0.5 * np.sin(2 * np.pi * 440 * t)
    soundfile.write(tmp_path / "b.wav", np.stack([tone, tone], axis=1), 16000)
    soundfile.write(tmp_path / "a.flac", tone[:8000], 16000)
    (tmp_path / "notes.txt").write_text("not audio")
    requests = load_dataset("audio-file", 3, path=str(tmp_path), output_len=5)
    assert [r.prompt for r in requests] == ["a", "b", "a"] and all(r.output_len == 5 for r in requests)
    samples = np.frombuffer(requests[1].audio, "<i2") / 32768
    assert abs(len(samples) - 24000) <= 64
    spectrum = np.abs(np.fft.rfft(samples))
    assert abs(np.argmax(spectrum) * 24000 / len(samples) - 440) < 5  # the tone, not noise or a shifted pitch
    assert 0.45 < np.abs(samples).max() < 0.55
    listed = tmp_path / "list.txt"
    listed.write_text("# spoken turns\nb.wav\n")
    assert load_dataset("audio-file", 1, path=str(listed))[0].audio == requests[1].audio
    listed.write_text("missing.wav\n")
    with pytest.raises(ValueError, match="cannot read"):
        load_dataset("audio-file", 1, path=str(listed))
