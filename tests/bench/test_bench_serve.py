"""`omnistage bench serve` against a real `omnistage serve` of the demo set (SmolLM2 that can speak, the
`hibari-en` voice, the `wan-shapes` image/video model; the session's shared server,
tests/support/voice_demo.py):
every backend runs a short load and its JSON holds each metric with a value consistent with the
per-request records of the same run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from omnistage.cli import main as cli_main
from tests.support.polling import wait_until
from tests.support.server_process import REPO, ServerProcess

pytestmark = pytest.mark.e2e
CHAT, VOICE, SHAPES = "smollm2-135m-instruct", "hibari-en", "wan-shapes"
DIFFUSION = json.dumps({"size": "32x32", "num_inference_steps": 2})


@pytest.fixture(scope="module")
def server(voice_demo_server: ServerProcess) -> ServerProcess:
    return voice_demo_server


def bench(server: ServerProcess, tmp_path: Path, *flags: str) -> dict:
    result_file = tmp_path / "result.json"
    common = ["--base-url", server.url, "--disable-tqdm", "--result-file", str(result_file)]
    assert cli_main(["bench", "serve", *common, *flags]) == 0
    return json.loads(result_file.read_text())


def check_run(result: dict, sent: int, failed: int = 0) -> list[dict]:
    """Counts equal the requests sent, each metric's statistics are ordered and agree with the
    per-request records, and throughputs are totals over the same run's duration."""
    ok = [r for r in result["requests"] if r["success"]]
    assert (result["num_requests"], result["completed"], result["failed"]) == (sent, sent - failed, failed)
    assert len(result["requests"]) == sent and len(ok) == sent - failed
    assert not result["interrupted"] and result["duration_s"] > 0
    assert result["request_throughput"] == pytest.approx(len(ok) / result["duration_s"])
    tokens = sum(r["output_tokens"] for r in ok)
    assert result["total_output_tokens"] == tokens
    assert result["output_throughput"] == pytest.approx(tokens / result["duration_s"])
    latencies = sorted(r["latency_s"] * 1e3 for r in ok)
    assert result["p99_e2el_ms"] == pytest.approx(latencies[-1])
    assert latencies[0] <= result["mean_e2el_ms"] <= latencies[-1]
    for metric in [key[len("mean_") :] for key in result if key.startswith("mean_")]:
        p50, p90, p99 = (result[f"p{q}_{metric}"] for q in (50, 90, 99))
        assert 0 <= p50 <= p90 <= p99, metric
        assert result[f"median_{metric}"] == p50
    for record in ok:
        assert 0 < record["latency_s"] < result["duration_s"] * 1.01
    return ok


def stage_requests(result: dict) -> dict[str, float]:
    return {s["stage_name"]: s["requests"] for s in result["stage_breakdown"]["stages"]}


def test_chat(server, tmp_path, capsys):
    flags = ["--backend", "chat", "--model", CHAT, "--num-prompts", "4", "--max-concurrency", "2"]
    flags += ["--num-warmups", "1", "--random-output-len", "6", "--goodput", "e2el:600000"]
    result = bench(server, tmp_path, *flags)
    ok = check_run(result, 4)  # the warm-up request is neither counted nor in the stage breakdown
    assert result["total_output_tokens"] == 4 * 6  # ignore_eos: every request makes its max_tokens
    assert result["total_input_tokens"] > 4 * 32  # 32 words each, and the chat template around them
    assert all(0 < r["ttft_s"] < r["latency_s"] and r["tpot_s"] > 0 for r in ok)
    assert 0 < result["p99_ttft_ms"] < result["p99_e2el_ms"] and result["mean_itl_ms"] > 0
    assert (result["good_requests"], result["slo_attainment"]) == (4, 1.0)
    assert result["goodput"] == pytest.approx(result["request_throughput"])
    assert stage_requests(result) == {"llm": 4, "voice": 0}
    assert result["stage_breakdown"]["server_mean_ttft_ms"] > 0
    table = capsys.readouterr().out
    assert "Serving Benchmark Result" in table and "Mean ttft_ms" in table and "per stage" in table


