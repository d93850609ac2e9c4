"""Realtime turn latency on a real `omnistage serve` of the demo's voice loop (Whisper tiny.en → SmolLM2 →
hibari): end of the user's speech → first response audio, one WS /v1/realtime session per client, against a
client doing the same turn as three HTTP calls (transcribe → chat → speech) on the same server, in the same
run, at 1 and 4 concurrent clients.

Both clients hear the same questions (spoken once by the server's voice, seeded). The realtime client
streams each question in real time (20 ms chunks, then silence) and server VAD ends the turn; its clock starts
when the last sample of speech has been sent, so the VAD's silence wait counts against it. The HTTP client
has the whole question when speech ends: it posts it to /v1/audio/transcriptions, the transcript to
/v1/chat/completions (greedy, not streamed: the whole answer is the speech input) and the answer to
/v1/audio/speech streamed as raw PCM (`stream_format: "audio"`, its first chunk is its first audio). Rounds
alternate realtime and HTTP so the machine's swings hit both alike.

    python benchmarks/realtime_turns.py [--rounds 3] [--silence-ms 300] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import time

import httpx
import numpy as np
import soundfile as sf
from local_server import start_server, stop

from omnistage.bench.backends import sender
from omnistage.bench.datasets import BenchRequest

RATE = 24000
REALTIME = sender("realtime")
CHAT, VOICE, WHISPER = "smollm2-135m-instruct", "hibari-en", "whisper-tiny.en"
QUESTIONS = [
    "What is the capital of France?",
    "How do I make a cup of tea?",
    "Name three colors of the rainbow.",
    "Why is the sky blue?",
]


def wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


async def realtime_turn(
    client: httpx.AsyncClient, speech: np.ndarray, args: argparse.Namespace
) -> tuple[float, float]:
    """Seconds from the last speech sample sent to the first response audio, and the answer's audio
    underrun (omnistage/bench/metrics.py: how far a player starting at its first audio would run dry): one
    turn of `omnistage bench serve --backend realtime` with server VAD (speech streamed in real time, then
    silence)."""
    turn_detection = {"type": "server_vad", "silence_duration_ms": args.silence_ms}
    extra = {"temperature": 0.0, "audio": {"input": {"turn_detection": turn_detection}}}
    request = BenchRequest("", 0, args.max_tokens, audio=speech.astype("<i2").tobytes())
    out = await REALTIME(client, CHAT, request, extra)
    if not out.success or out.audio_ttfp_s is None:
        raise SystemExit(f"realtime turn failed: {out.error or 'no audio'}")
    return out.audio_ttfp_s, out.audio_underrun_s


async def http_turn(client: httpx.AsyncClient, speech: np.ndarray, args: argparse.Namespace) -> float:
    """Seconds from the whole question in hand to the first audio of the spoken answer."""
    began = time.perf_counter()
    files = {"file": ("question.wav", wav(speech), "audio/wav")}
    heard = await client.post("/v1/audio/transcriptions", data={"model": WHISPER}, files=files)
    heard.raise_for_status()
    body = {
        "model": CHAT,
        "messages": [{"role": "user", "content": heard.json()["text"]}],
        "temperature": 0,
        "max_tokens": args.max_tokens,
    }
    answer = await client.post("/v1/chat/completions", json=body)
    answer.raise_for_status()
    text = answer.json()["choices"][0]["message"]["content"]
    speech_body = {"model": VOICE, "input": text, "response_format": "pcm", "stream_format": "audio"}
    async with client.stream("POST", "/v1/audio/speech", json=speech_body) as response:
        response.raise_for_status()
        async for data in response.aiter_bytes():
            if data:
                return time.perf_counter() - began
    raise SystemExit(f"no audio for the answer {text!r}")


async def level(url: str, questions: list[np.ndarray], clients: int, args: argparse.Namespace) -> dict:
    realtime, http = [], []
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        await http_turn(client, questions[0], args)  # warm up both paths
        await realtime_turn(client, questions[0], args)
        for r in range(args.rounds):
            picks = [questions[(r + c) % len(questions)] for c in range(clients)]
            realtime += await asyncio.gather(*(realtime_turn(client, q, args) for q in picks))
            http += await asyncio.gather(*(http_turn(client, q, args) for q in picks))
    rt, ht = statistics.median(t for t, _ in realtime), statistics.median(http)
    turns, worst = len(realtime), max(u for _, u in realtime)
    return {
        "clients": clients,
        "turns": turns,
        "realtime_p50_s": rt,
        "http_p50_s": ht,
        "ratio": rt / ht,
        "realtime_worst_underrun_s": worst,
    }


async def speak_questions(url: str) -> list[np.ndarray]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        out = []
        for i, text in enumerate(QUESTIONS):
            body = {"model": VOICE, "input": text, "response_format": "wav", "seed": i}
            response = await client.post("/v1/audio/speech", json=body)
            response.raise_for_status()
            out.append(sf.read(io.BytesIO(response.content), dtype="int16")[0])
        return out


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--silence-ms", type=int, default=300, help="server VAD's silence_duration_ms")
    parser.add_argument("--max-tokens", type=int, default=32, help="the chat model's answer length")
    parser.add_argument("--port", type=int, default=8931)
    args = parser.parse_args()
    from omnistage.demo.smollm import smollm2_dir
    from omnistage.demo.voice import spoken_chat_dir, voice_dir
    from omnistage.demo.whisper import whisper_dir

    models = [str(spoken_chat_dir(smollm2_dir())), str(voice_dir()), str(whisper_dir())]
    proc = start_server(models, args.port, ["--num-threads", "1", "--max-realtime-sessions", "8"])
    url = f"http://127.0.0.1:{args.port}"
    try:
        questions = asyncio.run(speak_questions(url))
        results = [asyncio.run(level(url, questions, clients, args)) for clients in (1, 4)]
    finally:
        stop(proc)
    print(f"realtime turns (silence_duration_ms={args.silence_ms}, answers of <= {args.max_tokens} tokens):")
    header = f"{'clients':>8} {'turns':>6} {'realtime p50 s':>15} {'3 HTTP calls p50 s':>19} {'ratio':>7}"
    print(f"{header} {'worst underrun s':>17}")
    for r in results:
        row = f"{r['clients']:>8} {r['turns']:>6} {r['realtime_p50_s']:>15.3f} {r['http_p50_s']:>19.3f}"
        print(f"{row} {r['ratio']:>6.2f}x {r['realtime_worst_underrun_s']:>17.3f}")
    print(json.dumps({"realtime_turns": results}))


if __name__ == "__main__":
    main()
