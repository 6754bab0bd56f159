"""What nothing else handled: a client that went away (during the upload or while its
request was computed) is recorded as :data:`~facefuse.serving.http.asgi.CLIENT_CLOSED`
``client_closed``, not as a 500; any other exception becomes 500 ``internal_error``
(logged with its traceback server-side, never sent to the client), unless the response
had started."""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect

from facefuse.serving.http.asgi import Receive, ResponseWatch, Scope, Send, log_fields
from facefuse.serving.http.base import HttpMiddleware
from facefuse.serving.http.error_handlers import error_response
from facefuse.serving.http.upload import ClientGoneError

__all__ = ["LastResortMiddleware"]

log = logging.getLogger("facefuse.serving")


class LastResortMiddleware(HttpMiddleware):
    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = ResponseWatch(send)
        try:
            await self.app(scope, receive, watch.send)
        except (ClientGoneError, ClientDisconnect):
            scope.setdefault("state", {})["client_closed"] = True
            log_fields(scope)["error"] = "client_closed"
        except Exception:
            log.exception("unhandled error")
            log_fields(scope)["error"] = "internal_error"
            if not watch.started:
                await error_response(None, 500, "internal_error", "internal server error")(
                    scope, receive, send)
