"""Reading image files and option fields from a request, multipart or JSON.

* ``multipart/form-data``: images as file parts, options as text fields.
* ``application/json``: an object with images as base64 strings (a ``data:`` URL
  prefix is accepted) and options as JSON values.

Everything else is 415. Option fields are validated with a pydantic model; any
problem is an :class:`~facefuse.errors.InvalidArgumentError` (HTTP 422,
``invalid_argument``) naming the field. The body size is bounded before this runs
(:class:`~facefuse.serving.security.BodyLimitMiddleware`).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.requests import Request

from facefuse.errors import (
    BadRequestError,
    InvalidArgumentError,
    UnsupportedMediaTypeError,
)

__all__ = ["BadRequestError", "UnsupportedMediaTypeError", "read_request", "validate_params"]

P = TypeVar("P", bound=BaseModel)

#: Most multipart parts accepted (files + fields).
MAX_PARTS = 32


async def read_request(
    request: Request, files: tuple[str, ...], optional: tuple[str, ...] = ()
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The image files and the other fields of a request.

    Args:
        request: the incoming request.
        files: names of required image parts.
        optional: names of optional image parts.

    Returns:
        (name → image bytes, name → raw option value).

    Raises:
        InvalidArgumentError: a missing image, an image sent as text (multipart) or as
            a non-string / bad base64 (JSON), a repeated part.
        BadRequestError: malformed JSON or multipart.
        UnsupportedMediaTypeError: another content type.
    """
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    names = files + optional
    if ctype == "multipart/form-data":
        images, fields = await _read_multipart(request, names)
    elif ctype == "application/json" or ctype.endswith("+json"):
        images, fields = await _read_json(request, names)
    else:
        shown = ctype or "none"
        raise UnsupportedMediaTypeError(
            f"content type {shown!r} is not accepted: send multipart/form-data "
            "(files) or application/json (base64 images)"
        )
    missing = [n for n in files if n not in images]
    if missing:
        raise InvalidArgumentError(f"missing field {missing[0]!r} (an image)")
    return images, fields


async def _read_multipart(
    request: Request, names: tuple[str, ...]
) -> tuple[dict[str, bytes], dict[str, Any]]:
    form = await request.form(max_files=len(names) + 1, max_fields=MAX_PARTS)
    images: dict[str, bytes] = {}
    fields: dict[str, Any] = {}
    try:
        for key, value in form.multi_items():
            if key in images or key in fields:
                raise InvalidArgumentError(f"field {key!r} is given more than once")
            if isinstance(value, UploadFile):
                if key not in names:
                    raise InvalidArgumentError(
                        f"unexpected file field {key!r} (expected: {', '.join(names)})"
                    )
                images[key] = await value.read()
            elif key in names:
                raise InvalidArgumentError(f"field {key!r} must be a file upload, not text")
            else:
                fields[key] = value
    finally:
        await form.close()
    return images, fields


async def _read_json(
    request: Request, names: tuple[str, ...]
) -> tuple[dict[str, bytes], dict[str, Any]]:
    body = await request.body()
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError("the JSON body must be an object")
    images: dict[str, bytes] = {}
    for name in names:
        if name not in doc:
            continue
        value = doc.pop(name)
        if not isinstance(value, str):
            raise InvalidArgumentError(f"field {name!r} must be a base64 string")
        images[name] = _b64(name, value)
    return images, doc


def _b64(name: str, value: str) -> bytes:
    text = value
    if text.startswith("data:"):
        _, sep, text = text.partition(",")
        if not sep:
            raise InvalidArgumentError(f"field {name!r}: malformed data: URL")
    text = "".join(text.split())
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgumentError(f"field {name!r} is not valid base64") from None


def validate_params(model: type[P], fields: dict[str, Any]) -> P:
    """``model`` from raw fields; errors become one ``invalid_argument`` naming the fields."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise InvalidArgumentError(describe_errors(exc.errors())) from None


def describe_errors(errors: Any) -> str:
    """``"degree: Input should be less than or equal to 100; ..."`` (values not echoed)."""
    parts = []
    for err in list(errors)[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query"))
        msg = str(err.get("msg", "invalid"))
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"
