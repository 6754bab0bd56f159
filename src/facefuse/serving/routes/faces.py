"""Analysis routes: ``POST /v1/faces``, ``/v1/embed`` and ``/v1/verify``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from facefuse.faces.types import Face
from facefuse.faces.verify import largest_face, verify_faces
from facefuse.serving.http.inputs import read_request, validate_params
from facefuse.serving.pipeline import gather_all
from facefuse.serving.routes.requests import observe_stages, require_key, within_deadline
from facefuse.serving.routes.responses import ERRORS, face_json, mark, server_timing, vector
from facefuse.serving.routes.schemas import (
    EmbedParams,
    FacesParams,
    VerifyParams,
    image_request_body,
)
from facefuse.serving.state import services

__all__ = ["api"]

api = APIRouter(prefix="/v1", dependencies=[Depends(require_key)], responses=ERRORS)


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
                "faces": [face_json(f, landmarks=params.landmarks) for f in found]}

    body = await within_deadline(ctx, run())
    observe_stages(svc, ctx)
    mark(request, l1=",".join(ctx.l1), faces=len(body["faces"]))
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
    mark(request, l1=",".join(ctx.l1), faces=len(found))
    body = {
        "model": {"name": "dlib_resnet",
                  "version": pipeline.model_versions.get("dlib_resnet", "")},
        "faces": [{"bbox": [round(float(v), 2) for v in f.bbox], "score": round(f.score, 4),
                   "embedding": vector(f.embedding), "embedding_raw": vector(f.embedding_raw)}
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
    mark(request, l1=",".join(ctx.l1))
    return JSONResponse(body, headers={"Server-Timing": server_timing(ctx)})
