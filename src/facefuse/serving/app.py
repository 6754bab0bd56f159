"""The FastAPI application factory and its lifespan.

``create_app(settings)`` builds the app; uvicorn serves it (``facefuse serve``: see
:mod:`facefuse.serving.run`). Start-up (in the lifespan) loads and warms the models
in a worker thread, starts one micro-batcher per model, checks the L2 cache and
starts the model-directory watcher. Shutdown — after uvicorn stopped accepting
connections and waited for in-flight requests (up to ``shutdown_grace_s``) — marks
the app draining, drains the batchers, stops the pools and closes the cache.

The middleware, outermost first, are listed in :mod:`facefuse.serving.http.stack`
(request id, access log, request metrics, last resort, draining, upload guard, in-flight
bound, CORS, body limit); inside them FastAPI's routing (:mod:`facefuse.serving.routes`)
and the error handlers of :mod:`facefuse.serving.http.error_handlers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI

from facefuse import __version__
from facefuse.config import Settings
from facefuse.errors import FacefuseError, InvalidArgumentError
from facefuse.runtime.registry import ModelRegistry
from facefuse.serving.api_keys import ApiKeys
from facefuse.serving.budget import MemoryBudget, budget_bytes, current_rss_bytes
from facefuse.serving.cache.results import InProcessResultCache, RedisResultCache, ResultCache
from facefuse.serving.heap import free_heap_bound, release_free_heap, trim_when_idle
from facefuse.serving.http.error_handlers import install_error_handlers
from facefuse.serving.http.stack import install_middleware
from facefuse.serving.metrics import Metrics
from facefuse.serving.openapi import install_openapi
from facefuse.serving.pipeline import Pipeline
from facefuse.serving.playground import install_playground
from facefuse.serving.routes import include_routes
from facefuse.serving.routes.live import live_sessions
from facefuse.serving.state import Services
from facefuse.serving.templates import TemplateStore, build_template_store
from facefuse.serving.watcher import watch_models

__all__ = ["build_l2", "create_app"]

log = logging.getLogger("facefuse.serving")

DESCRIPTION = """\
Self-hosted face fusion. Send a source face and a target image, get the target back
with the source identity fused in at the chosen degree.

Images go in as `multipart/form-data` file parts or as base64 strings in a JSON
object; JPEG, PNG and WebP only. Every error is JSON `{"error": {"code", "message"}}`
with a stable code. When API keys are configured, send `Authorization: Bearer <key>`;
admin routes need an admin key (without one they are closed). JSON option values are
typed strictly (a number is a JSON number). Limits: see each image field; a body must
arrive at a minimum rate (408 otherwise).
"""


def build_l2(settings: Settings) -> ResultCache:
    """Redis when ``redis_url`` is set, else the in-process LRU (the embedded default)."""
    if settings.redis_url:
        return RedisResultCache(settings.redis_url, ttl_s=settings.redis_ttl_s,
                                max_item_bytes=settings.l2_max_item_bytes,
                                socket_timeout=settings.redis_timeout_s)
    return InProcessResultCache(settings.l2_cache_bytes,
                                max_item_bytes=settings.l2_max_item_bytes)


def request_pool_bytes(settings: Settings, reserved: int = 0) -> int:
    """The part of the memory budget left to requests: the budget less what this
    process holds now (models, runtime: measured), the caches' bounds, what the C
    heap may keep free meanwhile (:func:`~facefuse.serving.heap.free_heap_bound`) and
    ``reserved`` bytes (the models still to load on their first run).

    Raises:
        InvalidArgumentError: less than one maximal body is left.
    """
    caches = settings.l1_cache_bytes + (0 if settings.redis_url else settings.l2_cache_bytes)
    pool = (budget_bytes(settings) - current_rss_bytes() - caches - free_heap_bound()
            - reserved)
    if pool < settings.max_body_bytes:
        raise InvalidArgumentError(
            f"memory budget {budget_bytes(settings) >> 20} MiB leaves {max(0, pool) >> 20} MiB "
            f"for requests after the models and caches; raise FACEFUSE_MEMORY_BUDGET_MB")
    return pool


# --- lifespan -------------------------------------------------------------------------------


async def _check_templates(svc: Services) -> str:
    """The template store's state for the start-up line; a warning when it is not
    durable (what /readyz and ``facefuse_template_store_durable`` also say)."""
    if svc.templates is None:
        return "none"
    health = await svc.templates.health()
    if not health.reachable:
        log.warning("template store unreachable: %s", health.reason)
        return f"{svc.templates.kind} unreachable"
    if health.durable is False:
        log.warning("template store is not durable: %s", health.reason,
                    extra={"fields": {"templates": svc.templates.kind}})
        return f"{svc.templates.kind} not durable"
    return f"{svc.templates.kind} ok"


async def _start(svc: Services, registry: ModelRegistry | None) -> tuple[Pipeline, int]:
    """Load and warm the models (in a worker thread), start the batchers and size the
    request pool; the pipeline and the pool's bytes."""
    settings = svc.settings

    def build() -> Pipeline:
        p = Pipeline(settings, registry or ModelRegistry(settings), metrics=svc.metrics,
                     budget=svc.budget)
        p.warmup()
        return p

    try:
        pipeline = await asyncio.get_running_loop().run_in_executor(None, build)
    except FacefuseError as exc:
        log.error("cannot start: %s", exc.message, extra={"fields": {"code": exc.code}})
        raise
    pipeline.start()
    # Model loading and warm-up leave tens of MB of freed buffers resident.
    release_free_heap()
    pool = request_pool_bytes(settings, pipeline.deferred_bytes)
    assert svc.budget is not None
    svc.budget.set_capacity(pool)
    svc.pipeline = pipeline
    svc.metrics.register_cache("l1", pipeline.l1)
    svc.metrics.set_models(svc.model_rows())
    return pipeline, pool


