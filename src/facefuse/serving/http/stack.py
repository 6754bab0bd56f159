"""The middleware stack, outermost first.

Each entry is a middleware class (most are :class:`~.base.HttpMiddleware` s) or
factory, called as ``entry(app, services)``; the first wraps all the others. Adding a
middleware is its own module here and one line in :data:`MIDDLEWARE`. Inside the last
one, FastAPI's routing and the error handlers of
:mod:`~facefuse.serving.http.error_handlers` run.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from facefuse.serving.http.access_log import AccessLogMiddleware
from facefuse.serving.http.asgi import ASGIApp
from facefuse.serving.http.body_limit import body_limit
from facefuse.serving.http.cors import cors
from facefuse.serving.http.draining import DrainingMiddleware
from facefuse.serving.http.inflight import InFlightMiddleware
from facefuse.serving.http.last_resort import LastResortMiddleware
from facefuse.serving.http.request_id import RequestIdMiddleware
from facefuse.serving.http.request_metrics import RequestMetricsMiddleware
from facefuse.serving.http.upload import UploadGuardMiddleware
from facefuse.serving.state import Services

__all__ = ["MIDDLEWARE", "install_middleware"]

Middleware = Callable[[ASGIApp, Services], ASGIApp]

MIDDLEWARE: tuple[Middleware, ...] = (
    RequestIdMiddleware,        # X-Request-ID, the log context
    AccessLogMiddleware,        # one JSON line a request
    RequestMetricsMiddleware,   # requests by route, method, status; their duration
    LastResortMiddleware,       # 499 client_closed; 500 internal_error
    DrainingMiddleware,         # 503 while shutting down, before the body is read
    UploadGuardMiddleware,      # the body read under timeouts and the memory budget
    InFlightMiddleware,         # 503 beyond max_inflight
    cors,                       # only with FACEFUSE_CORS_ORIGINS
    body_limit,                 # 413 over max_body_bytes
)


def install_middleware(app: FastAPI, services: Services) -> None:
    """Stack :data:`MIDDLEWARE` around ``app``'s routes."""
    for middleware in reversed(MIDDLEWARE):  # add_middleware wraps: the last added is outermost
        app.add_middleware(middleware, services)
