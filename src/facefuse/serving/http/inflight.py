"""The in-flight bound: beyond ``max_inflight`` ``/v1/*`` requests at once (counted
once their body is read, so a slow upload holds no slot) a request gets 503
``overloaded`` with ``Retry-After``."""

from __future__ import annotations

from facefuse.errors import OverloadedError
from facefuse.serving.http.asgi import ASGIApp, Receive, Scope, Send, log_fields
from facefuse.serving.http.base import HttpMiddleware
from facefuse.serving.http.error_handlers import error_response
from facefuse.serving.state import Services

__all__ = ["InFlightMiddleware", "limited", "refuse_busy"]


def limited(scope: Scope) -> bool:
    """A request the in-flight bound and the drain apply to: the ``/v1/*`` API."""
    return scope["type"] == "http" and str(scope["path"]).startswith("/v1/")


async def refuse_busy(svc: Services, scope: Scope, receive: Receive, send: Send,
                      why: str) -> None:
    """Answer 503 ``overloaded`` (with ``Retry-After``), saying ``why``."""
    log_fields(scope)["error"] = OverloadedError.code
    await error_response(svc, 503, OverloadedError.code,
                         f"server busy: {why}; retry later")(scope, receive, send)


class InFlightMiddleware(HttpMiddleware):
    def __init__(self, app: ASGIApp, services: Services) -> None:
        super().__init__(app, services)
        self.inflight = 0
        self.gauge = services.metrics.in_flight

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not limited(scope):
            await self.app(scope, receive, send)
            return
        limit = self.svc.settings.max_inflight
        if self.inflight >= limit:
            await refuse_busy(self.svc, scope, receive, send,
                              f"{self.inflight} requests in flight (limit {limit})")
            return
        self._count(+1)
        try:
            await self.app(scope, receive, send)
        finally:
            self._count(-1)
            self.svc.answered += 1

    def _count(self, step: int) -> None:
        self.inflight += step
        self.svc.inflight = self.inflight
        self.gauge.set(self.inflight)
