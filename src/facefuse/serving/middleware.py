"""The outermost middleware: request id, upload guard, in-flight bound, metrics, access log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from facefuse.errors import (
    BodyTooLargeError,
    FacefuseError,
    OverloadedError,
    RequestTimeoutError,
)
from facefuse.serving.http_errors import error_response
from facefuse.serving.logs import request_id_var
from facefuse.serving.state import Services

__all__ = ["CLIENT_CLOSED", "BodyReader", "RequestContextMiddleware"]

log = logging.getLogger("facefuse.serving")
access_log = logging.getLogger("facefuse.access")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


#: Status recorded (logs, metrics) when the client went away before the answer: nginx's.
CLIENT_CLOSED = 499


class ClientGoneError(Exception):
    """The client disconnected (during the upload or while its request was served)."""


class RequestContextMiddleware:
    """Request id, upload guard, in-flight bound, metrics and one JSON access-log line.

    * ``X-Request-ID``: taken from the request when it looks like an id, else a new
      uuid4; echoed on the response and set in the log context.
    * The body is read here, before anything else runs (:class:`BodyReader`): the
      gap between two reads is at most ``body_timeout_s`` and the whole body must
      arrive within ``body_timeout_s + length / min_upload_rate`` s, else 408
      ``request_timeout``. Its declared length is reserved from the memory budget
      first (a bounded wait, else 503). A slow upload therefore holds no slot.
    * Only then is a ``/v1/*`` request counted in flight: beyond ``max_inflight`` at
      once, or while draining, it gets 503 ``overloaded`` with ``Retry-After``.
    * A client that disconnects — during the upload or while its request is being
      computed — cancels its work at once (its slot and budget are freed) and is
      recorded as status 499 ``client_closed`` in the log and metrics, not as a 500.
    * An exception nothing else handled becomes 500 ``internal_error`` (logged with its
      traceback server-side, never sent to the client).
    """

    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.svc = services
        self.inflight = 0
        #: The app's path templates, for requests refused before routing (built once).
        self._paths: list[tuple[re.Pattern[str], str]] | None = None
        self.gauge = services.metrics.in_flight

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
        started = completed = False

        async def send_wrapper(message: Message) -> None:
            nonlocal status, started, completed
            if message["type"] == "http.response.start":
                status = int(message["status"])
                started = True
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode("ascii")))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                completed = True
            await send(message)

        limited = scope["path"].startswith("/v1/")
        counted = False
        reader = BodyReader(self.svc, scope, receive)
        try:
            if limited and self.svc.draining:
                await self._refuse(scope, receive, send_wrapper, "shutting down")
                return
            try:
                replay = await reader.read()
            except FacefuseError as exc:
                state.setdefault("log", {})["error"] = exc.code
                response = error_response(self.svc, exc.http_status, exc.code, exc.message)
                response.headers["connection"] = "close"  # the rest of the body is unread
                await response(scope, receive, send_wrapper)
                return
            state["t0"] = time.monotonic()  # the request deadline runs from here: work starts
            if limited and self.inflight >= self.svc.settings.max_inflight:
                await self._refuse(scope, replay, send_wrapper, (
                    f"{self.inflight} requests in flight "
                    f"(limit {self.svc.settings.max_inflight})"))
                return
            if limited:
                self.inflight += 1
                self.svc.inflight = self.inflight
                counted = True
                self.gauge.set(self.inflight)
            await _until_disconnect(self.app(scope, replay, send_wrapper), reader,
                                    lambda: completed)
        except (ClientGoneError, ClientDisconnect):
            status = CLIENT_CLOSED
            state.setdefault("log", {})["error"] = "client_closed"
        except Exception:
            log.exception("unhandled error")
            state.setdefault("log", {})["error"] = "internal_error"
            if not started:
                await error_response(None, 500, "internal_error", "internal server error")(
                    scope, receive, send_wrapper)
        finally:
            reader.release()
            if counted:
                self.inflight -= 1
                self.svc.inflight = self.inflight
                self.svc.answered += 1
                self.gauge.set(self.inflight)
            self._finish(scope, status, time.monotonic() - t0)
            request_id_var.reset(token)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, why: str) -> None:
        scope.setdefault("state", {}).setdefault("log", {})["error"] = OverloadedError.code
        await error_response(self.svc, 503, OverloadedError.code,
                             f"server busy: {why}; retry later")(scope, receive, send)

    def _finish(self, scope: Scope, status: int, seconds: float) -> None:
        if self._paths is None and scope.get("route") is None and "app" in scope:
            self._paths = _documented_paths(scope["app"])
        template = _route_template(scope, self._paths or [])
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


def _route_template(scope: Scope, paths: list[tuple[re.Pattern[str], str]]) -> str:
    """The route template of a request (``/v1/templates/{template}``), also for one
    refused here before routing ran (in-flight bound, draining, body errors), matched
    against ``paths`` (the app's documented path templates); ``unmatched`` when none
    has that path."""
    routed = getattr(scope.get("route"), "path", None)
    if routed:
        return str(routed)
    path = scope.get("path", "")
    return next((template for regex, template in paths if regex.match(path)), "unmatched")


def _documented_paths(app: Any) -> list[tuple[re.Pattern[str], str]]:
    """(regex, template) of every path in the app's OpenAPI document."""
    try:
        templates = list(app.openapi().get("paths", {}))
    except Exception:  # no app in scope (tests of the middleware alone)
        return []
    return [(compile_path(t)[0], t) for t in templates]


class BodyReader:
    """Reads a request's whole body under the upload timeouts, then replays it.

    A ``Content-Length`` over ``max_body_bytes`` is not read here (the body limit
    answers 413 without reading); a chunked body is read until it passes the limit
    and what was read is handed on, so the limit answers 413 the same way.
    """

    def __init__(self, svc: Services, scope: Scope, receive: Receive) -> None:
        self.settings = svc.settings
        self.budget = svc.budget
        self.receive = receive
        self.declared = _content_length(scope)
        self.chunked = _header(scope, b"transfer-encoding") is not None
        self.reserved = 0
        #: True once the whole body was read here (it is replayed to the app).
        self.complete = False
        self._disconnect: asyncio.Task[Message] | None = None

    async def read(self) -> Receive:
        """The whole body (as a replaying ``receive``).

        Raises:
            RequestTimeoutError: the client sent it too slowly (408).
            OverloadedError: no memory budget for it in time (503).
            BodyTooLargeError: it can never fit the memory budget (413).
            ClientGoneError: the client disconnected.
        """
        s = self.settings
        declared = self.declared
        if declared is not None and declared > s.max_body_bytes:
            return self.receive  # the body limit refuses it without reading
        # No length and no chunked transfer: no body (RFC 9112 6.3).
        want = declared if declared is not None else (s.max_body_bytes if self.chunked else 0)
        if self.budget is not None and want > 0:
            if not self.budget.fits(want):
                raise BodyTooLargeError(
                    f"a {want}-byte body does not fit this server's memory budget")
            await self.budget.acquire(want, "the request body")
            self.reserved = want
        chunks: list[bytes] = []
        received = 0
        start = time.monotonic()
        deadline = start + s.body_timeout_s + want / s.min_upload_rate
        more = True
        while more:
            now = time.monotonic()
            wait = min(s.body_timeout_s, deadline - now)
            try:
                if wait <= 0:
                    raise TimeoutError
                async with asyncio.timeout(wait):
                    message = await self.receive()
            except TimeoutError:
                raise RequestTimeoutError(
                    f"the request body arrived too slowly ({received} bytes in "
                    f"{now - start:.1f} s; the minimum is {s.min_upload_rate} bytes/s "
                    f"after {s.body_timeout_s:g} s)") from None
            if message["type"] == "http.disconnect":
                raise ClientGoneError
            chunk = message.get("body", b"")
            if chunk:
                chunks.append(chunk)
                received += len(chunk)
            more = bool(message.get("more_body", False))
            if received > s.max_body_bytes:
                break  # the body limit answers 413
        body = b"".join(chunks)
        if declared is None and self.budget is not None and self.reserved > len(body):
            self.budget.release(self.reserved - len(body))
            self.reserved = len(body)
        self.complete = True
        return self._replay(body)

    def _replay(self, body: bytes) -> Receive:
        left: bytes | None = body

        async def replay() -> Message:
            # Handed over once, and not kept here: the app keeps what it needs of it.
            nonlocal left
            if left is not None:
                message: Message = {"type": "http.request", "body": left, "more_body": False}
                left = None
                return message
            return await self.disconnected()

        return replay

    def disconnected(self) -> asyncio.Task[Message]:
        """A task that ends when the server reports ``http.disconnect`` (the client
        left, or the response is complete)."""
        if self._disconnect is None:
            self._disconnect = asyncio.ensure_future(self.receive())
        return self._disconnect

    def release(self) -> None:
        """Return the body's memory budget; stop watching for a disconnect."""
        if self.budget is not None and self.reserved:
            self.budget.release(self.reserved)
            self.reserved = 0
        if self._disconnect is not None and not self._disconnect.done():
            self._disconnect.cancel()


async def _until_disconnect(
    work: Awaitable[None], reader: BodyReader, completed: Callable[[], bool]
) -> None:
    """Run the app; if the client disconnects before the response is complete,
    cancel it (freeing its slot and budget) and raise :class:`ClientGoneError`."""
    if not reader.complete:  # the body was not read here: nothing to watch with
        await work
        return
    task = asyncio.ensure_future(work)
    gone = reader.disconnected()
    try:
        done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    if task in done or completed():
        await task
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGoneError


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    if value is None or not value.isdigit():
        return None
    return int(value)


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
