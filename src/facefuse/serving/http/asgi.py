"""The ASGI types every middleware here speaks, and the request headers they read.

Pure ASGI (no framework; the same shapes as Starlette's): a middleware is
``__init__(app, ...)`` and ``async __call__(scope, receive, send)``. What the middleware
tell each other travels in ``scope["state"]``: ``t0`` and ``request_id``, ``log`` (the
access-log fields), ``client_closed`` (the client went away: recorded as
:data:`CLIENT_CLOSED`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["CLIENT_CLOSED", "ASGIApp", "Message", "Receive", "ResponseWatch", "Scope", "Send",
           "content_length", "header", "log_fields"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of the request header ``name`` (lower case), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def content_length(scope: Scope) -> int | None:
    """The declared ``Content-Length``, or None when absent or not a decimal number."""
    value = header(scope, b"content-length")
    if value is None or not value.isdigit():
        return None
    return int(value)


def log_fields(scope: Scope) -> dict[str, Any]:
    """The fields the request's access-log line will show (``scope["state"]["log"]``)."""
    fields: dict[str, Any] = scope.setdefault("state", {}).setdefault("log", {})
    return fields


#: Status recorded (logs, metrics) when the client went away before the answer: nginx's.
CLIENT_CLOSED = 499


class ResponseWatch:
    """Watches the response a middleware passes on: give the app :meth:`send`."""

    def __init__(self, send: Send) -> None:
        self._send = send
        #: The response's status; 500 until one starts (an app that never answered).
        self.status = 500
        self.started = False
        #: The last body message was sent.
        self.completed = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.started = True
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            self.completed = True
        await self._send(message)

    def recorded_status(self, scope: Scope) -> int:
        """The status the logs and metrics record: :data:`CLIENT_CLOSED` when the client
        went away, else the response's."""
        return CLIENT_CLOSED if scope.get("state", {}).get("client_closed") else self.status
