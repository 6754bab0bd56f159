"""``POST /v1/fuse``, and the fusion served from L2 or computed once (also the
template fuse's)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from facefuse.faces.detectors import Purpose
from facefuse.serving.cache.keys import result_key, sha256_hex, tenant_key
from facefuse.serving.pipeline import Analysis, FuseOutcome, RequestContext
from facefuse.serving.routes.fuse_request import SOURCE_FIELDS, FuseRequest, read_fuse_request
from facefuse.serving.routes.requests import observe_stages, require_key, within_deadline
from facefuse.serving.routes.responses import ERRORS, image_response, mark, pack
from facefuse.serving.routes.schemas import FuseParams, image_request_body
from facefuse.serving.state import services

__all__ = ["api", "serve_fusion"]

api = APIRouter(prefix="/v1", dependencies=[Depends(require_key)], responses=ERRORS)


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
        mark(request, cache="hit", **(marks or {}))
        return image_response(cached, "hit", ctx, {
            "cache": lookup_ms, "total": (time.perf_counter() - t0) * 1000.0})

    async def compute() -> FuseOutcome:
        async with pipeline.admit(req.decoded_images(target)):
            result = await pipeline.fuse(req.sources, target, req.options, ctx,
                                         fmt=req.params.format, quality=req.params.quality,
                                         reference=req.reference, mapping=req.mapping,
                                         similarity=req.params.similarity,
                                         target_analysis=target_analysis,
                                         target_purpose=target_purpose)
        await svc.l2.put(key, pack(result))
        return result

    outcome, shared = await within_deadline(ctx, svc.coalesce(key, compute))
    if not shared:
        observe_stages(svc, ctx)
    cache = "hit" if shared else "miss"
    mark(request, cache=cache, l1=",".join(ctx.l1), faces_fused=outcome.faces_fused,
          faces_skipped=len(outcome.skipped), **(marks or {}), **(miss_marks or {}))
    return image_response(pack(outcome), cache, ctx, {
        "cache": lookup_ms, "total": (time.perf_counter() - t0) * 1000.0})


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
