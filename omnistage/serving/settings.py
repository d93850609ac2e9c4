"""What an operator decides about a server (limits, secrets, media policy), separate from the models."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass
class ServerSettings:
    """Every knob of the HTTP layer; `omnistage serve` fills it from its flags.

    Limits exist so that one client cannot exhaust the server: bodies are capped before they are read in
    full, image sizes are checked before any work starts, and local or remote media are opt-in because the
    server must not read arbitrary files or fetch arbitrary hosts on a client's behalf.
    """

    api_key: str | None = None
    max_request_bytes: int = 64 * 1024 * 1024
    # The global image cap (`--max-generated-image-size`): generated images and frames, and decoded
    # uploads; each model's own `max_pixels` limit applies under it (serving/limits.py).
    max_image_pixels: int = 4096 * 4096
    storage_dir: Path | None = None
    allowed_local_media_path: Path | None = None
    allow_remote_media: bool = False
    remote_media_timeout_s: float = 10.0
    # Seconds a client waits before retrying when admission is full (the Retry-After header).
    retry_after_s: int = 1
    # Seconds in-flight work may take to finish after SIGTERM before it is aborted.
    shutdown_grace_s: float = 10.0
    # Slow clients (serving/guards.py): seconds a request's body may take to arrive (408 after), and
    # seconds one response part or WebSocket message may wait for the client to take it (dropped after).
    request_body_timeout_s: float = 60.0
    send_timeout_s: float = 30.0
    # Events a second one WebSocket client may send on average (bursts of twice that); over it, the socket
    # is closed after an `error` event (serving/event_rate.py).
    max_ws_events_per_s: float = 500.0
    # Realtime sessions (`WS /v1/realtime`): how many may be open at once, how long one may stay silent
    # while nothing is being answered, and how much input audio its buffer (or one item) may hold.
    max_realtime_sessions: int = 16
    realtime_idle_timeout_s: float = 300.0
    realtime_max_audio_seconds: float = 120.0
    # Uploaded voices: one file each under `voices_dir` (None: a temporary dir), bounded in size and count.
    voices_dir: Path | None = None
    max_voice_upload_bytes: int = 10 * 1024 * 1024
    max_uploaded_voices: int = 1000
    # Seconds a speech WebSocket may wait for its client (with nothing being spoken) before it is closed.
    speech_stream_idle_timeout_s: float = 300.0
    # The browser playground at `/` and `/playground` (`--no-playground` turns it off).
    playground: bool = True
    # How replies' tool calls are read (`--tool-call-parser`: serving/tool_parsers.py); None: each model's
    # pipeline's own (`Capabilities.tool_parser`).
    tool_call_parser: str | None = None
    # LoRA adapters diffusion requests may name (`--lora-modules NAME=PATH`; serving/loras.py).
    lora_modules: dict[str, Path] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.storage_dir is not None:
            self.storage_dir = Path(self.storage_dir).expanduser().resolve()
        if self.voices_dir is not None:
            self.voices_dir = Path(self.voices_dir).expanduser().resolve()
        if self.allowed_local_media_path is not None:
            self.allowed_local_media_path = Path(self.allowed_local_media_path).expanduser().resolve()
        if self.max_request_bytes < 1:
            raise ValueError("max_request_bytes must be >= 1")
        if self.max_image_pixels < 1:
            raise ValueError("max_image_pixels must be >= 1")
        if self.max_voice_upload_bytes < 1 or self.max_uploaded_voices < 0:
            raise ValueError("max_voice_upload_bytes must be >= 1 and max_uploaded_voices >= 0")
        if self.request_body_timeout_s <= 0 or self.send_timeout_s <= 0 or self.max_ws_events_per_s <= 0:
            raise ValueError("request_body_timeout_s, send_timeout_s and max_ws_events_per_s must be > 0")
        if self.speech_stream_idle_timeout_s <= 0:
            raise ValueError("speech_stream_idle_timeout_s must be > 0")
        if self.max_realtime_sessions < 0 or self.realtime_idle_timeout_s <= 0:
            raise ValueError("max_realtime_sessions must be >= 0 and realtime_idle_timeout_s > 0")
        if self.realtime_max_audio_seconds <= 0:
            raise ValueError("realtime_max_audio_seconds must be > 0")
