"""Every request counted and timed in Prometheus, by route template, method and status
(:meth:`~facefuse.serving.metrics.Metrics.observe_request`)."""

from __future__ import annotations

from facefuse.serving.http.asgi import Receive, Scope, Send
from facefuse.serving.http.base import HttpMiddleware
from facefuse.serving.http.route_template import route_template

__all__ = ["RequestMetricsMiddleware"]


class RequestMetricsMiddleware(HttpMiddleware):
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.timed(scope, receive, send, self._observe)

    def _observe(self, scope: Scope, status: int, seconds: float) -> None:
        self.svc.metrics.observe_request(route_template(scope), scope.get("method", "GET"),
                                         status, seconds)
