"""Benchmark workloads, generated locally from a seed or read from a local file: nothing is downloaded, so a
run is reproducible offline and two servers measured with the same flags get the same requests."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import random
from pathlib import Path

DATASETS = ("random", "random-mm", "sharegpt-file", "tts-file", "audio-file")
AUDIO_RATE = 24000  # the realtime API's PCM16 rate
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")
# Plain English words: every tokenizer splits them into a few tokens, and a voice can say them.
_WORD_TEXT = (
    "the a small red blue green house river stone light morning evening quiet bright cold warm city road "
    "window garden music story paper water forest mountain bird cloud voice simple letter friend market "
    "table chair summer winter early late open close happy calm slow quick north south island harbor"
)
WORDS = tuple(_WORD_TEXT.split())
# Fixed sentences for speech round trips (a voice says them, a recogniser hears them): plain words, no
# digits, so scoring needs no more normalising than omnistage/bench/wer.py's.
SPOKEN_SENTENCES = (
    "The weather is nice today. Please open the door for me.",
    "Turn left at the next corner; the station is on your right.",
    "I would like a cup of coffee with a little milk.",
    "The children played in the garden until the sun went down.",
    "Please send me the report before the meeting tomorrow.",
    "She reads a book every night before she goes to sleep.",
    "The train to the city leaves from the second platform.",
    "We need to buy bread, eggs and fresh fruit at the market.",
    "My brother is learning to play the piano this year.",
    "Could you tell me where the nearest library is?",
)


@dataclasses.dataclass
class BenchRequest:
    prompt: str
    input_len: int  # words in the prompt (the server's usage gives tokens)
    output_len: int | None = None  # max tokens to ask for (None: the server's default)
    images: list[str] = dataclasses.field(default_factory=list)  # data URLs, for chat backends
    audio: bytes | None = None  # PCM16 mono at 24 kHz: the spoken turn of the realtime backend


def load_dataset(
    name: str,
    num_prompts: int,
    *,
    seed: int = 0,
    path: str | None = None,
    input_len: int = 32,
    output_len: int | None = None,
    range_ratio: float = 0.0,
    mm_images: int = 1,
    mm_size: tuple[int, int] = (64, 64),
) -> list[BenchRequest]:
    """`num_prompts` requests of dataset `name`; file datasets repeat their entries when they are short."""
    rng = random.Random(seed)
    if name in ("random", "random-mm"):
        requests = [
            _random_request(rng, input_len, output_len or 32, range_ratio) for _ in range(num_prompts)
        ]
        if name == "random-mm":
            for request in requests:
                request.images = [random_image(rng, *mm_size) for _ in range(mm_images)]
        return requests
    if name not in ("sharegpt-file", "tts-file", "audio-file"):
        raise ValueError(f"--dataset: unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    if not path:
        raise ValueError(f"--dataset {name} needs --dataset-path (a local file)")
    if name == "sharegpt-file":
        entries = _sharegpt(Path(path), output_len)
    elif name == "tts-file":
        entries = _tts_lines(Path(path))
    else:
        entries = _audio_files(Path(path), output_len)
    if not entries:
        raise ValueError(f"--dataset-path {path}: no usable entries")
    return [dataclasses.replace(entries[i % len(entries)]) for i in range(num_prompts)]


def _random_request(rng: random.Random, input_len: int, output_len: int, ratio: float) -> BenchRequest:
    n_in = _around(rng, input_len, ratio)
    return BenchRequest(
        " ".join(rng.choice(WORDS) for _ in range(n_in)), n_in, _around(rng, output_len, ratio)
    )


def _around(rng: random.Random, n: int, ratio: float) -> int:
    """A length uniform in [n(1-ratio), n(1+ratio)], at least 1 (vLLM's --random-range-ratio)."""
    return max(1, rng.randint(int(n * (1 - ratio)), int(n * (1 + ratio))))


def random_image(rng: random.Random, width: int, height: int) -> str:
    """A PNG of random pixels as a data URL."""
    from PIL import Image

    image = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _sharegpt(path: Path, output_len: int | None) -> list[BenchRequest]:
    """ShareGPT JSON: `[{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}]`; the
    first human turn is the prompt and the reply's length in words the output length (when no
    --random-output-len was given)."""
    entries = []
    for record in json.loads(path.read_text()):
        turns = record.get("conversations") or record.get("conversation") or []
        if len(turns) < 2 or not turns[0].get("value"):
            continue
        prompt, reply = turns[0]["value"], turns[1].get("value") or ""
        wanted = output_len or max(1, len(reply.split()))
        entries.append(BenchRequest(prompt, len(prompt.split()), wanted))
    return entries


def _tts_lines(path: Path) -> list[BenchRequest]:
    """One utterance per line, or seed-tts `meta.lst` lines (`id|ref_text|ref_wav|target_text[|...]`, the
    4th field is the text to say)."""
    entries = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split("|")
        text = (fields[3] if len(fields) >= 4 else fields[-1]).strip()
        if text:
            entries.append(BenchRequest(text, len(text.split())))
    return entries


def _audio_files(path: Path, output_len: int | None) -> list[BenchRequest]:
    """Spoken turns: the audio files of a directory (sorted), or those a text file lists one per line
    (relative to it); each is read, mixed to mono and resampled to 24 kHz PCM16."""
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.suffix.lower() in AUDIO_SUFFIXES)
    else:
        lines = [line.strip() for line in path.read_text().splitlines()]
        files = [path.parent / line for line in lines if line and not line.startswith("#")]
    requests = []
    for f in files:
        try:
            audio = realtime_pcm(f.read_bytes())
        except (OSError, RuntimeError) as exc:  # soundfile's LibsndfileError is a RuntimeError
            raise ValueError(f"--dataset-path: cannot read {f}: {exc}") from None
        requests.append(BenchRequest(f.stem, 0, output_len, audio=audio))
    return requests


def realtime_pcm(data: bytes) -> bytes:
    """An encoded clip (WAV, FLAC, ...) as the realtime API's PCM16 mono at 24 kHz."""
    from omnistage.media import decode_audio, resample
    from omnistage.serving.media import pcm16

    samples, rate = decode_audio(data)
    mono = samples.mean(axis=0) if samples.ndim == 2 else samples
    return pcm16(resample(mono.astype("float32"), rate, AUDIO_RATE))


async def speak_prompts(client, voice: str, requests: list[BenchRequest], seed: int = 0) -> None:
    """Gives each request the audio of its prompt, said by the server's `voice` through
    `/v1/audio/speech` (seeded, one call per distinct prompt) before the run: spoken turns for the realtime
    backend from any text dataset, without audio files."""
    said: dict[str, bytes] = {}
    for i, request in enumerate(requests):
        if request.prompt not in said:
            body = {"model": voice, "input": request.prompt, "response_format": "wav", "seed": seed + i}
            response = await client.post("/v1/audio/speech", json=body)
            if response.status_code != 200:
                raise ValueError(
                    f"--speak-prompts-with {voice}: HTTP {response.status_code}: {response.text[:300]}"
                )
            said[request.prompt] = realtime_pcm(response.content)
        request.audio = said[request.prompt]
