"""CORS, only when ``FACEFUSE_CORS_ORIGINS`` names origins (Starlette's middleware)."""

from __future__ import annotations

from fastapi.middleware.cors import CORSMiddleware

from facefuse.serving.http.asgi import ASGIApp
from facefuse.serving.state import Services

__all__ = ["cors"]


def cors(app: ASGIApp, services: Services) -> ASGIApp:
    """``app`` behind CORS for the configured origins; ``app`` itself when none is."""
    origins = services.settings.cors_origins
    if not origins:
        return app
    return CORSMiddleware(
        app, allow_origins=list(origins),
        allow_methods=["GET", "POST", "PATCH", "DELETE"],
        allow_headers=["Authorization", "Content-Type", "X-Request-ID", "X-Facefuse-Timeout"],
        expose_headers=["X-Request-ID", "X-Facefuse-Cache", "X-Facefuse-Identity-Similarity",
                        "X-Facefuse-Skipped-Faces", "Server-Timing", "Retry-After",
                        "Location", "Link"],
        max_age=600,
    )
