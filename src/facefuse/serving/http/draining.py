"""While the server drains (shutting down), a ``/v1/*`` request gets 503 ``overloaded``
with ``Retry-After`` before any of its body is read."""

from __future__ import annotations

from facefuse.serving.http.asgi import Receive, Scope, Send
from facefuse.serving.http.base import HttpMiddleware
from facefuse.serving.http.inflight import limited, refuse_busy

__all__ = ["DrainingMiddleware"]


class DrainingMiddleware(HttpMiddleware):
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if limited(scope) and self.svc.draining:
            await refuse_busy(self.svc, scope, receive, send, "shutting down")
            return
        await self.app(scope, receive, send)