def test_completions(server, tmp_path):
    flags = ["--backend", "completions", "--model", CHAT, "--num-prompts", "3", "--max-concurrency", "3"]
    flags += ["--request-rate", "20", "--random-output-len", "5", "--random-input-len", "12"]
    result = bench(server, tmp_path, *flags)
    ok = check_run(result, 3)
    assert result["total_output_tokens"] == 3 * 5
    assert all(r["prompt_tokens"] >= 12 for r in ok)
    assert result["total_token_throughput"] == pytest.approx(
        (result["total_input_tokens"] + result["total_output_tokens"]) / result["duration_s"]
    )


def test_chat_audio(server, tmp_path):
    """Greedy: a sampled reply can be nothing a voice can say (1 in 40 six-token replies at temperature 1 was
    two emoji), which speaks no audio and counts as failed."""
    flags = ["--backend", "chat-audio", "--model", CHAT, "--num-prompts", "2", "--max-concurrency", "2"]
    flags += ["--extra-body", json.dumps({"temperature": 0})]
    result = bench(server, tmp_path, *flags, "--random-output-len", "6")
    ok = check_audio(result, check_run(result, 2))
    assert all(r["ttft_s"] is not None for r in ok)  # the text came too
    assert stage_requests(result) == {"llm": 2, "voice": 2}
    assert result["stage_breakdown"]["server_mean_ttfa_ms"] > 0


def check_audio(result: dict, ok: list[dict]) -> list[dict]:
    for r in ok:
        assert 0 < r["audio_ttfp_s"] <= r["latency_s"] and r["audio_duration_s"] > 0
        assert r["audio_rtf"] == pytest.approx(r["latency_s"] / r["audio_duration_s"])
        assert r["audio_underrun_s"] >= 0
    total = sum(r["audio_duration_s"] for r in ok)
    assert result["total_audio_duration_s"] == pytest.approx(total)
    assert result["audio_throughput"] == pytest.approx(total / result["duration_s"])
    continuous = sum(r["audio_underrun_s"] < result["audio_continuity_threshold_s"] for r in ok)
    assert result["audio_continuity_ok_rate"] == pytest.approx(continuous / len(ok))
    assert result["p99_audio_rtf"] == pytest.approx(max(r["audio_rtf"] for r in ok))
    return ok


def test_speech(server, tmp_path):
    flags = ["--backend", "speech", "--model", VOICE, "--num-prompts", "3", "--max-concurrency", "2"]
    result = bench(server, tmp_path, *flags, "--random-input-len", "8", "--goodput", "ttfp:600000 rtf:100")
    ok = check_audio(result, check_run(result, 3))
    assert "mean_ttft_ms" not in result  # speech makes no text: no text metrics
    assert all(r["prompt_tokens"] > 0 for r in ok)
    assert result["slo_attainment"] == 1.0
    assert stage_requests(result) == {"voice": 3}


def test_a_failing_request_is_counted(server, tmp_path):
    lines = tmp_path / "meta.lst"
    lines.write_text("a1|||Good morning.\na2|||" + "word " * 1000 + "\na3|||The river is quiet.\n")
    flags = ["--backend", "speech", "--model", VOICE, "--dataset", "tts-file", "--dataset-path", str(lines)]
    result = bench(server, tmp_path, *flags, "--num-prompts", "3", "--max-concurrency", "1")
    check_audio(result, check_run(result, 3, failed=1))
    assert len(result["errors"]) == 1
    assert result["errors"][0].startswith("ValueError: HTTP 400") and "4096" in result["errors"][0]
    assert not result["requests"][1]["success"] and result["slo_attainment"] == pytest.approx(2 / 3)


