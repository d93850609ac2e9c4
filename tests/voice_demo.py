"""One real `omnistage serve` of every model that speaks or listens, shared by tests/speech, tests/whisper
and tests/realtime (one start, ~a minute of the suite, instead of three): the tiny Qwen2.5-Omni (hears audio,
answers in text and speech), the demo's chat model that speaks (SmolLM2 → hibari), the voice itself
(`hibari-en`) and Whisper tiny.en. Small realtime bounds, so the realtime tests can reach them; they touch
nothing the other routes do. The voices directory is the session's own: uploads never touch the user's cache.

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


def voice_demo_args(voices_dir: Path) -> list[str]:
    from omnistage.demo.qwen2_5_omni import qwen2_5_omni_dir
    from omnistage.demo.smollm import smollm2_dir
    from omnistage.demo.voice import spoken_chat_dir, voice_dir
    from omnistage.demo.whisper import whisper_dir

    models = [qwen2_5_omni_dir(), spoken_chat_dir(smollm2_dir()), voice_dir(), whisper_dir()]
    args = ["serve", *map(str, models), "--num-threads", "1", "--voices-dir", str(voices_dir)]
    args += ["--max-realtime-sessions", str(MAX_SESSIONS), "--realtime-max-audio-seconds", str(MAX_AUDIO_S)]
    return args + ["--realtime-idle-timeout", str(IDLE_S)]
