"""The web playground: a static page at ``/`` over the public API.

The page (``serving/static/``: HTML, CSS and plain JavaScript, packaged in the
wheel; no build step, nothing fetched from a CDN) calls ``/v1/capabilities``,
``/v1/faces``, ``/v1/fuse`` and the template routes with the API key the user
types in; the key stays in the page's memory and is never stored by the server.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["STATIC_DIR", "install_playground"]

#: The page's files.
STATIC_DIR = Path(__file__).with_name("static")

router = APIRouter(tags=["playground"])


@router.get("/", summary="The web playground (HTML)", response_class=FileResponse)
async def playground() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html",
                        headers={"Cache-Control": "no-cache"})


def install_playground(app: FastAPI) -> None:
    """Serve the page at ``/`` and its files under ``/static``."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
