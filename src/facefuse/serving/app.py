"""The FastAPI application factory.

``create_app(settings)`` builds the app; uvicorn serves it (``facefuse serve``, which
runs :func:`app_from_env` as a factory in every worker process). Start-up (in the
lifespan) loads and warms the models in a worker thread, starts one micro-batcher
per model, checks Redis when configured and starts the model-directory watcher.
Shutdown — after uvicorn stopped accepting connections and waited for in-flight
requests (up to ``shutdown_grace_s``) — marks the app draining, drains the batchers,
stops the pools and closes the cache.

Middleware, outermost first: request context (request id, JSON access log, metrics,
in-flight bound, last-resort 500), CORS (only when origins are configured), the
body limit, then FastAPI's routing and exception handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from prometheus_client import Gauge
from starlette.exceptions import HTTPException as StarletteHTTPException

from facefuse import __version__
from facefuse.config import Settings
from facefuse.errors import FacefuseError, InvalidArgumentError, OverloadedError
from facefuse.runtime.registry import ModelRegistry
from facefuse.serving.cache import InProcessResultCache, RedisResultCache, ResultCache
from facefuse.serving.inputs import describe_errors
from facefuse.serving.logs import configure_logging, request_id_var
from facefuse.serving.metrics import Metrics
from facefuse.serving.pipeline import Pipeline
from facefuse.serving.routes import router
from facefuse.serving.security import ApiKeys, BodyLimitMiddleware
from facefuse.serving.state import Services

__all__ = [
    "app_from_env",
    "build_l2",
    "create_app",
    "serve",
    "settings_from_env",
    "validate_serving",
]

log = logging.getLogger("facefuse.serving")
access_log = logging.getLogger("facefuse.access")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")

_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 413: "body_too_large",
               415: "unsupported_media_type", 429: "too_many_requests"}

DESCRIPTION = """\
Self-hosted face fusion. Send a source face and a target image, get the target back
with the source identity fused in at the chosen degree.

