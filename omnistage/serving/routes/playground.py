"""GET / and /playground: the browser playground, static files shipped inside the package.

The page is plain HTML, CSS and JavaScript (no build step, nothing fetched from elsewhere): it reads
`/v1/models` and offers each model the panels its capabilities allow. Its files need no API key (they hold
no data; the page asks for the key and sends it with every API call), so they are listed in `OPEN_PATHS`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

STATIC_DIR = Path(__file__).resolve().parent.parent / "playground"
MEDIA_TYPES = {
    "app.js": "text/javascript",
    "style.css": "text/css",
}
OPEN_PATHS = frozenset({"/", "/playground", *(f"/playground/{name}" for name in MEDIA_TYPES)})
# The page may talk only to the server it came from and use only its own files.
CSP = "default-src 'self'; img-src 'self' data: blob:; media-src 'self' data: blob:; connect-src 'self' blob:"
HEADERS = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache"}

router = APIRouter(include_in_schema=False)


@router.get("/")
@router.get("/playground")
async def page() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers=HEADERS)


def _asset(name: str):
    async def serve() -> FileResponse:
        return FileResponse(STATIC_DIR / name, media_type=MEDIA_TYPES[name], headers=HEADERS)

    return serve


for _name in MEDIA_TYPES:
    router.add_api_route(f"/playground/{_name}", _asset(_name), methods=["GET"])