async def _stop(svc: Services, pipeline: Pipeline, tasks: list[asyncio.Task[None]]) -> None:
    """Drain: live sessions closed, background ``tasks`` cancelled, the batchers
    drained (up to ``shutdown_grace_s``), the pools, caches and store closed."""
    svc.draining = True
    if svc.live is not None:
        await svc.live.close_all()
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    drained = await pipeline.drain(svc.settings.shutdown_grace_s)
    pipeline.close()
    await svc.l2.close()
    if svc.templates is not None:
        await svc.templates.close()
    log.info("facefuse stopped", extra={"fields": {"drained": drained}})


def _lifespan(
    registry: ModelRegistry | None,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc: Services = app.state.services
        settings = svc.settings
        t0 = time.monotonic()
        pipeline, pool = await _start(svc, registry)
        l2_state = f"{svc.l2.kind} " + ("ok" if await svc.l2.ping() else "unreachable (degraded)")
        templates_state = await _check_templates(svc)
        # After a burst, the freed image buffers go back to the system.
        tasks = [asyncio.create_task(trim_when_idle(lambda: (svc.inflight, svc.answered)),
                                     name="heap-trimmer")]
        if settings.reload_poll_s > 0:
            tasks.append(asyncio.create_task(watch_models(svc), name="model-watcher"))

        log.info("facefuse ready", extra={"fields": {
            "startup_s": round(time.monotonic() - t0, 2), "models": pipeline.model_versions,
            "l2": l2_state, "templates": templates_state, "batching": settings.batching,
            "auth": svc.keys.enabled,
            "max_batch_size": settings.max_batch_size,
            "max_queue_delay_ms": settings.max_queue_delay_ms,
            "memory_budget_mb": budget_bytes(settings) >> 20, "request_pool_mb": pool >> 20}})
        try:
            yield
        finally:
            await _stop(svc, pipeline, tasks)

    return lifespan


# --- the factory ----------------------------------------------------------------------------


def create_app(
    settings: Settings,
    *,
    api_keys: ApiKeys | None = None,
    registry: ModelRegistry | None = None,
    l2: ResultCache | None = None,
    metrics: Metrics | None = None,
    templates: TemplateStore | None = None,
) -> FastAPI:
    """The facefuse HTTP app.

    Args:
        settings: the settings (keys and limits included).
        api_keys: the API keys; default: those of ``settings`` (no keys: authentication
            off).
        registry: a model registry to share (default: a new one over settings).
        l2: the result cache (default: :func:`build_l2`).
        metrics: the metrics (default: a new private registry).
        templates: the template store (default: :func:`build_template_store`).

    Models are loaded when the app starts (its lifespan), not here.
    """
    keys = api_keys if api_keys is not None else ApiKeys.from_settings(settings)
    keys.admin_open = settings.admin_open
    svc = Services(settings=settings, l2=l2 if l2 is not None else build_l2(settings),
                   metrics=metrics or Metrics(), keys=keys,
                   templates=templates or build_template_store(settings),
                   budget=MemoryBudget(request_pool_bytes(settings), settings.memory_wait_s))
    svc.metrics.register_cache("l2", svc.l2)
    svc.metrics.templates = svc.templates
    svc.live = live_sessions(settings, svc.metrics)
    app = FastAPI(title="facefuse", version=__version__, description=DESCRIPTION,
                  lifespan=_lifespan(registry))
    app.state.services = svc
    include_routes(app, settings)
    install_playground(app)
    install_openapi(app, settings, keys)
    install_error_handlers(app)
    install_middleware(app, svc)
    return app
