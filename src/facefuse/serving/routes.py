"""The HTTP routes: /v1 API, admin routes, health, readiness and metrics.

Handlers stay thin: read and validate the request (:mod:`.inputs`), call the
pipeline under the request deadline, shape the answer. Errors are raised as typed
:class:`~facefuse.errors.FacefuseError` subclasses and turned into JSON by the
app's exception handlers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable
from typing import Annotated, Any, TypeVar

import numpy as np
from fastapi import APIRouter, Depends, Request, Security
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from facefuse.errors import DeadlineExceededError
from facefuse.faces.detectors import Purpose
from facefuse.faces.types import Face
from facefuse.faces.verify import largest_face, verify_faces
from facefuse.serving.cache.keys import result_key, sha256_hex, tenant_key
from facefuse.serving.cache.results import CachedResult
from facefuse.serving.fuse_request import SOURCE_FIELDS, FuseRequest, read_fuse_request
from facefuse.serving.inputs import read_request, validate_params
from facefuse.serving.metrics import STAGES
from facefuse.serving.pipeline import Analysis, FuseOutcome, RequestContext, gather_all
from facefuse.serving.schemas import (
    EmbedParams,
    ErrorBody,
    FacesParams,
    FuseParams,
    VerifyParams,
    image_request_body,
)
from facefuse.serving.state import Services, services

__all__ = ["router"]

log = logging.getLogger("facefuse.serving")

T = TypeVar("T")

_bearer = HTTPBearer(
    auto_error=False,
    description="`Authorization: Bearer <key>` — needed when FACEFUSE_API_KEYS is set; "
    "admin routes need a key from FACEFUSE_ADMIN_KEYS.",
)


Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]


async def require_key(request: Request, _: Credentials) -> None:
    """Any configured API key (or none, when authentication is off)."""
    label = services(request).keys.check(request.headers.get("authorization"))
    request.state.key_label = label


async def require_admin(request: Request, _: Credentials) -> None:
    """An admin key (or none, when authentication is off)."""
    label = services(request).keys.check(request.headers.get("authorization"), admin=True)
    request.state.key_label = label


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": desc}
    for code, desc in (
        (400, "Malformed body"), (401, "Missing or invalid API key"),
        (403, "Admin key needed"), (413, "Body or image too large"),
        (415, "Unsupported image format or content type"),
        (422, "Invalid option, missing field, no usable face"),
        (503, "Overloaded (retry after Retry-After seconds) or models not ready"),
        (504, "Deadline exceeded"),
    )
}

router = APIRouter()
api = APIRouter(prefix="/v1", dependencies=[Depends(require_key)], responses=_ERRORS)
admin = APIRouter(prefix="/v1", dependencies=[Depends(require_admin)], responses=_ERRORS,
                  tags=["admin"])


# --- helpers ----------------------------------------------------------------------------


async def within_deadline(ctx: RequestContext, aw: Awaitable[T]) -> T:
    """Await ``aw``; past the request deadline raise :class:`DeadlineExceededError`."""
    if ctx.deadline is None:
        return await aw
    try:
        async with asyncio.timeout_at(ctx.deadline):
            return await aw
    except TimeoutError:
        raise DeadlineExceededError("the request deadline passed") from None


def server_timing(ctx: RequestContext, **extra: float) -> str:
    """``Server-Timing`` value: ``decode;dur=12.1, detect;dur=8.0, ...`` (milliseconds)."""
    items = {**ctx.timer.ms, **extra}
    return ", ".join(f"{k};dur={v:.1f}" for k, v in items.items())


def observe_stages(svc: Services, ctx: RequestContext) -> None:
    for stage, ms in ctx.timer.ms.items():
        if stage in STAGES:
            svc.metrics.observe_stage(stage, ms / 1000.0)


def _mark(request: Request, **fields: Any) -> None:
    """Fields the access log line shows (cache outcome, faces...)."""
    log_fields = request.scope.setdefault("state", {}).setdefault("log", {})
    log_fields.update(fields)


def _face_json(f: Face, *, landmarks: bool = False) -> dict[str, Any]:
    d = f.to_dict(landmarks=landmarks)
    for key in ("keypoints", "landmarks5", "landmarks"):
        if key in d:  # float32 → shortest decimal of the 2-decimal value
            d[key] = np.round(np.asarray(d[key], np.float64), 2).tolist()
    if f.mesh_score is not None:
        d["mesh_score"] = round(float(f.mesh_score), 4)
    return d


def _vector(v: np.ndarray | None) -> list[float]:
    return [] if v is None else [round(float(x), 6) for x in v]


#: Response header listing the chosen faces that were not fused.
SKIPPED_HEADER = "X-Facefuse-Skipped-Faces"


def skipped_json(outcome: FuseOutcome) -> str:
    """The :data:`SKIPPED_HEADER` value: compact JSON
    ``[{"index", "box": [x0, y0, x1, y1], "reason"}]``; empty when none was skipped."""
    if not outcome.skipped:
        return ""
    return json.dumps([s.to_dict(message=False) for s in outcome.skipped],
                      separators=(",", ":"), ensure_ascii=True)


def _pack(outcome: FuseOutcome) -> CachedResult:
    return CachedResult(outcome.body, outcome.content_type, outcome.similarity,
                        skipped_json(outcome))


def _image_response(
    result: CachedResult, cache: str, ctx: RequestContext, timing: dict[str, float],
) -> Response:
    headers = {"X-Facefuse-Cache": cache, "Server-Timing": server_timing(ctx, **timing),
               "Cache-Control": "no-store"}
    if result.similarity is not None:
        headers["X-Facefuse-Identity-Similarity"] = f"{result.similarity:.6f}"
    if result.skipped:
        headers[SKIPPED_HEADER] = result.skipped
    return Response(content=result.body, media_type=result.media_type, headers=headers)


async def serve_fusion(
    request: Request, ctx: RequestContext, req: FuseRequest, target: bytes, key: str,
    t0: float, *, target_analysis: Analysis | None = None,
    target_purpose: Purpose | None = None, marks: dict[str, Any] | None = None,
    miss_marks: dict[str, Any] | None = None,
) -> Response:
    """The fused image of ``req`` into ``target``: from L2 under ``key`` when there, else
    computed once for all identical requests in flight (memory reserved for every image
    it decodes) and stored in L2 before the flight ends, so a later identical request
    always hits.

    Args:
        t0: ``time.perf_counter()`` when the request arrived (the ``total`` timing).
        target_analysis: the target's faces when already known (a stored template).
        target_purpose: the detector purpose of the target's analysis when it must be
            computed, instead of the one the request's mode implies (a template whose
            stored faces are stale is analysed as it was stored: every face).
        marks: access-log fields for every outcome; ``miss_marks``: for a computed one.
    """
    svc = services(request)
    pipeline = svc.require_pipeline()
    key = tenant_key(key, ctx.tenant)
    t = time.perf_counter()
    cached = await svc.l2.get(key)
    lookup_ms = (time.perf_counter() - t) * 1000.0
    if cached is not None:
        _mark(request, cache="hit", **(marks or {}))
        return _image_response(cached, "hit", ctx, {
            "cache": lookup_ms, "total": (time.perf_counter() - t0) * 1000.0})

    async def compute() -> FuseOutcome:
        async with pipeline.admit(req.decoded_images(target)):
            result = await pipeline.fuse(req.sources, target, req.options, ctx,
                                         fmt=req.params.format, quality=req.params.quality,
                                         reference=req.reference, mapping=req.mapping,
                                         similarity=req.params.similarity,
                                         target_analysis=target_analysis,
                                         target_purpose=target_purpose)
        await svc.l2.put(key, _pack(result))
        return result

    outcome, shared = await within_deadline(ctx, svc.coalesce(key, compute))
    if not shared:
        observe_stages(svc, ctx)
    cache = "hit" if shared else "miss"
    _mark(request, cache=cache, l1=",".join(ctx.l1), faces_fused=outcome.faces_fused,
          faces_skipped=len(outcome.skipped), **(marks or {}), **(miss_marks or {}))
    return _image_response(_pack(outcome), cache, ctx, {
        "cache": lookup_ms, "total": (time.perf_counter() - t0) * 1000.0})


# --- /v1 --------------------------------------------------------------------------------


@api.post(
    "/fuse",
    summary="Fuse the source face into the target image",
    response_class=Response,
    responses={200: {"content": {"image/jpeg": {}, "image/png": {}, "image/webp": {}},
                     "description": "The fused image (no input metadata; provenance XMP "
                     "and, when configured, a label and a C2PA manifest)."}},
    openapi_extra=image_request_body(
        {"source": "Image with the face to put in.", "target": "Image to change.",
         **{n: f"Source image {i} (several photos of one person, or one person per "
            "mapping index)." for i, n in enumerate(SOURCE_FIELDS[1:], 1)},
         "reference": "Image of the target person to replace (mode reference)."},
        FuseParams, ("source", "target")),
)
async def fuse(request: Request) -> Response:
    """Returns the fused image. Headers: ``X-Facefuse-Cache: hit|miss``,
    ``X-Facefuse-Identity-Similarity`` (with ``similarity=true`` only: cosine, output
    face vs source face),
    ``X-Facefuse-Skipped-Faces`` (mode many or a mapping, when a chosen face could not
    be fused: compact JSON ``[{"index", "box": [x0, y0, x1, y1], "reason"}]``, reason
    a stable code such as ``target_face_too_small``),
    ``Server-Timing`` (per-stage milliseconds), ``X-Request-ID``."""
    svc = services(request)
    pipeline = svc.require_pipeline()
    t0 = time.perf_counter()
    req = await read_fuse_request(request, pipeline.fuser)
    target = req.target
    assert target is not None
    ctx = svc.context(request, "/v1/fuse")
    key = result_key(sha256_hex(req.sources[0]), sha256_hex(target),
                     req.key_options(pipeline.output.describe()), pipeline.model_versions)
    return await serve_fusion(request, ctx, req, target, key, t0)


@api.post(
    "/faces",
    summary="Detect faces: boxes, keypoints, optional mesh and attributes",
    openapi_extra=image_request_body({"image": "The photo."}, FacesParams, ("image",)),
)
async def faces(request: Request) -> JSONResponse:
    """``{"width", "height", "faces": [{"bbox", "score", "keypoints", "landmarks5",
    "mesh_score", ["landmarks"], ["age", "gender", "gender_score"]}]}``, largest first;
    an image without a face gives an empty list."""
    svc = services(request)
    pipeline = svc.require_pipeline()
    images, fields = await read_request(request, ("image",))
    params = validate_params(FacesParams, fields)
    ctx = svc.context(request, "/v1/faces")

    async def run() -> dict[str, Any]:
        async with pipeline.admit([images["image"]]):
            rgb, digest = await pipeline.decode(images["image"], ctx)
            analysis = await pipeline.analyse(rgb, digest, ctx, embed=False, purpose="all")
            found: list[Face] = list(analysis.faces)
            if params.attributes and found:
                found = await pipeline.attributes(rgb, found, ctx)
        return {"width": analysis.width, "height": analysis.height,
                "faces": [_face_json(f, landmarks=params.landmarks) for f in found]}

    body = await within_deadline(ctx, run())
    observe_stages(svc, ctx)
    _mark(request, l1=",".join(ctx.l1), faces=len(body["faces"]))
    return JSONResponse(body, headers={"Server-Timing": server_timing(ctx)})


@api.post(
    "/embed",
    summary="Identity embeddings of every face",
    openapi_extra=image_request_body({"image": "The photo."}, EmbedParams, ("image",)),
)
async def embed(request: Request) -> JSONResponse:
    """``{"model": {"name", "version"}, "faces": [{"bbox", "score", "embedding" (128 floats,
    unit length: compare with cosine), "embedding_raw" (dlib's descriptor: same person when
    the Euclidean distance is below 0.6)}]}``, largest face first."""
    svc = services(request)
    pipeline = svc.require_pipeline()
    images, fields = await read_request(request, ("image",))
    validate_params(EmbedParams, fields)
    ctx = svc.context(request, "/v1/embed")

    async def run() -> list[Face]:
        async with pipeline.admit([images["image"]]):
            rgb, digest = await pipeline.decode(images["image"], ctx)
            analysis = await pipeline.analyse(rgb, digest, ctx, embed=True, purpose="all")
            return list(analysis.faces)

    found = await within_deadline(ctx, run())
    observe_stages(svc, ctx)
    _mark(request, l1=",".join(ctx.l1), faces=len(found))
    body = {
        "model": {"name": "dlib_resnet",
                  "version": pipeline.model_versions.get("dlib_resnet", "")},
        "faces": [{"bbox": [round(float(v), 2) for v in f.bbox], "score": round(f.score, 4),
                   "embedding": _vector(f.embedding), "embedding_raw": _vector(f.embedding_raw)}
                  for f in found],
    }
    return JSONResponse(body, headers={"Server-Timing": server_timing(ctx)})


@api.post(
    "/verify",
    summary="Are the largest faces of two photos the same person?",
    openapi_extra=image_request_body({"a": "First photo.", "b": "Second photo."},
                                     VerifyParams, ("a", "b")),
)
async def verify(request: Request) -> JSONResponse:
    """``{"similarity" (cosine, -1..1), "distance" (Euclidean of dlib descriptors),
    "threshold", "same_person" (distance < threshold), "faces": {"a": bbox, "b": bbox}}``."""
    svc = services(request)
    pipeline = svc.require_pipeline()
    images, fields = await read_request(request, ("a", "b"))
    validate_params(VerifyParams, fields)
    ctx = svc.context(request, "/v1/verify")

    async def one(name: str) -> Face:
        rgb, digest = await pipeline.decode(images[name], ctx)
        analysis = await pipeline.analyse(rgb, digest, ctx, embed=True)
        return largest_face(analysis.faces, name)

    async def both() -> list[Face]:
        async with pipeline.admit([images["a"], images["b"]]):
            return await gather_all([one("a"), one("b")])

    fa, fb = await within_deadline(ctx, both())
    observe_stages(svc, ctx)
    body = verify_faces(fa, fb, svc.settings.same_person_distance).to_dict()
    _mark(request, l1=",".join(ctx.l1))
    return JSONResponse(body, headers={"Server-Timing": server_timing(ctx)})


@api.get("/models", summary="Loaded models: name, version, sha256, precision, provider")
async def models(request: Request) -> dict[str, Any]:
    svc = services(request)
    return {
        "models": [r.to_dict() for r in svc.model_rows()],
        "generation": svc.pipeline.registry.generation if svc.pipeline else 0,
        "last_reload": svc.last_reload.to_dict(),
    }


# --- admin ------------------------------------------------------------------------------


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


# --- health -----------------------------------------------------------------------------


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
    from facefuse.serving.jobs import ping_client, reachable

    client = getattr(request.app.state, "jobs_ping", None)
    if client is None:
        client = request.app.state.jobs_ping = ping_client(settings)
    return await asyncio.to_thread(reachable, client)


@router.get("/metrics", summary="Prometheus metrics", tags=["health"],
            response_class=Response)
async def metrics(request: Request) -> Response:
    body, ctype = services(request).metrics.render()
    return Response(content=body, media_type=ctype)


router.include_router(api, tags=["v1"])
router.include_router(admin)
