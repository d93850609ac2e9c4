"""Media references: data URLs always, local paths only under the allowed dir, remote only when enabled."""

import base64
import os

import pytest

from omnistage.errors import InvalidRequestError
from omnistage.serving.media_sources import MediaSources, parse_data_url
from omnistage.serving.settings import ServerSettings

pytestmark = pytest.mark.unit


async def read(settings: ServerSettings, url: str) -> bytes:
    data, _ = await MediaSources(settings).read(url, param="image_url.url")
    return data


async def test_data_urls_base64_and_percent_encoded():
    payload = b"\x89PNG\x00\xff"
    url = "data:image/png;base64," + base64.b64encode(payload).decode()
    assert parse_data_url(url, param="x") == (payload, "image/png")
    assert await read(ServerSettings(), url) == payload
    assert await read(ServerSettings(), "data:text/plain,a%20b") == b"a b"


async def test_bad_data_urls_name_the_field():
    with pytest.raises(InvalidRequestError) as info:
        await read(ServerSettings(), "data:image/png;base64,@@@")
    assert info.value.param == "image_url.url" and "base64" in info.value.message
    with pytest.raises(InvalidRequestError, match="needs a ','"):
        await read(ServerSettings(), "data:image/png;base64")


async def test_local_paths_are_refused_unless_allowed(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"abc")
    with pytest.raises(InvalidRequestError, match="--allowed-local-media-path"):
        await read(ServerSettings(), f"file://{tmp_path}/a.bin")
    allowed = ServerSettings(allowed_local_media_path=tmp_path)
    assert await read(allowed, f"file://{tmp_path}/a.bin") == b"abc"
    assert await read(allowed, f"{tmp_path}/a.bin") == b"abc"
    with pytest.raises(InvalidRequestError, match="no file"):
        await read(allowed, f"{tmp_path}/missing.bin")


async def test_local_paths_cannot_escape_the_allowed_dir(tmp_path):
    inside = tmp_path / "media"
    inside.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"secret")
    os.symlink(secret, inside / "link.txt")
    settings = ServerSettings(allowed_local_media_path=inside)
    for url in (f"{inside}/../secret.txt", f"file://{inside}/link.txt", str(secret)):
        with pytest.raises(InvalidRequestError, match="outside the allowed local media path"):
            await read(settings, url)


async def test_remote_urls_are_refused_unless_enabled():
    with pytest.raises(InvalidRequestError, match="--allow-remote-media") as info:
        await read(ServerSettings(), "https://example.com/cat.png")
    assert info.value.param == "image_url.url"


async def test_unknown_schemes_and_oversized_media_are_refused(tmp_path):
    with pytest.raises(InvalidRequestError, match="unsupported media reference 'ftp'"):
        await read(ServerSettings(), "ftp://host/x")
    url = "data:application/octet-stream;base64," + base64.b64encode(b"x" * 100).decode()
    with pytest.raises(InvalidRequestError, match="exceeds the limit of 10"):
        await read(ServerSettings(max_request_bytes=10), url)
