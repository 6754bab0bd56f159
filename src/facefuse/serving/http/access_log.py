"""One JSON access-log line a request (``facefuse.access``): method, route template,
status, duration, the key's label and the fields the request marked (cache outcome,
faces, error code...); health, readiness and metrics scrapes that succeed at debug
level."""

from __future__ import annotations

import logging
from typing import Any

from facefuse.serving.http.asgi import Receive, Scope, Send
from facefuse.serving.http.base import HttpMiddleware
from facefuse.serving.http.route_template import route_template

__all__ = ["AccessLogMiddleware"]

access_log = logging.getLogger("facefuse.access")

_QUIET = ("/healthz", "/readyz", "/metrics")


class AccessLogMiddleware(HttpMiddleware):
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.timed(scope, receive, send, _log)


def _log(scope: Scope, status: int, seconds: float) -> None:
    template = route_template(scope)
    method = scope.get("method", "GET")
    state = scope.get("state", {})
    fields: dict[str, Any] = {"method": method, "route": template, "status": status,
                              "duration_ms": round(seconds * 1000.0, 2)}
    if state.get("key_label"):
        fields["key"] = state["key_label"]
    fields.update(state.get("log", {}))
    if template in _QUIET and status < 400:
        access_log.debug("%s %s %d", method, template, status, extra={"fields": fields})
    else:
        access_log.info("%s %s %d", method, template, status, extra={"fields": fields})
