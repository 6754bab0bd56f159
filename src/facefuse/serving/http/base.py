"""What every middleware here shares: HTTP requests only, the app it wraps and the
app's services, and the response's outcome measured around the app."""

from __future__ import annotations

import time
from collections.abc import Callable

from facefuse.serving.http.asgi import ASGIApp, Receive, ResponseWatch, Scope, Send
from facefuse.serving.state import Services

__all__ = ["HttpMiddleware"]


class HttpMiddleware:
    """A middleware of HTTP requests: others (lifespan, websocket) pass through it
    untouched. A subclass implements :meth:`http`."""

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.svc = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError

    async def timed(self, scope: Scope, receive: Receive, send: Send,
                    record: Callable[[Scope, int, float], None]) -> None:
        """Run the app; then, whatever happened, ``record(scope, status, seconds)`` with
        the status the logs and metrics record and the seconds it took."""
        t0 = time.monotonic()
        watch = ResponseWatch(send)
        try:
            await self.app(scope, receive, watch.send)
        finally:
            record(scope, watch.recorded_status(scope), time.monotonic() - t0)
