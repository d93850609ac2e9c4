"""Where media inputs come from, and the policy that guards it.

Clients reference media as data URLs (always accepted), local paths (`file://...` or absolute paths, only
under `--allowed-local-media-path`) or remote URLs (refused unless `--allow-remote-media`): a server must
not read arbitrary files or make requests to arbitrary hosts because a request asked it to.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from pathlib import Path

import httpx

from omnistage.errors import InvalidRequestError
from omnistage.serving.settings import ServerSettings


def decode_base64(text: str, *, param: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequestError(f"{param}: not valid base64 ({exc})", param=param) from exc


def parse_data_url(url: str, *, param: str) -> tuple[bytes, str | None]:
    """'data:image/png;base64,....' -> (bytes, 'image/png')."""
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise InvalidRequestError(f"{param}: a data URL needs a ',' before its payload", param=param)
    mime, *flags = header.split(";")
    if "base64" in flags:
        return decode_base64(payload, param=param), mime or None
    return urllib.parse.unquote_to_bytes(payload), mime or None


class MediaSources:
    """Reads the bytes behind a media reference, within the server's settings and a size cap."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings

    async def read(self, url: str, *, param: str) -> tuple[bytes, str | None]:
        """(bytes, MIME type if known) behind `url`; InvalidRequestError naming `param` if refused."""
        url = url.strip()
        if url.startswith("data:"):
            data, mime = parse_data_url(url, param=param)
        elif url.startswith("file://") or url.startswith("/"):
            data, mime = self._read_local(url, param=param), None
        elif url.startswith(("http://", "https://")):
            data, mime = await self._read_remote(url, param=param)
        else:
            scheme = url.split(":", 1)[0] if ":" in url else url[:16]
            raise InvalidRequestError(
                f"{param}: unsupported media reference {scheme!r}; use a data URL, a local path or http(s)",
                param=param,
            )
        self._check_size(len(data), param)
        return data, mime

    def _check_size(self, size: int, param: str) -> None:
        limit = self.settings.max_request_bytes
        if size > limit:
            raise InvalidRequestError(
                f"{param}: media of {size} bytes exceeds the limit of {limit}", param=param
            )

    def _read_local(self, url: str, *, param: str) -> bytes:
        allowed = self.settings.allowed_local_media_path
        if allowed is None:
            raise InvalidRequestError(
                f"{param}: local media paths are disabled; start the server with --allowed-local-media-path",
                param=param,
            )
        raw = urllib.parse.unquote(urllib.parse.urlparse(url).path) if url.startswith("file://") else url
        path = Path(raw).resolve()  # resolves symlinks and '..', so the check below cannot be escaped
        if not path.is_relative_to(allowed):
            raise InvalidRequestError(
                f"{param}: {raw} is outside the allowed local media path {allowed}", param=param
            )
        if not path.is_file():
            raise InvalidRequestError(f"{param}: no file at {raw}", param=param)
        self._check_size(path.stat().st_size, param)
        return path.read_bytes()

    async def _read_remote(self, url: str, *, param: str) -> tuple[bytes, str | None]:
        if not self.settings.allow_remote_media:
            raise InvalidRequestError(
                f"{param}: remote media URLs are refused; send a data URL, or start the server with "
                "--allow-remote-media",
                param=param,
            )
        try:
            async with (
                httpx.AsyncClient(
                    timeout=self.settings.remote_media_timeout_s, follow_redirects=True
                ) as client,
                client.stream("GET", url) as response,
            ):
                response.raise_for_status()
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    self._check_size(size, param)
                    chunks.append(chunk)
                mime = response.headers.get("content-type", "").split(";")[0] or None
                return b"".join(chunks), mime
        except httpx.HTTPError as exc:
            raise InvalidRequestError(f"{param}: could not fetch {url} ({exc})", param=param) from exc
