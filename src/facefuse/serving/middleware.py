"""The outermost middleware: request id, in-flight bound, metrics, access log."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import Any

from prometheus_client import Gauge
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from facefuse.errors import OverloadedError
from facefuse.serving.http_errors import error_response
from facefuse.serving.logs import request_id_var
from facefuse.serving.state import Services

__all__ = ["RequestContextMiddleware"]

log = logging.getLogger("facefuse.serving")
access_log = logging.getLogger("facefuse.access")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


class RequestContextMiddleware:
    """Request id, in-flight bound, metrics and one JSON access-log line per request.

    * ``X-Request-ID``: taken from the request when it looks like an id, else a new
      uuid4; echoed on the response and set in the log context.
    * ``/v1/*`` requests beyond ``max_inflight`` at once, or arriving while draining,
      get 503 ``overloaded`` with ``Retry-After``.
    * An exception nothing else handled becomes 500 ``internal_error`` (logged with its
      traceback server-side, never sent to the client).
    """

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.svc = services
        self.inflight = 0
        self.gauge = Gauge("facefuse_http_requests_in_flight",
                           "Requests being processed now.", registry=services.metrics.registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.monotonic()
        rid = _request_id(scope)
        token = request_id_var.set(rid)
        state = scope.setdefault("state", {})
        state["t0"], state["request_id"] = t0, rid
        status = 500
        started = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status = int(message["status"])
                started = True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        limited = scope["path"].startswith("/v1/")
        counted = False
        try:
            if limited and (self.svc.draining or self.inflight >= self.svc.settings.max_inflight):
                why = "shutting down" if self.svc.draining else (
                    f"{self.inflight} requests in flight (limit {self.svc.settings.max_inflight})")
                state.setdefault("log", {})["error"] = OverloadedError.code
                await error_response(self.svc, 503, OverloadedError.code,
                                     f"server busy: {why}; retry later")(scope, receive,
                                                                         send_wrapper)
                return
            if limited:
                self.inflight += 1
                counted = True
                self.gauge.set(self.inflight)
            await self.app(scope, receive, send_wrapper)
        except Exception:
            log.exception("unhandled error")
            state.setdefault("log", {})["error"] = "internal_error"
            if not started:
                await error_response(None, 500, "internal_error", "internal server error")(
                    scope, receive, send_wrapper)
        finally:
            if counted:
                self.inflight -= 1
                self.gauge.set(self.inflight)
            self._finish(scope, status, time.monotonic() - t0)
            request_id_var.reset(token)

    def _finish(self, scope: Scope, status: int, seconds: float) -> None:
        route = scope.get("route")
        template = getattr(route, "path", None) or "unmatched"
        method = scope.get("method", "GET")
        self.svc.metrics.observe_request(template, method, status, seconds)
        state = scope.get("state", {})
        fields: dict[str, Any] = {"method": method, "route": template, "status": status,
                                  "duration_ms": round(seconds * 1000.0, 2)}
        if state.get("key_label"):
            fields["key"] = state["key_label"]
        fields.update(state.get("log", {}))
        if template in ("/healthz", "/readyz", "/metrics") and status < 400:
            access_log.debug("%s %s %d", method, template, status, extra={"fields": fields})
        else:
            access_log.info("%s %s %d", method, template, status, extra={"fields": fields})


def _request_id(scope: Scope) -> str:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            try:
                text = value.decode("ascii")
            except UnicodeDecodeError:
                break
            if _REQUEST_ID.fullmatch(text):
                return str(text)
            break
    return uuid.uuid4().hex
