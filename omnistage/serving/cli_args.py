"""The HTTP flags of `omnistage serve`, kept beside the settings they fill so the two never drift."""

from __future__ import annotations

import argparse
from pathlib import Path

from omnistage.config.capabilities import TOOL_PARSERS
from omnistage.serving.loras import parse_lora_modules
from omnistage.serving.settings import ServerSettings


def default_storage_dir() -> Path:
    from omnistage.cache import cache_root

    return cache_root() / "storage"


def default_voices_dir() -> Path:
    from omnistage.cache import cache_root

    return cache_root() / "voices"


def image_size_pixels(text: str) -> int:
    """'1024x1024' or '1048576' -> pixels."""
    width, sep, height = text.lower().partition("x")
    try:
        pixels = int(width) * int(height) if sep else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not WIDTHxHEIGHT or a pixel count") from None
    if pixels < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1 pixel")
    return pixels


def add_server_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("HTTP server")
    group.add_argument("--host", default="127.0.0.1")
    group.add_argument("--port", type=int, default=8000)
    group.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (except /health)")
    group.add_argument(
        "--served-model-name", nargs="+", default=None, help="one name per model (default: its own)"
    )
    group.add_argument("--max-request-bytes", type=int, default=ServerSettings.max_request_bytes)
    group.add_argument(
        "--request-body-timeout",
        type=float,
        default=ServerSettings.request_body_timeout_s,
        help="seconds a request body may take to arrive (408 after)",
    )
    group.add_argument(
        "--send-timeout",
        type=float,
        default=ServerSettings.send_timeout_s,
        help="seconds a response part or WebSocket message may wait for the client to read it (the "
        "connection is dropped and its work aborted after)",
    )
    group.add_argument(
        "--max-ws-events-per-second",
        type=float,
        default=ServerSettings.max_ws_events_per_s,
        help="events a second one WebSocket client may send (bursts of twice that; closed over it)",
    )
    group.add_argument(
        "--max-generated-image-size",
        "--max-image-pixels",
        dest="max_image_pixels",
        type=image_size_pixels,
        default=ServerSettings.max_image_pixels,
        metavar="WxH|PIXELS",
        help="global cap on a generated (or uploaded) image's pixels, over every model's own limit",
    )
    group.add_argument(
        "--storage-dir",
        type=Path,
        default=None,
        help="where video jobs and files live (default: the cache dir)",
    )
    group.add_argument(
        "--allowed-local-media-path", type=Path, default=None, help="allow media paths under DIR"
    )
    group.add_argument(
        "--allow-remote-media", action="store_true", help="let the server fetch http(s) media URLs"
    )
    group.add_argument(
        "--shutdown-grace", type=float, default=ServerSettings.shutdown_grace_s, metavar="SECONDS"
    )
    group.add_argument(
        "--voices-dir",
        type=Path,
        default=None,
        help="where uploaded voices live (default: voices/ in --storage-dir if given, else in the cache dir)",
    )
    group.add_argument(
        "--max-voice-upload-bytes", type=int, default=ServerSettings.max_voice_upload_bytes, metavar="BYTES"
    )
    group.add_argument("--max-uploaded-voices", type=int, default=ServerSettings.max_uploaded_voices)
    group.add_argument("--max-realtime-sessions", type=int, default=ServerSettings.max_realtime_sessions)
    group.add_argument(
        "--realtime-idle-timeout",
        type=float,
        default=ServerSettings.realtime_idle_timeout_s,
        metavar="SECONDS",
    )
    group.add_argument(
        "--realtime-max-audio-seconds", type=float, default=ServerSettings.realtime_max_audio_seconds
    )
    group.add_argument(
        "--speech-stream-idle-timeout",
        type=float,
        default=ServerSettings.speech_stream_idle_timeout_s,
        metavar="SECONDS",
        help="close a speech WebSocket whose client sent nothing for this long while nothing was spoken",
    )
    group.add_argument(
        "--max-queued-requests", type=int, default=1024, help="admission limit per model; beyond it: 429"
    )
    group.add_argument(
        "--lora-modules",
        nargs="+",
        default=None,
        metavar="NAME=PATH",
        help="LoRA adapters (PEFT / diffusers safetensors) diffusion requests may name in `lora`",
    )
    group.add_argument(
        "--tool-call-parser",
        choices=TOOL_PARSERS,
        default=None,
        help="how a reply's tool calls are read (default: the format each model's pipeline declares)",
    )
    group.add_argument(
        "--no-playground",
        dest="playground",
        action="store_false",
        help="do not serve the browser playground at / and /playground",
    )


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        api_key=args.api_key,
        max_realtime_sessions=args.max_realtime_sessions,
        realtime_idle_timeout_s=args.realtime_idle_timeout,
        realtime_max_audio_seconds=args.realtime_max_audio_seconds,
        max_request_bytes=args.max_request_bytes,
        request_body_timeout_s=args.request_body_timeout,
        send_timeout_s=args.send_timeout,
        max_ws_events_per_s=args.max_ws_events_per_second,
        max_image_pixels=args.max_image_pixels,
        storage_dir=args.storage_dir or default_storage_dir(),
        allowed_local_media_path=args.allowed_local_media_path,
        allow_remote_media=args.allow_remote_media,
        shutdown_grace_s=args.shutdown_grace,
        voices_dir=args.voices_dir
        or (args.storage_dir / "voices" if args.storage_dir else default_voices_dir()),
        max_voice_upload_bytes=args.max_voice_upload_bytes,
        max_uploaded_voices=args.max_uploaded_voices,
        speech_stream_idle_timeout_s=args.speech_stream_idle_timeout,
        playground=args.playground,
        tool_call_parser=args.tool_call_parser,
        lora_modules=lora_modules(args.lora_modules),
    )


def lora_modules(values: list[str] | None) -> dict[str, Path]:
    try:
        return parse_lora_modules(values)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
