"""The request body limit: 413 ``body_too_large`` when the declared ``Content-Length``
is over the limit — before reading any of the body — and, for chunked uploads without
a length, as soon as the bytes received so far exceed it, without reading the rest."""

from __future__ import annotations

import json

from facefuse.errors import BodyTooLargeError
from facefuse.serving.http.asgi import ASGIApp, Message, Receive, Scope, Send, content_length
from facefuse.serving.state import Services

__all__ = ["BodyLimitMiddleware", "body_limit"]


def body_limit(app: ASGIApp, services: Services) -> ASGIApp:
    """``app`` behind the limit of ``max_body_bytes``."""
    return BodyLimitMiddleware(app, services.settings.max_body_bytes)


class BodyLimitMiddleware:
    """Reject request bodies over ``max_bytes`` with 413 ``body_too_large``, early.

    * A ``Content-Length`` over the limit is answered at once; the app is not called
      and no body byte is read (a client waiting on ``Expect: 100-continue`` never
      gets the go-ahead).
    * Otherwise the body is counted as the app pulls it; the chunk that crosses the
      limit makes ``receive`` raise :class:`~facefuse.errors.BodyTooLargeError`, no
      further chunk is read, and whatever the app then answers (its own error
      handler's JSON, a framework's 400 for "could not parse the body", or nothing)
      is replaced by the 413, as long as the response has not started.

    Install it outermost (``app.add_middleware(BodyLimitMiddleware, max_bytes=...)``
    in FastAPI, or wrap the app object).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reject(send, declared)
            return

        received = 0
        exceeded = False
        started = False
        rejected = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            if exceeded:
                raise BodyTooLargeError(self._message(None))
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    exceeded = True
                    raise BodyTooLargeError(self._message(None))
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started, rejected
            if exceeded and not started:
                # Replace whatever the app answers with our 413 (once).
                if not rejected:
                    rejected = True
                    await self._reject(send, None)
                return
            if rejected:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except BodyTooLargeError:
            if not exceeded:
                raise
        if exceeded and not started and not rejected:
            rejected = True
            await self._reject(send, None)

    def _message(self, declared: int | None) -> str:
        got = f"declared {declared} bytes" if declared is not None else "body too large"
        return f"request body over the {self.max_bytes}-byte limit ({got})"

    async def _reject(self, send: Send, declared: int | None) -> None:
        body = json.dumps(BodyTooLargeError(self._message(declared)).to_dict()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": BodyTooLargeError.http_status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})
