"""Reading image files and option fields from a request, multipart or JSON.

* ``multipart/form-data``: images as file parts, options as text fields.
* ``application/json``: an object with images as base64 strings (a ``data:`` URL
  prefix is accepted) and options as JSON values.

Everything else is 415. The line between 400 and 422:

* 400 ``bad_request``: the body cannot be parsed at all — malformed or too deeply
  nested JSON (more than :data:`MAX_JSON_DEPTH` levels), a multipart body without
  its closing boundary (truncated), a multipart body without a boundary;
* 422 ``invalid_argument``: it parses, but a field is missing, unknown, repeated,
  of the wrong type or out of range.

Option fields are validated with a pydantic model naming the field. JSON values
are typed, so they are validated strictly: ``"degree": "50"`` or
``"degree": true`` is a 422, only ``50`` / ``50.0`` is a number. Multipart text
fields are strings by nature and are parsed (``degree=50``). The body size is
bounded before this runs (:class:`~facefuse.serving.http.body_limit.BodyLimitMiddleware`).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncGenerator
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from facefuse.errors import (
    BadRequestError,
    InvalidArgumentError,
    UnsupportedMediaTypeError,
)

__all__ = [
    "MAX_JSON_DEPTH",
    "BadRequestError",
    "RequestFields",
    "UnsupportedMediaTypeError",
    "json_too_deep",
    "read_request",
    "validate_params",
]

P = TypeVar("P", bound=BaseModel)

#: Most multipart parts accepted (files + fields).
MAX_PARTS = 32

#: Deepest JSON nesting accepted (the API's bodies are flat objects: depth 1).
MAX_JSON_DEPTH = 32


class RequestFields(dict[str, Any]):
    """The option fields of a request; ``typed`` when they came as JSON values (then
    validated strictly: no string or boolean for a number)."""

    typed: bool = False


async def read_request(
    request: Request, files: tuple[str, ...], optional: tuple[str, ...] = ()
) -> tuple[dict[str, bytes], RequestFields]:
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
) -> tuple[dict[str, bytes], RequestFields]:
    boundary = _boundary(request.headers.get("content-type", ""))
    body = await _read_body(request)
    if b"--" + boundary + b"--" not in body:
        raise BadRequestError("the multipart body is truncated (no closing boundary)")
    # Every part starts with the delimiter, and so does the close: counted before parsing.
    if body.count(b"--" + boundary) - 1 > MAX_PARTS:
        raise BadRequestError(f"the multipart body has more than {MAX_PARTS} parts")

    async def whole() -> AsyncGenerator[bytes, None]:
        yield body

    parser = MultiPartParser(request.headers, whole(), max_files=len(names) + 1,
                             max_fields=MAX_PARTS)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise BadRequestError(exc.message) from None
    images: dict[str, bytes] = {}
    fields = RequestFields()
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


async def _read_body(request: Request) -> bytes:
    """The whole body, not kept on ``request`` (``request.body()`` would keep it there
    for the request's whole life, beside the images taken out of it)."""
    chunks = [chunk async for chunk in request.stream()]
    return b"".join(chunks)


def _boundary(content_type: str) -> bytes:
    for param in content_type.split(";")[1:]:
        key, _, value = param.strip().partition("=")
        if key.strip().lower() == "boundary" and value.strip().strip('"'):
            return value.strip().strip('"').encode("latin-1", "replace")
    raise BadRequestError("multipart/form-data without a boundary parameter")


def json_too_deep(body: bytes) -> bool:
    """Whether an array/object of the JSON text ``body`` nests deeper than
    :data:`MAX_JSON_DEPTH` (checked before parsing: ``json.loads`` recurses, and a
    thousand levels overflow the interpreter's stack). Cheap when few brackets: their
    count, inside strings too, bounds the depth."""
    opened = body.count(b"[") + body.count(b"{")
    return opened > MAX_JSON_DEPTH and _max_depth(body) > MAX_JSON_DEPTH


def _max_depth(body: bytes) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return depth
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


async def _read_json(
    request: Request, names: tuple[str, ...]
) -> tuple[dict[str, bytes], RequestFields]:
    body = await _read_body(request)
    if json_too_deep(body):
        raise BadRequestError(f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
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
    fields = RequestFields(doc)
    fields.typed = True
    return images, fields


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
    """``model`` from raw fields; errors become one ``invalid_argument`` naming the fields.

    Fields that came as JSON (:attr:`RequestFields.typed`) are validated strictly;
    validators see ``info.context["typed"]`` (e.g. a JSON-encoded string stands for a
    list only in multipart, where every field is text).
    """
    strict = isinstance(fields, RequestFields) and fields.typed
    try:
        return model.model_validate(dict(fields), strict=strict, context={"typed": strict})
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