def test_images(server, tmp_path):
    flags = ["--backend", "images", "--model", SHAPES, "--num-prompts", "2", "--max-concurrency", "2"]
    result = bench(server, tmp_path, *flags, "--extra-body", DIFFUSION, "--goodput", "e2el:600000")
    check_run(result, 2)
    assert (result["total_images"], result["total_videos"]) == (2, 0)
    assert result["image_throughput"] == pytest.approx(2 / result["duration_s"])
    assert result["slo_attainment"] == 1.0
    assert stage_requests(result) == {"image": 2, "video": 0}


def test_videos(server, tmp_path):
    flags = ["--backend", "videos", "--model", SHAPES, "--num-prompts", "2", "--max-concurrency", "2"]
    extra = json.dumps({"num_inference_steps": 2, "num_frames": 5})
    result = bench(server, tmp_path, *flags, "--extra-body", extra, "--goodput", "e2el:1")
    check_run(result, 2)
    assert (result["total_images"], result["total_videos"]) == (0, 2)
    assert result["video_throughput"] == pytest.approx(2 / result["duration_s"])
    assert (result["good_requests"], result["slo_attainment"]) == (0, 0.0)  # nothing meets a 1 ms SLO
    assert stage_requests(result)["video"] == 2


def check_realtime(result: dict, sent: int, max_tokens: int) -> list[dict]:
    """A realtime turn speaks its answer with the transcript: both clocks start at the turn's end."""
    ok = check_audio(result, check_run(result, sent))
    for r in ok:
        assert 0 < r["ttft_s"] < r["latency_s"] and 1 <= r["output_tokens"] <= max_tokens
        assert r["prompt_tokens"] > 0
    assert stage_requests(result) == {"llm": sent, "voice": sent}
    return ok


def test_realtime_text_turns(server, tmp_path):
    """Greedy answers to the seeded prompts: a sampled six-token answer may hold nothing the voice can say
    (punctuation alone), and a turn that speaks nothing has no audio to measure."""
    flags = ["--backend", "realtime", "--model", CHAT, "--num-prompts", "2", "--max-concurrency", "2"]
    flags += ["--extra-body", json.dumps({"temperature": 0})]
    result = bench(server, tmp_path, *flags, "--random-output-len", "6", "--random-input-len", "8")
    check_realtime(result, 2, 6)


def test_realtime_spoken_turns_end_by_server_vad(server, tmp_path):
    """The prompts said by the server's voice are streamed in real time; server VAD ends each turn and
    starts the response (the client sends no commit or response.create)."""
    vad = {"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}}
    flags = ["--backend", "realtime", "--model", CHAT, "--num-prompts", "2", "--max-concurrency", "2"]
    flags += ["--speak-prompts-with", VOICE, "--random-input-len", "5", "--random-output-len", "6"]
    result = bench(server, tmp_path, *flags, "--extra-body", json.dumps(vad | {"temperature": 0}))
    assert result["extra_body"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    check_realtime(result, 2, 6)


def finished_requests(server: ServerProcess, model: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "omnistage_requests_finished_total" and sample.labels.get("model") == model
    )


def test_ctrl_c_reports_what_was_measured(server, tmp_path):
    before = finished_requests(server, CHAT)
    result_file = tmp_path / "partial.json"
    command = [sys.executable, "-m", "omnistage", "bench", "serve", "--base-url", server.url, "--backend"]
    command += ["chat", "--model", CHAT, "--num-prompts", "200", "--max-concurrency", "1"]
    command += ["--random-output-len", "4", "--disable-tqdm", "--result-file", str(result_file)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: finished_requests(server, CHAT) >= before + 2, 120, "two requests finished")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "(interrupted)" in out and "Mean ttft_ms" in out
    result = json.loads(result_file.read_text())
    assert result["interrupted"] and 1 <= result["completed"] < 200
    assert result["num_requests"] == result["completed"] == len(result["requests"])
    assert result["total_output_tokens"] == 4 * result["completed"]
