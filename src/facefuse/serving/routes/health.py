"""Health, readiness and metrics: ``/healthz``, ``/readyz``, ``/metrics`` (no key)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from facefuse.serving.state import services

__all__ = ["router"]

router = APIRouter()


@router.get("/healthz", summary="Liveness: the process answers", tags=["health"])
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: models loaded, batchers running, cache reachable",
            tags=["health"])
async def readyz(request: Request) -> JSONResponse:
    """200 ``ready``; 200 ``degraded`` while a configured Redis is unreachable (requests
    still succeed, without the shared L2; the job queue's: every job route answers 503
    meanwhile) or while the template store is unreachable or not durable
    (``templates_durable: false``, the reason in ``templates_warning``); 503
    ``not_ready`` while loading or draining."""
    svc = services(request)
    pipeline = svc.pipeline
    models_ok = pipeline is not None and all(
        n in pipeline.registry.loaded() for n in pipeline.startup_models)
    batchers_ok = pipeline is not None and pipeline.running
    l2_ok = await svc.l2.ping()
    store = svc.templates
    health = await store.health() if store is not None else None
    templates_ok = health is None or (health.reachable and health.durable is not False)
    jobs_ok = await _jobs_reachable(request)
    if not (models_ok and batchers_ok) or svc.draining:
        status, code = "not_ready", 503
    else:
        healthy = l2_ok and templates_ok and jobs_ok is not False
        status, code = ("ready" if healthy else "degraded"), 200
    checks: dict[str, Any] = {"models": models_ok, "batchers": batchers_ok,
                              "l2": svc.l2.kind, "l2_healthy": l2_ok,
                              "draining": svc.draining}
    if store is not None and health is not None:
        checks.update({"templates": store.kind, "templates_reachable": health.reachable,
                       "templates_durable": health.durable})
        if health.reason:
            checks["templates_warning"] = health.reason
    if jobs_ok is not None:
        checks["jobs_reachable"] = jobs_ok
    return JSONResponse({"status": status, "checks": checks}, status_code=code)


async def _jobs_reachable(request: Request) -> bool | None:
    """Whether the job queue's Redis answers (None: no job queue configured)."""
    settings = services(request).settings
    if not settings.jobs_redis_url:
        return None
    from facefuse.serving.jobs.queue import ping_client, reachable

    client = getattr(request.app.state, "jobs_ping", None)
    if client is None:
        client = request.app.state.jobs_ping = ping_client(settings)
    return await asyncio.to_thread(reachable, client)


@router.get("/metrics", summary="Prometheus metrics", tags=["health"],
            response_class=Response)
async def metrics(request: Request) -> Response:
    body, ctype = services(request).metrics.render()
    return Response(content=body, media_type=ctype)
