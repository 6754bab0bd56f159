"""The OpenAPI document, made true to this server's configuration.

FastAPI derives the schema from the routes; this adds what only the settings know,
so generated clients send what the server accepts:

* authentication: bearer security is declared on the ``/v1`` routes only when API
  keys are configured (and then 401 is a possible answer); the admin routes always
  declare it and 403 (closed without an admin key unless FACEFUSE_ADMIN_OPEN);
* request bodies: no field beyond the documented ones (422 otherwise);
* image parts: the format allow-list (``encoding.contentType`` for multipart, the
  description for base64), the byte, pixel and minimum-side limits, and the
  largest base64 string (``maxLength``);
* the 408 of a too-slow upload, on every ``/v1`` operation;
* the 404 of an unknown id, on every operation with a path parameter.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from facefuse.config import Settings
from facefuse.imaging.decode import SUPPORTED_FORMATS
from facefuse.serving.api_keys import ApiKeys
from facefuse.serving.routes.schemas import ErrorBody

__all__ = ["install_openapi"]

_MEDIA = ", ".join(f"image/{f}" for f in SUPPORTED_FORMATS)
_ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}


def install_openapi(app: FastAPI, settings: Settings, keys: ApiKeys) -> None:
    """Replace ``app.openapi`` with one that states auth, limits and formats."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            schema.setdefault("components", {}).setdefault("schemas", {}).setdefault(
                "ErrorBody", ErrorBody.model_json_schema(
                    ref_template="#/components/schemas/{model}"))
            _annotate(schema, settings, keys)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _limits_text(s: Settings) -> str:
    return (f"JPEG, PNG or WebP (by content); at most {s.max_bytes} bytes and "
            f"{s.max_pixels} pixels, each side at least {s.min_side} pixels.")


def _annotate(schema: dict[str, Any], settings: Settings, keys: ApiKeys) -> None:
    b64_max = 4 * math.ceil(settings.max_bytes / 3)
    for path, item in schema.get("paths", {}).items():
        for op in item.values():
            if not isinstance(op, dict):
                continue
            admin = "admin" in op.get("tags", ())
            responses = op.setdefault("responses", {})
            if "{" in path:
                responses.setdefault("404", _error("No such resource (an unknown id)"))
            if path.startswith("/v1/"):
                responses.setdefault("408", _error("Upload too slow"))
                if not keys.enabled:
                    responses.pop("401", None)
                    if not admin:
                        op.pop("security", None)
            content = op.get("requestBody", {}).get("content", {})
            _annotate_images(content, settings, b64_max)


def _annotate_images(content: dict[str, Any], settings: Settings, b64_max: int) -> None:
    limits = _limits_text(settings)
    multipart = content.get("multipart/form-data", {})
    encoding = multipart.setdefault("encoding", {}) if multipart else {}
    if multipart:  # unknown fields are refused (422), whichever the encoding
        multipart.get("schema", {})["additionalProperties"] = False
    for props, binary in ((multipart.get("schema", {}).get("properties", {}), True),
                          (content.get("application/json", {}).get("schema", {})
                           .get("properties", {}), False)):
        for name, prop in props.items():
            fmt = prop.get("format")
            if binary and fmt == "binary":
                prop["description"] = f"{prop.get('description', '')} {limits}".strip()
                encoding[name] = {"contentType": _MEDIA}
            elif not binary and fmt == "byte":
                prop["description"] = f"{prop.get('description', '')} {limits}".strip()
                prop["maxLength"] = b64_max
                prop["minLength"] = 1


def _error(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": _ERROR_REF}}}
