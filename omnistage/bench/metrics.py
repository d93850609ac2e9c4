"""What one benchmark request measured (`RequestOutput`) and the run's aggregate figures, with the metric
definitions of vLLM-Omni's `vllm bench serve --omni`, so figures from both tools compare:

- TTFT: send to the first non-empty text delta; TPOT: (E2EL - TTFT) / (output tokens - 1); ITL: the gaps
  between successive text deltas; E2EL: send to the last byte.
- TTFP (audio_ttfp): send to the first audio packet; audio RTF: E2EL / audio seconds (0 without audio);
  audio underrun: the worst deficit, in seconds, of a player that starts at the first packet and plays in
  real time (how far playback would run ahead of the audio received); a stream is continuous when its
  underrun is below `CONTINUITY_THRESHOLD_S`.
- Throughputs are totals over the run's duration (first send to last response); goodput is the requests
  per second that met every SLO given; SLO attainment is their fraction of the requests sent.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

CONTINUITY_THRESHOLD_S = 0.1
# SLO keys: the per-request value they bound (milliseconds, except the unitless RTF).
SLO_KEYS = ("ttft", "tpot", "e2el", "ttfp", "rtf")


@dataclasses.dataclass
class RequestOutput:
    success: bool = False
    error: str = ""
    latency_s: float = 0.0  # E2EL
    ttft_s: float | None = None
    itl_s: list[float] = dataclasses.field(default_factory=list)
    last_text_s: float = 0.0  # arrival of the latest text delta (the next ITL starts there)
    prompt_tokens: int = 0
    output_tokens: int = 0
    text: str = ""
    audio_ttfp_s: float | None = None
    audio_chunks: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (arrival s, dur s)
    images: int = 0
    videos: int = 0

    @property
    def audio_duration_s(self) -> float:
        return sum(duration for _, duration in self.audio_chunks)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def audio_rtf(self) -> float | None:
        if not self.audio_chunks:
            return None
        duration = self.audio_duration_s
        return self.latency_s / duration if duration > 0 else 0.0

    @property
    def audio_underrun_s(self) -> float | None:
        return underrun(self.audio_chunks) if self.audio_chunks else None

    def slo_value(self, key: str) -> float | None:
        """The value an SLO bounds, in the SLO's unit (ms, or unitless RTF)."""
        values = {
            "ttft": self.ttft_s,
            "tpot": self.tpot_s,
            "e2el": self.latency_s,
            "ttfp": self.audio_ttfp_s,
            "rtf": self.audio_rtf,
        }
        value = values[key]
        return value if value is None or key == "rtf" else value * 1e3


def underrun(chunks: list[tuple[float, float]]) -> float:
    """Worst buffer deficit (s) of a real-time player that starts playing at the first chunk's arrival."""
    start, received, worst = chunks[0][0], 0.0, 0.0
    for arrival, duration in chunks:
        worst = max(worst, (arrival - start) - received)
        received += duration
    return worst


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: with few samples p99 is the slowest request)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def parse_slos(text: str | None) -> dict[str, float]:
    """`"ttft:500 e2el:2000"` (ms; `rtf` unitless) → `{"ttft": 500.0, "e2el": 2000.0}`."""
    slos: dict[str, float] = {}
    for item in (text or "").replace(",", " ").split():
        key, _, value = item.partition(":")
        if key not in SLO_KEYS or not value:
            raise ValueError(f"--goodput: {item!r}; give KEY:VALUE with KEY one of {', '.join(SLO_KEYS)}")
        slos[key] = float(value)
    return slos


def meets(output: RequestOutput, slos: dict[str, float]) -> bool:
    """Succeeded and within every SLO (a bound on a value the request lacks, e.g. one token's TPOT, holds)."""
    if not output.success:
        return False
    for key, bound in slos.items():
        value = output.slo_value(key)
        if value is not None and value > bound:
            return False
    return True


def summarize(
    outputs: list[RequestOutput],
    duration_s: float,
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0),
    slos: dict[str, float] | None = None,
) -> dict[str, Any]:
    """The run's figures as flat JSON keys (`mean_ttft_ms`, `p99_itl_ms`, `audio_throughput`, ...)."""
    ok = [o for o in outputs if o.success]
    duration = max(duration_s, 1e-9)
    input_tokens = sum(o.prompt_tokens for o in ok)
    output_tokens = sum(o.output_tokens for o in ok)
    good = [o for o in outputs if meets(o, slos or {})]
    result: dict[str, Any] = {
        "duration_s": duration_s,
        "num_requests": len(outputs),
        "completed": len(ok),
        "failed": len(outputs) - len(ok),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "percentiles": list(percentiles),
        "slos": slos or {},
        "good_requests": len(good),
        "goodput": len(good) / duration,
        "slo_attainment": len(good) / len(outputs) if outputs else float("nan"),
    }
    series = {"e2el_ms": [o.latency_s * 1e3 for o in ok]}
    if output_tokens or any(o.ttft_s is not None for o in ok):  # text metrics only when text came back
        series["ttft_ms"] = [o.ttft_s * 1e3 for o in ok if o.ttft_s is not None]
        series["tpot_ms"] = [o.tpot_s * 1e3 for o in ok if o.tpot_s is not None]
        series["itl_ms"] = [gap * 1e3 for o in ok for gap in o.itl_s]
    spoken = [o for o in ok if o.audio_chunks]
    if spoken:
        audio_seconds = sum(o.audio_duration_s for o in spoken)
        series["audio_ttfp_ms"] = [o.audio_ttfp_s * 1e3 for o in spoken]
        series["audio_rtf"] = [o.audio_rtf for o in spoken]
        series["audio_duration_s"] = [o.audio_duration_s for o in spoken]
        series["audio_underrun_s"] = [o.audio_underrun_s for o in spoken]
        continuous = sum(o.audio_underrun_s < CONTINUITY_THRESHOLD_S for o in spoken)
        result |= {
            "total_audio_duration_s": audio_seconds,
            "audio_throughput": audio_seconds / duration,
            "audio_continuity_threshold_s": CONTINUITY_THRESHOLD_S,
            "audio_continuity_ok_rate": continuous / len(spoken),
        }
    images, videos = sum(o.images for o in ok), sum(o.videos for o in ok)
    if images or videos:
        result |= {
            "total_images": images,
            "image_throughput": images / duration,
            "total_videos": videos,
            "video_throughput": videos / duration,
        }
    for name, values in series.items():
        result |= stats(name, values, percentiles)
    return result


def stats(name: str, values: list[float], percentiles: tuple[float, ...]) -> dict[str, float]:
    """mean/median/std and each percentile of one metric: `mean_ttft_ms`, `p99_ttft_ms`, ..."""
    ordered = sorted(values)
    n = len(ordered)
    mean = sum(ordered) / n if n else float("nan")
    std = math.sqrt(sum((v - mean) ** 2 for v in ordered) / n) if n else float("nan")
    out = {f"mean_{name}": mean, f"median_{name}": percentile(ordered, 50), f"std_{name}": std}
    for q in percentiles:
        out[f"p{q:g}_{name}"] = percentile(ordered, q)
    return out
