"""Structured JSON logs with the request id.

One JSON object per line on stderr::

    {"ts": "2026-11-29T18:50:32.123Z", "level": "info", "logger": "facefuse.access",
     "msg": "POST /v1/fuse 200", "request_id": "3f2a...", "route": "/v1/fuse", ...}

The request id of the request being served is kept in a :class:`contextvars.ContextVar`
set by the request middleware, so every log line written while serving it (in the
event loop or in a worker thread started with :func:`contextvars.copy_context`)
carries it. Extra fields come from ``logger.info(..., extra={"fields": {...}})``.

Never log images, embeddings, request bodies or API tokens: only sizes, codes,
timings and the key *labels* from :class:`~facefuse.serving.api_keys.ApiKeys`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any

__all__ = ["JsonFormatter", "configure_logging", "request_id_var"]

#: The id of the request being served (``"-"`` outside requests).
request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar(
    "facefuse_request_id", default="-"
)

_STD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)))


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line with ts, level, logger, msg and request_id."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": request_id_var.get(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            doc.update(fields)
        for key, value in record.__dict__.items():
            if key not in _STD_ATTRS and key not in ("fields", "message", "color_message"):
                doc.setdefault(key, value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure_logging(level: str | int = "info") -> None:
    """Send every logger's records to stderr as JSON lines (idempotent).

    Replaces the root handlers; uvicorn's own loggers propagate to the root (the
    server runs uvicorn with ``log_config=None`` and its access log off — the
    request middleware writes one access line per request instead).
    """
    lvl = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_facefuse_json", False):
            root.setLevel(lvl)
            return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    handler._facefuse_json = True  # type: ignore[attr-defined]
    root.handlers = [handler]
    root.setLevel(lvl)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers = []
        lg.propagate = True
