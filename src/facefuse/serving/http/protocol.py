"""uvicorn's HTTP/1.1 protocol with a header read timeout and a header size bound.

uvicorn bounds the idle time between keep-alive requests but not the time a
client may take to send a request's line and headers, so a client trickling one
header byte at a time holds a connection forever. :class:`GuardedHttpProtocol`
starts a timer when a connection opens and when the first byte of each request
arrives; if the headers are not complete within ``Settings.header_timeout_s`` it
answers ``408 Request Timeout`` and closes the connection. Headers of more than
:data:`MAX_HEADER_BYTES` are answered ``431`` and closed. (The body is guarded by
:class:`~facefuse.serving.http.upload.BodyReader`.)

The timeout comes from the :class:`~facefuse.config.Settings` that
:class:`~facefuse.serving.run.SettingsConfig` carries (uvicorn hands every protocol
instance its config).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from facefuse.config import Settings

__all__ = ["MAX_HEADER_BYTES", "GuardedHttpProtocol"]

log = logging.getLogger("facefuse.serving")

#: Most bytes of request line + headers (nginx's large_client_header_buffers: 4 × 8k).
MAX_HEADER_BYTES = 32 * 1024



def _answer(status: str, code: str, message: str) -> bytes:
    """A complete ``connection: close`` HTTP/1.1 response with the JSON error body."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n")
    return head.encode("ascii") + body


_408 = _answer("408 Request Timeout", "request_timeout", "the request headers arrived too slowly")
_431 = _answer("431 Request Header Fields Too Large", "headers_too_large",
               "the request line and headers are too large")


class GuardedHttpProtocol(HttpToolsProtocol):
    """:class:`HttpToolsProtocol` that refuses slow (408) and oversized (431) headers."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        settings = getattr(config, "facefuse_settings", None)
        self.header_timeout_s = (settings.header_timeout_s if isinstance(settings, Settings)
                                 else Settings.header_timeout_s)
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._in_headers = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._header_bytes = 0
        if self._header_timer is None:  # a keep-alive connection's next request
            self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def _count(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > MAX_HEADER_BYTES:
            self._refuse(_431, "headers too large")
            # Raised out of the parser callback: uvicorn stops parsing this connection.
            raise ValueError("request headers too large")

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _timed_out(self) -> None:
        self._header_timer = None
        # An idle keep-alive connection is uvicorn's own timeout's business.
        if self._in_headers or self.cycle is None:
            self._refuse(_408, "headers timed out")

    def _refuse(self, response: bytes, why: str) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        log.info("connection refused: %s", why, extra={"fields": {"client": self.client}})
        self.transport.write(response)
        self.transport.close()
