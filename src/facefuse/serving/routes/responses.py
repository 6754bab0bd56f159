"""What the routes answer with, shared: the error table of the OpenAPI document, the
access-log marks, ``Server-Timing``, a face as JSON, and the fused image's response
(its headers, the skipped faces)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response

from facefuse.faces.types import Face
from facefuse.serving.cache.results import CachedResult
from facefuse.serving.pipeline import FuseOutcome, RequestContext
from facefuse.serving.routes.schemas import ErrorBody

__all__ = ["ERRORS", "GONE", "SKIPPED_HEADER", "face_json", "image_response", "mark", "pack",
           "server_timing", "skipped_json", "vector"]

#: The errors every /v1 route may answer (the OpenAPI document's responses).
ERRORS: dict[int | str, dict[str, Any]] = {
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
#: What the template routes (and capabilities) add to :data:`ERRORS`.
GONE: dict[int | str, dict[str, Any]] = {
    410: {"model": ErrorBody, "description": "Template damaged or lost (set aside)"}}


def server_timing(ctx: RequestContext, **extra: float) -> str:
    """``Server-Timing`` value: ``decode;dur=12.1, detect;dur=8.0, ...`` (milliseconds)."""
    items = {**ctx.timer.ms, **extra}
    return ", ".join(f"{k};dur={v:.1f}" for k, v in items.items())


def mark(request: Request, **fields: Any) -> None:
    """Fields the access log line shows (cache outcome, faces...)."""
    log_fields = request.scope.setdefault("state", {}).setdefault("log", {})
    log_fields.update(fields)


def face_json(f: Face, *, landmarks: bool = False) -> dict[str, Any]:
    d = f.to_dict(landmarks=landmarks)
    for key in ("keypoints", "landmarks5", "landmarks"):
        if key in d:  # float32 → shortest decimal of the 2-decimal value
            d[key] = np.round(np.asarray(d[key], np.float64), 2).tolist()
    if f.mesh_score is not None:
        d["mesh_score"] = round(float(f.mesh_score), 4)
    return d


def vector(v: np.ndarray | None) -> list[float]:
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


def pack(outcome: FuseOutcome) -> CachedResult:
    return CachedResult(outcome.body, outcome.content_type, outcome.similarity,
                        skipped_json(outcome))


def image_response(
    result: CachedResult, cache: str, ctx: RequestContext, timing: dict[str, float],
) -> Response:
    headers = {"X-Facefuse-Cache": cache, "Server-Timing": server_timing(ctx, **timing),
               "Cache-Control": "no-store"}
    if result.similarity is not None:
        headers["X-Facefuse-Identity-Similarity"] = f"{result.similarity:.6f}"
    if result.skipped:
        headers[SKIPPED_HEADER] = result.skipped
    return Response(content=result.body, media_type=result.media_type, headers=headers)
