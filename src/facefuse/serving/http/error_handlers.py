"""Errors → HTTP: every error answer is JSON ``{"error": {"code", "message"}}``.

Typed :class:`~facefuse.errors.FacefuseError` s carry their own status and stable
code; FastAPI's validation errors become 422 ``invalid_argument``; Starlette's HTTP
errors keep their status with a code named for it; anything else is a 500
``internal_error`` whose details stay in the server log.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from facefuse.errors import FacefuseError
from facefuse.serving.http.inputs import describe_errors
from facefuse.serving.state import Services

__all__ = ["error_response", "install_error_handlers"]

_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 406: "not_acceptable", 413: "body_too_large",
               415: "unsupported_media_type", 429: "too_many_requests"}


def error_response(svc: Services | None, status: int, code: str, message: str) -> JSONResponse:
    """The JSON error body with the headers its status needs."""
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="facefuse"'
    if status == 503:
        headers["Retry-After"] = str(svc.settings.retry_after_s if svc else 1)
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


def _note_error(request: Request, code: str) -> None:
    request.scope.setdefault("state", {}).setdefault("log", {})["error"] = code


async def _facefuse_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FacefuseError)
    _note_error(request, exc.code)
    svc: Services | None = getattr(request.app.state, "services", None)
    return error_response(svc, exc.http_status, exc.code, exc.message)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    _note_error(request, "invalid_argument")
    return error_response(None, 422, "invalid_argument", describe_errors(exc.errors()))


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    _note_error(request, code)
    response = error_response(None, exc.status_code, code, str(exc.detail))
    for k, v in (exc.headers or {}).items():
        response.headers[k] = v
    return response


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    _note_error(request, "internal_error")
    return error_response(None, 500, "internal_error", "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error raised in a route as JSON with a stable code."""
    app.add_exception_handler(FacefuseError, _facefuse_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
