"""Routes of the product surface: templates and capabilities.

* ``POST /v1/templates`` (admin): register an image; it is analysed once and the
  analysis stored with it. ``GET /v1/templates``, ``GET /v1/templates/{id}``,
  ``DELETE /v1/templates/{id}`` (admin).
* ``POST /v1/templates/{id}/fuse``: fuse the user's photo(s) into a template, with
  the options of ``/v1/fuse``; the template's faces come from the store (no
  detection or mesh on it: ``Server-Timing`` shows ``template`` instead).
* ``GET /v1/capabilities``: what a client needs to validate before sending.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, ValidationInfo, field_validator

from facefuse.errors import NoFaceError, TemplateExistsError
from facefuse.imaging.decode import sniff_format
from facefuse.imaging.encode import content_type
from facefuse.serving.cache.keys import result_key, sha256_hex
from facefuse.serving.http.inputs import read_request, validate_params
from facefuse.serving.pipeline import Analysis
from facefuse.serving.routes.fuse import serve_fusion
from facefuse.serving.routes.fuse_request import SOURCE_FIELDS, read_fuse_request
from facefuse.serving.routes.requests import (
    observe_stages,
    require_admin,
    require_key,
    within_deadline,
)
from facefuse.serving.routes.responses import ERRORS, GONE, face_json, mark
from facefuse.serving.routes.schemas import ErrorBody, FuseParams, Params, image_request_body
from facefuse.serving.state import services
from facefuse.serving.templates.records import (
    MAX_METADATA,
    MAX_METADATA_KEY,
    MAX_METADATA_VALUE,
    MAX_NAME,
    Template,
    check_labels,
)
from facefuse.serving.templates.store import template_id

__all__ = ["admin", "api"]

api = APIRouter(prefix="/v1", dependencies=[Depends(require_key)],
                responses={**ERRORS, **GONE}, tags=["templates"])
admin = APIRouter(prefix="/v1", dependencies=[Depends(require_admin)],
                  responses={**ERRORS, **GONE,
                             409: {"model": ErrorBody, "description":
                                   "Image registered already with other labels"},
                             507: {"model": ErrorBody, "description": "Template store full"}},
                  tags=["templates", "admin"])


class TemplateParams(Params):
    """Fields of ``POST /v1/templates`` besides the image."""

    name: str = Field("", max_length=MAX_NAME, description="A label for people.")
    metadata: dict[str, str] = Field(
        default_factory=dict, description=f"Up to {MAX_METADATA} string pairs (values up to "
        f"{MAX_METADATA_VALUE} characters); in multipart, a JSON object string.")

    @field_validator("metadata", mode="before")
    @classmethod
    def _metadata_json(cls, v: Any, info: ValidationInfo) -> Any:
        import json

        if isinstance(v, str) and (info.context or {}).get("typed"):
            raise ValueError("metadata must be a JSON object (a string only in multipart)")
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except ValueError:
                raise ValueError("metadata must be a JSON object") from None
        if isinstance(v, dict) and (len(v) > MAX_METADATA or any(
                len(str(k)) > MAX_METADATA_KEY or len(str(x)) > MAX_METADATA_VALUE
                for k, x in v.items())):
            raise ValueError(f"metadata: at most {MAX_METADATA} pairs, keys up to "
                             f"{MAX_METADATA_KEY} and values up to {MAX_METADATA_VALUE} "
                             "characters")
        return v


def _detail(t: Template) -> dict[str, Any]:
    return {**t.summary(),
            "faces": [{"index": i, **face_json(f)} for i, f in enumerate(t.faces)]}


@admin.post(
    "/templates", summary="Register a template image (analysed once, stored with its faces)",
    openapi_extra=image_request_body({"image": "The template photo."}, TemplateParams,
                                     ("image",)),
    status_code=201,
)
async def create_template(request: Request) -> JSONResponse:
    """``201`` with the template (``id``, ``faces`` with ``index`` and ``bbox``); ``200``
    when the same image was registered before with the same name and metadata (ids are
    content addresses); ``409 template_exists`` (with the existing ``id``) when it was
    registered with another name or metadata: nothing is changed, delete it first to
    register it again. 422 ``no_face`` for an image without a face, 422
    ``invalid_template_metadata`` for a name or metadata that is not storable text;
    507 ``template_store_full`` at the bound."""
    svc = services(request)
    pipeline = svc.require_pipeline()
    store = svc.require_templates()
    images, fields = await read_request(request, ("image",))
    params = validate_params(TemplateParams, fields)
    check_labels(params.name, params.metadata)  # storable text: 422 before any work
    data = images["image"]
    ctx = svc.context(request, "/v1/templates")

    async def analyse() -> Analysis:
        async with pipeline.admit([data]):
            rgb, digest = await pipeline.decode(data, ctx)
            # Every face: a template is listed with face indices and fused in any mode.
            return await pipeline.analyse(rgb, digest, ctx, embed=True, purpose="all")

    analysis = await within_deadline(ctx, analyse())
    observe_stages(svc, ctx)
    if not analysis.faces:
        raise NoFaceError("no face found in the template image", code="template_no_face")
    template = Template(template_id(data), params.name, data, analysis.faces, analysis.width,
                        analysis.height, dict(pipeline.model_versions), dict(params.metadata))
    created = await store.put(template)
    if not created:
        stored = await store.get(template.id)
        if (stored.name, stored.metadata) != (template.name, template.metadata):
            mark(request, template=stored.id, created=False)
            exc = TemplateExistsError(
                f"this image is registered already as template {stored.id} with another "
                "name or metadata; delete it first to register it again")
            return JSONResponse({"error": {"code": exc.code, "message": exc.message,
                                           "id": stored.id}}, status_code=exc.http_status)
        template = stored
    mark(request, template=template.id, created=created)
    return JSONResponse(_detail(template), status_code=201 if created else 200)


@api.get("/templates", summary="List the templates (newest first)")
async def list_templates(request: Request) -> dict[str, Any]:
    store = services(request).require_templates()
    items = await store.list()
    return {"templates": items, "count": len(items), "max_count": store.max_count,
            "bytes": sum(int(i["bytes"]) for i in items), "max_bytes": store.max_bytes}


@api.get("/templates/{template}", summary="One template: its faces with boxes and indices")
async def get_template(request: Request, template: str) -> dict[str, Any]:
    return _detail(await services(request).require_templates().get(template))


@api.get("/templates/{template}/image", summary="The template's image, as uploaded",
         response_class=Response,
         responses={200: {"content": {"image/jpeg": {}, "image/png": {}, "image/webp": {}}}})
async def template_image(request: Request, template: str) -> Response:
    stored = await services(request).require_templates().get(template)
    return Response(stored.image, media_type=content_type(sniff_format(stored.image)),
                    headers={"Cache-Control": "private, max-age=3600"})


@admin.delete("/templates/{template}", summary="Delete a template", status_code=204,
              response_class=Response)
async def delete_template(request: Request, template: str) -> Response:
    await services(request).require_templates().delete(template)
    return Response(status_code=204)


@api.post(
    "/templates/{template}/fuse",
    summary="Fuse the user's face(s) into a stored template",
    response_class=Response,
    responses={200: {"content": {"image/jpeg": {}, "image/png": {}, "image/webp": {}},
                     "description": "The fused image (see /v1/fuse)."}},
    openapi_extra=image_request_body(
        {"source": "Image with the face to put in.",
         **{n: f"Source image {i} (for a mapping)." for i, n in enumerate(SOURCE_FIELDS[1:], 1)},
         "reference": "Image of the template person to replace (mode reference)."},
        FuseParams, ("source",)),
)
async def fuse_template(request: Request, template: str) -> Response:
    """Like ``/v1/fuse`` with the template as the target: the template's analysis is
    read from the store, not recomputed (``Server-Timing``: ``template`` = store read;
    ``detect`` / ``mesh`` cover the source images only). After a model reload the
    template is analysed again with the new models."""
    svc = services(request)
    pipeline = svc.require_pipeline()
    store = svc.require_templates()
    t0 = time.perf_counter()
    req = await read_fuse_request(request, pipeline.fuser, target=False)
    ctx = svc.context(request, "/v1/templates/fuse")
    t = time.perf_counter()
    stored = await store.get(template)
    ctx.timer.add("template", t)
    # Its own key (not the plain fuse's): a template fuse is computed from the stored faces.
    key = result_key(sha256_hex(req.sources[0]), sha256_hex(stored.image),
                     {**req.key_options(pipeline.output.describe()), "template": stored.id},
                     pipeline.model_versions)
    # Faces analysed by other model versions (a reload since) are not reused.
    fresh = stored.model_versions == pipeline.model_versions
    analysis = Analysis(stored.faces, True, stored.width, stored.height) if fresh else None
    return await serve_fusion(
        request, ctx, req, stored.image, key, t0, target_analysis=analysis,
        target_purpose="all", marks={"template": stored.id},
        miss_marks={"template_analysis": "stored" if fresh else "recomputed"})
