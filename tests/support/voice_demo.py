"""One real `omnistage serve` of the demo set and the tiny Qwen2.5-Omni, shared by tests/speech,
tests/whisper, tests/realtime and tests/bench (one start, ~a minute of the suite on 2 cores, instead of
four): the tiny Qwen2.5-Omni (hears audio, answers in text and speech), the demo's chat model that speaks
(SmolLM2 → hibari), the voice itself (`hibari-en`), Whisper tiny.en and the trained shapes model
(`wan-shapes`: images and clips). Small realtime bounds, so the realtime tests can reach them; they touch
nothing the other routes do. The voices and storage directories are the session's own: uploads and video
jobs never touch the user's cache.

The fixture is `voice_demo_server` (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

OMNI = "qwen2_5_omni-tiny-2"
VOICE = "hibari-en"
CHAT = "smollm2-135m-instruct"
WHISPER = "whisper-tiny.en"
MAX_SESSIONS = 2
MAX_AUDIO_S = 20
IDLE_S = 4


def voice_demo_args(voices_dir: Path, storage_dir: Path) -> list[str]:
    from omnistage.demo import demo_model_dirs
    from omnistage.families.qwen2_5_omni.tiny import qwen2_5_omni_dir

    models = [qwen2_5_omni_dir(), *demo_model_dirs()]
    args = ["serve", *map(str, models), "--num-threads", "1", "--voices-dir", str(voices_dir)]
    args += ["--storage-dir", str(storage_dir)]
    args += ["--max-realtime-sessions", str(MAX_SESSIONS), "--realtime-max-audio-seconds", str(MAX_AUDIO_S)]
    return args + ["--realtime-idle-timeout", str(IDLE_S)]