Images go in as `multipart/form-data` file parts or as base64 strings in a JSON
object; JPEG, PNG and WebP only. Every error is JSON `{"error": {"code", "message"}}`
with a stable code. When API keys are configured, send `Authorization: Bearer <key>`.
"""


def validate_serving(settings: Settings) -> None:
    """Raise :class:`InvalidArgumentError` for out-of-range serving settings."""
    s = settings
    checks = [
        (s.max_batch_size >= 1, "max_batch_size must be >= 1"),
        (s.max_queue_delay_ms >= 0, "max_queue_delay_ms must be >= 0"),
        (s.max_queue_size >= 1, "max_queue_size must be >= 1"),
        (s.max_inflight >= 1, "max_inflight must be >= 1"),
        (s.request_timeout_s > 0, "request_timeout_s must be > 0"),
        (s.inference_workers >= 1 and s.cpu_workers >= 1, "worker pools need >= 1 thread"),
        (s.max_body_bytes > 0, "max_body_bytes must be > 0"),
        (s.l1_cache_bytes >= 0 and s.l2_cache_bytes >= 0, "cache sizes must be >= 0"),
        (s.redis_ttl_s > 0 and s.redis_timeout_s > 0, "redis_ttl_s and redis_timeout_s > 0"),
        (s.shutdown_grace_s >= 0 and s.reload_poll_s >= 0, "grace and poll must be >= 0"),
        (s.retry_after_s >= 1, "retry_after_s must be >= 1"),
        (s.debug_batch_delay_ms >= 0, "debug_batch_delay_ms must be >= 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise InvalidArgumentError(f"serving settings: {message}")
    if s.redis_url and not s.redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise InvalidArgumentError("redis_url must start with redis://, rediss:// or unix://")


def build_l2(settings: Settings) -> ResultCache:
    """Redis when ``redis_url`` is set, else the in-process LRU (the embedded default)."""
    if settings.redis_url:
        return RedisResultCache(settings.redis_url, ttl_s=settings.redis_ttl_s,
                                max_item_bytes=settings.l2_max_item_bytes,
                                socket_timeout=settings.redis_timeout_s)
    return InProcessResultCache(settings.l2_cache_bytes,
                                max_item_bytes=settings.l2_max_item_bytes)


# --- error answers --------------------------------------------------------------------------


def error_response(svc: Services | None, status: int, code: str, message: str) -> JSONResponse:
    """The JSON error body with the headers its status needs."""
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="facefuse"'
    if status == 503:
        headers["Retry-After"] = str(svc.settings.retry_after_s if svc else 1)
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


def _note_error(request: Request, code: str) -> None:
    request.scope.setdefault("state", {}).setdefault("log", {})["error"] = code


async def _facefuse_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FacefuseError)
    _note_error(request, exc.code)
    svc: Services | None = getattr(request.app.state, "services", None)
    return error_response(svc, exc.http_status, exc.code, exc.message)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    _note_error(request, "invalid_argument")
    return error_response(None, 422, "invalid_argument", describe_errors(exc.errors()))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    _note_error(request, code)
    response = error_response(None, exc.status_code, code, str(exc.detail))
    for k, v in (exc.headers or {}).items():
        response.headers[k] = v
    return response


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    _note_error(request, "internal_error")
    return error_response(None, 500, "internal_error", "internal server error")


# --- request context middleware -------------------------------------------------------------


class RequestContextMiddleware:
    """Request id, in-flight bound, metrics and one JSON access-log line per request.

    * ``X-Request-ID``: taken from the request when it looks like an id, else a new
      uuid4; echoed on the response and set in the log context.
    * ``/v1/*`` requests beyond ``max_inflight`` at once, or arriving while draining,
      get 503 ``overloaded`` with ``Retry-After``.
    * An exception nothing else handled becomes 500 ``internal_error`` (logged with its
      traceback server-side, never sent to the client).
    """

    def __init__(self, app: Any, services: Services) -> None:
        self.app = app
        self.svc = services
        self.inflight = 0
        self.gauge = Gauge("facefuse_http_requests_in_flight",
                           "Requests being processed now.", registry=services.metrics.registry)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
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

        async def send_wrapper(message: Any) -> None:
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

    def _finish(self, scope: Any, status: int, seconds: float) -> None:
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


def _request_id(scope: Any) -> str:
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


# --- lifespan -------------------------------------------------------------------------------


def _lifespan(registry: ModelRegistry | None) -> Any:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc: Services = app.state.services
        settings = svc.settings
        loop = asyncio.get_running_loop()

        def build() -> Pipeline:
            p = Pipeline(settings, registry or ModelRegistry(settings), metrics=svc.metrics)
            p.warmup()
            return p

        t0 = time.monotonic()
        try:
            pipeline = await loop.run_in_executor(None, build)
        except FacefuseError as exc:
            log.error("cannot start: %s", exc.message, extra={"fields": {"code": exc.code}})
            raise
        pipeline.start()
        svc.pipeline = pipeline
        svc.metrics.register_cache("l1", pipeline.l1)
        svc.metrics.set_models(svc.model_rows())
        ping = getattr(svc.l2, "ping", None)
        l2_state = "memory"
        if ping is not None:
            l2_state = "redis ok" if await ping() else "redis unreachable (degraded)"
        watcher: asyncio.Task[None] | None = None
        if settings.reload_poll_s > 0:
            from facefuse.serving.watcher import watch_models

            watcher = asyncio.create_task(watch_models(svc), name="model-watcher")
        log.info("facefuse ready", extra={"fields": {
            "startup_s": round(time.monotonic() - t0, 2), "models": pipeline.model_versions,
            "l2": l2_state, "batching": settings.batching, "auth": svc.keys.enabled,
            "max_batch_size": settings.max_batch_size,
            "max_queue_delay_ms": settings.max_queue_delay_ms}})
        try:
            yield
        finally:
            svc.draining = True
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            drained = await pipeline.drain(settings.shutdown_grace_s)
            pipeline.close()
            await svc.l2.close()
            log.info("facefuse stopped", extra={"fields": {"drained": drained}})

    return lifespan


# --- the factory ----------------------------------------------------------------------------


def create_app(
    settings: Settings,
    *,
    api_keys: ApiKeys | None = None,
    registry: ModelRegistry | None = None,
    l2: ResultCache | None = None,
    metrics: Metrics | None = None,
) -> FastAPI:
    """The facefuse HTTP app.

    Args:
        settings: serving settings (validated here).
        api_keys: the API keys; default: read FACEFUSE_API_KEYS / FACEFUSE_ADMIN_KEYS
            from the environment (no keys: authentication off).
        registry: a model registry to share (default: a new one over settings).
        l2: the result cache (default: :func:`build_l2`).
        metrics: the metrics (default: a new private registry).

    Models are loaded when the app starts (its lifespan), not here.
    """
    validate_serving(settings)
    keys = api_keys if api_keys is not None else ApiKeys.from_env(os.environ)
    svc = Services(settings=settings, l2=l2 if l2 is not None else build_l2(settings),
                   metrics=metrics or Metrics(), keys=keys)
    svc.metrics.register_cache("l2", svc.l2)
    app = FastAPI(title="facefuse", version=__version__, description=DESCRIPTION,
                  lifespan=_lifespan(registry))
    app.state.services = svc
    app.include_router(router)
    app.add_exception_handler(FacefuseError, _facefuse_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    # add_middleware wraps: the last added is the outermost.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID",
                           "X-Facefuse-Timeout"],
            expose_headers=["X-Request-ID", "X-Facefuse-Cache",
                            "X-Facefuse-Identity-Similarity", "Server-Timing", "Retry-After"],
            max_age=600,
        )
    app.add_middleware(RequestContextMiddleware, services=svc)
    return app


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings for the server from ``FACEFUSE_*`` (free-form strings such as
    ``FACEFUSE_REDIS_URL`` are kept verbatim, passwords included)."""
    return Settings.from_env(os.environ if env is None else env)


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas, as ``MALLOC_ARENA_MAX=2`` would (unless that is set).

    Every thread that contends for the heap otherwise gets an arena of its own, and
    image buffers freed in one thread's arena are not reused by another: measured
    here, ~30 MB less peak RSS under load for the same throughput. Call before the
    pools start. Returns True when applied.
    """
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


#: glibc's mallopt parameter number of M_ARENA_MAX.
M_ARENA_MAX = -8


def app_from_env() -> FastAPI:
    """The uvicorn factory (``facefuse.serving.app:app_from_env``): settings and keys
    from the environment, JSON logs, capped malloc arenas."""
    configure_logging(os.environ.get("FACEFUSE_LOG_LEVEL", "info"))
    limit_malloc_arenas()
    return create_app(settings_from_env())


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    *,
    models_dir: str | None = None,
    threads: int | None = None,
    log_level: str = "info",
) -> int:
    """Run the server under uvicorn until SIGINT/SIGTERM (``facefuse serve``).

    Settings are checked and the model manifest is opened first, so a bad setting or
    a missing model zoo fails here with its typed error instead of in every worker.
    Worker processes read their settings from the environment (``--models-dir`` and
    ``--threads`` are exported as ``FACEFUSE_MODELS_DIR`` / ``FACEFUSE_THREADS``).
    """
    import math
    from pathlib import Path

    import uvicorn

    from facefuse.runtime.manifest import Manifest

    if models_dir:
        os.environ["FACEFUSE_MODELS_DIR"] = str(Path(models_dir).expanduser().resolve())
    if threads is not None:
        os.environ["FACEFUSE_THREADS"] = str(threads)
    os.environ.setdefault("FACEFUSE_LOG_LEVEL", log_level)
    configure_logging(os.environ["FACEFUSE_LOG_LEVEL"])
    settings = settings_from_env()
    validate_serving(settings)
    ApiKeys.from_env(os.environ)  # a malformed key list fails now, naming the variable
    Manifest.load(settings.model_dir)
    if workers < 1:
        raise InvalidArgumentError("--workers must be >= 1")
    uvicorn.run(
        "facefuse.serving.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_config=None,
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
        lifespan="on",
    )
    return 0
