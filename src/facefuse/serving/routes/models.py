"""The models and the caches: ``GET /v1/models``, ``GET /v1/capabilities``; admin
``POST /v1/models/reload`` and ``DELETE /v1/cache``."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, Request

from facefuse.fusion.mapping import MAX_MAPPINGS
from facefuse.fusion.select import MAX_ABS_YAW_DEG, MIN_EYE_DISTANCE_PX
from facefuse.serving.routes.fuse_request import SOURCE_FIELDS
from facefuse.serving.routes.requests import require_admin, require_key
from facefuse.serving.routes.responses import ERRORS, GONE, SKIPPED_HEADER
from facefuse.serving.routes.schemas import FuseParams
from facefuse.serving.state import services

__all__ = ["admin", "api", "capabilities_api"]

log = logging.getLogger("facefuse.serving")

api = APIRouter(prefix="/v1", dependencies=[Depends(require_key)], responses=ERRORS)
admin = APIRouter(prefix="/v1", dependencies=[Depends(require_admin)], responses=ERRORS,
                  tags=["admin"])
#: Capabilities, listed in the OpenAPI document among the templates (as they always were).
capabilities_api = APIRouter(prefix="/v1", dependencies=[Depends(require_key)],
                             responses={**ERRORS, **GONE}, tags=["templates"])


@api.get("/models", summary="Loaded models: name, version, sha256, precision, provider")
async def models(request: Request) -> dict[str, Any]:
    svc = services(request)
    return {
        "models": [r.to_dict() for r in svc.model_rows()],
        "generation": svc.pipeline.registry.generation if svc.pipeline else 0,
        "last_reload": svc.last_reload.to_dict(),
    }


@admin.post("/models/reload", summary="Reload changed models from the model directory")
async def reload_models(request: Request) -> dict[str, Any]:
    """Builds new sessions beside the old ones and swaps them atomically; in-flight
    requests finish on the old ones. A bad model on disk is refused (503
    ``model_corrupt`` / ``model_missing``) and the old models keep serving."""
    from facefuse.serving.watcher import reload_now

    svc = services(request)
    changed = await reload_now(svc, trigger="admin")
    return {"changed": changed, "models": [r.to_dict() for r in svc.model_rows()]}


@admin.delete("/cache", summary="Purge the L1 and L2 caches")
async def purge_cache(request: Request) -> dict[str, Any]:
    """Deletes every cached analysis (this process) and result (Redis: every
    ``facefuse:v2:*`` key; 503 ``cache_unavailable`` when Redis is down)."""
    svc = services(request)
    l1 = svc.pipeline.l1.clear() if svc.pipeline is not None else 0
    l2 = await svc.l2.purge()
    log.info("cache purged", extra={"fields": {"l1": l1, "l2": l2}})
    return {"purged": {"l1": l1, "l2": l2}}


@capabilities_api.get("/capabilities",
                      summary="Models, options and ranges, limits, mapping, provenance")
async def capabilities(request: Request) -> dict[str, Any]:
    """Everything a client may check before sending: which models run at which
    precision, every fusion option with its range and default, the swappers a
    request may name (``name``, ``kind``, ``needs_source_embedding``) and the one
    used when it names none, the image and
    body limits, the smallest usable face, the mapping maximum, and how outputs
    are marked (XMP, label, C2PA)."""
    svc = services(request)
    s = svc.settings
    options: dict[str, Any] = {}
    for name, prop in FuseParams.model_json_schema()["properties"].items():
        if name == "mapping":
            continue
        entry = {k: prop[k] for k in ("type", "minimum", "maximum", "enum", "default")
                 if k in prop}
        if "anyOf" in prop:  # optional numbers, choices with old spellings: the first branch
            num: dict[str, Any] = next(
                (b for b in prop["anyOf"] if b.get("type") != "null"), {})
            entry.update({k: num[k] for k in ("type", "minimum", "maximum", "enum") if k in num})
        options[name] = entry
    fuser = svc.pipeline.fuser if svc.pipeline is not None else None
    swappers = [i.to_dict() for i in fuser.describe_swappers()] if fuser is not None else []
    default = fuser.default_swapper if fuser is not None else s.swapper
    options["swapper"].update(type="string", default=default)
    if swappers:
        options["swapper"]["enum"] = [sw["name"] for sw in swappers]
    output = (svc.pipeline.output.describe() if svc.pipeline is not None else None)
    store = svc.templates
    return {
        "models": [{"name": r.name, "task": r.task, "precision": r.precision,
                    "provider": r.provider, "version": r.version} for r in svc.model_rows()],
        "precision": s.precision,
        "options": options,
        "swappers": {"default": default, "choices": swappers},
        "formats": ["jpeg", "png", "webp"],
        "limits": {"max_body_bytes": s.max_body_bytes, "max_image_bytes": s.max_bytes,
                   "max_pixels": s.max_pixels, "min_side": s.min_side,
                   "min_face_eye_distance_px": MIN_EYE_DISTANCE_PX,
                   "max_abs_yaw_deg": MAX_ABS_YAW_DEG,
                   "skipped_faces_header": SKIPPED_HEADER,
                   "request_timeout_s": s.request_timeout_s},
        "mapping": {"max_entries": MAX_MAPPINGS, "source_fields": list(SOURCE_FIELDS),
                    "target": "face index (largest first) or [x0, y0, x1, y1] pixels"},
        "provenance": output,
        "templates": {"backend": store.kind if store else None,
                      "max_count": store.max_count if store else 0,
                      "max_bytes": store.max_bytes if store else 0},
        "auth": {"api_keys": svc.keys.enabled},
    }
