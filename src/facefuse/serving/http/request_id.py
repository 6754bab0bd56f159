"""The request id: ``X-Request-ID`` taken from the request when it looks like an id,
else a new uuid4; echoed on every response and set in the log context
(:data:`~facefuse.serving.logs.request_id_var`) for as long as the request runs."""

from __future__ import annotations

import re
import time
import uuid

from facefuse.serving.http.asgi import Message, Receive, Scope, Send
from facefuse.serving.http.base import HttpMiddleware
from facefuse.serving.logs import request_id_var

__all__ = ["RequestIdMiddleware"]

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


class RequestIdMiddleware(HttpMiddleware):
    """Sets ``scope["state"]``'s ``request_id`` (and ``t0``, when the request arrived)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = _request_id(scope)
        token = request_id_var.set(rid)
        state = scope.setdefault("state", {})
        state["t0"], state["request_id"] = time.monotonic(), rid

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)


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
