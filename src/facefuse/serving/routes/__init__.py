"""The HTTP routes, a module a resource: :mod:`.health`, :mod:`.fuse`, :mod:`.faces`
(faces, embed, verify), :mod:`.models` (models, capabilities, reload, cache purge),
:mod:`.templates`, :mod:`.live` and :mod:`.jobs`. What they share is in
:mod:`.requests` (keys, deadline, stage metrics), :mod:`.responses` (error tables,
marks, face JSON, the image response), :mod:`.schemas` and :mod:`.fuse_request`."""

from __future__ import annotations

from fastapi import FastAPI

from facefuse.config import Settings
from facefuse.serving.routes import faces, fuse, health, jobs, live, models, templates

__all__ = ["include_routes"]


def include_routes(app: FastAPI, settings: Settings) -> None:
    """Every route, in the order the OpenAPI document lists them."""
    app.include_router(health.router)
    for api in (fuse.api, faces.api, models.api):
        app.include_router(api, tags=["v1"])
    app.include_router(models.admin)
    app.include_router(templates.api)
    app.include_router(models.capabilities_api)
    app.include_router(templates.admin)
    app.include_router(live.router)
    if settings.jobs_redis_url:  # jobs live in Redis: without it the routes do not exist
        app.include_router(jobs.router)
