"""What a transcription answer looks like in each `response_format`, from the stages' final output.

A transcription pipeline's final text output holds one choice per audio segment (or plain `text` for
one) and `data["segments"]`, each segment's (start, end) in seconds of the input (config/capabilities.py).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Any

from omnistage.outputs import OmniRequestOutput

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")


@dataclasses.dataclass
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int]
    logprobs: list[Any]


def segments_of(out: OmniRequestOutput, eos_ids: set[int]) -> list[Segment]:
    """The output's segments in order (one for an output without choices)."""
    choices = out.outputs.get("choices") or [
        {"text": out.text, "token_ids": out.token_ids, "logprobs": out.logprobs}
    ]
    bounds = out.data.get("segments") or [(0.0, 0.0)] * len(choices)
    return [
        Segment(
            float(a),
            float(b),
            c["text"].strip(),
            [t for t in c["token_ids"] if t not in eos_ids],
            c["logprobs"],
        )
        for (a, b), c in zip(bounds, choices, strict=True)
    ]


def full_text(segments: list[Segment]) -> str:
    return " ".join(s.text for s in segments if s.text)


def usage(seconds: float) -> dict[str, Any]:
    """OpenAI's usage of a duration-billed transcription model."""
    return {"type": "duration", "seconds": math.ceil(seconds)}


def _compression_ratio(text: str) -> float:
    data = text.encode()
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _avg_logprob(seg: Segment) -> float | None:
    values = [e["logprob"] for e in seg.logprobs if isinstance(e, dict) and "logprob" in e]
    return sum(values) / len(values) if values else None


def verbose(segments: list[Segment], task: str, language: str, seconds: float, temperature: float) -> dict:
    return {
        "task": task,
        "language": language,
        "duration": seconds,
        "text": full_text(segments),
        "segments": [
            {
                "id": i,
                "seek": int(round(s.start * 100)),  # OpenAI's seek: the segment's start in 10 ms frames
                "start": s.start,
                "end": s.end,
                "text": s.text,
                "tokens": s.tokens,
                "temperature": temperature,
                "avg_logprob": _avg_logprob(s),
                "compression_ratio": _compression_ratio(s.text),
                "no_speech_prob": None,
            }
            for i, s in enumerate(segments)
        ],
        "usage": usage(seconds),
    }


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(segments: list[Segment]) -> str:
    cues = [
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text}\n"
        for i, s in enumerate((s for s in segments if s.text), 1)
    ]
    return "\n".join(cues)


def vtt(segments: list[Segment]) -> str:
    cues = [f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text}\n" for s in segments if s.text]
    return "WEBVTT\n\n" + "\n".join(cues)
