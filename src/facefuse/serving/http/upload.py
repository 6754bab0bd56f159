"""The upload guard: a request's whole body is read before anything else runs.

* The gap between two reads is at most ``body_timeout_s`` and the whole body must arrive
  within ``body_timeout_s + length / min_upload_rate`` s, else 408 ``request_timeout``.
* Its declared length is reserved from the memory budget first (a bounded wait, else
  503; 413 when it can never fit). A slow upload therefore holds no slot: the in-flight
  bound counts a request only once this is done.
* A client that disconnects (during the upload or while its request is computed)
  cancels its work at once, freeing its slot and budget (:class:`ClientGoneError`,
  recorded by :mod:`~facefuse.serving.http.last_resort`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from facefuse.errors import BodyTooLargeError, FacefuseError, RequestTimeoutError
from facefuse.serving.http.asgi import (
    Message,
    Receive,
    ResponseWatch,
    Scope,
    Send,
    content_length,
    header,
    log_fields,
)
from facefuse.serving.http.base import HttpMiddleware
from facefuse.serving.http.error_handlers import error_response
from facefuse.serving.state import Services

__all__ = ["BodyReader", "ClientGoneError", "UploadGuardMiddleware"]


class ClientGoneError(Exception):
    """The client disconnected (during the upload or while its request was served)."""


class UploadGuardMiddleware(HttpMiddleware):
    """Reads the body (:class:`BodyReader`), then runs the app on its replay, cancelled
    when the client disconnects; ``scope["state"]["t0"]`` (where the request deadline
    runs from) is set when the body has arrived."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = ResponseWatch(send)
        reader = BodyReader(self.svc, scope, receive)
        try:
            try:
                replay = await reader.read()
            except FacefuseError as exc:
                log_fields(scope)["error"] = exc.code
                response = error_response(self.svc, exc.http_status, exc.code, exc.message)
                response.headers["connection"] = "close"  # the rest of the body is unread
                await response(scope, receive, watch.send)
                return
            scope.setdefault("state", {})["t0"] = time.monotonic()  # work starts
            await _until_disconnect(self.app(scope, replay, watch.send), reader,
                                    lambda: watch.completed)
        finally:
            reader.release()


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
        self.declared = content_length(scope)
        self.chunked = header(scope, b"transfer-encoding") is not None
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
