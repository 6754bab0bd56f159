"""Request options and response bodies of the HTTP API (pydantic models).

The option models validate the non-file fields of a request, whichever way it came
(multipart form fields are strings, JSON values are typed); unknown fields are
refused so a typo (``degre=50``) is an error, not a silently ignored option.
The response models only document the API (OpenAPI); handlers build plain dicts.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator

from facefuse.fusion.types import FuseOptions, declared
from facefuse.serving.http.inputs import MAX_JSON_DEPTH, json_too_deep
from facefuse.video.options import VideoOptions

__all__ = [
    "EmbedParams",
    "ErrorBody",
    "FacesParams",
    "FuseOptionParams",
    "FuseParams",
    "Params",
    "VerifyParams",
    "VideoParams",
    "image_request_body",
]


class Params(BaseModel):
    """The base of every option model: unknown fields refused, values frozen, no NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _option_fields(options: type) -> dict[str, Any]:
    """The pydantic fields of every option of ``options`` (:class:`FuseOptions`,
    :class:`VideoOptions`) offered over HTTP, made from its declaration (type, default,
    range, description)."""
    out: dict[str, Any] = {}
    for f, spec, hint in declared(options):
        if spec.http:
            for kind in {type(old) for old, _ in spec.legacy}:  # old spellings still taken
                hint = hint | kind
            out[f.name] = (hint, Field(
                f.default, ge=spec.low, le=spec.high, description=spec.help))
    return out


if TYPE_CHECKING:
    FuseOptionParams = Params
else:
    FuseOptionParams = create_model("FuseOptionParams", __base__=Params,
                                    **_option_fields(FuseOptions))


# The fusion options (declared once, on FuseOptions), then the output and the mapping.
class FuseParams(FuseOptionParams):
    """Options of ``POST /v1/fuse``."""

    format: Literal["jpeg", "png", "webp"] = Field("jpeg", description="Output format.")
    quality: int = Field(92, ge=1, le=100, description="JPEG / WebP quality.")
    similarity: bool = Field(False, description="Measure the output's identity and report its "
                             "similarity to the source (X-Facefuse-Identity-Similarity). Off "
                             "by default: it runs the recogniser on the source and the output "
                             "(about a quarter of a plain fusion's server time).")
    mapping: list[dict[str, Any]] | None = Field(
        None, description="Face mapping (overrides mode): a JSON list of up to 6 "
        '`{"source": image index (0 = `source`, n = `source_n`), "source_face": face index '
        '(default 0 = largest), "target": face index or [x0, y0, x1, y1] pixels}`; target '
        "faces not named are left alone. In multipart, a JSON string.")

    def options(self) -> FuseOptions:
        """The fusion options these parameters give."""
        return FuseOptions(**{name: getattr(self, name) for name in FuseOptionParams.model_fields})

    @field_validator("mapping", mode="before")
    @classmethod
    def _mapping_json(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, str) and (info.context or {}).get("typed"):
            raise ValueError("mapping must be a JSON list (a string only in multipart)")
        if isinstance(v, str):
            if json_too_deep(v.encode("utf-8", "replace")):
                raise ValueError(f"mapping nests deeper than {MAX_JSON_DEPTH} levels")
            try:
                return json.loads(v)
            except (ValueError, RecursionError):
                raise ValueError("mapping must be JSON") from None
        return v

    @field_validator("format", mode="before")
    @classmethod
    def _format_alias(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip().lower()
            return "jpeg" if v == "jpg" else v
        return v


# A clip's options (declared once, on VideoOptions) besides those of a fusion.
if TYPE_CHECKING:
    VideoParams = FuseParams
else:
    VideoParams = create_model("VideoParams", __base__=FuseParams,
                               **_option_fields(VideoOptions))


class FacesParams(Params):
    """Options of ``POST /v1/faces``."""

    landmarks: bool = Field(False, description="Include the 478-point mesh of each face.")
    attributes: bool = Field(False, description="Estimate age and gender.")


class EmbedParams(Params):
    """``POST /v1/embed`` takes no options."""


class VerifyParams(Params):
    """``POST /v1/verify`` takes no options."""


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. `no_face`.")
    message: str = Field(description="Human-readable explanation.")


class ErrorBody(BaseModel):
    """Every error answer: ``{"error": {"code", "message"}}``."""

    error: ErrorDetail


def image_request_body(
    files: dict[str, str], params: type[BaseModel], required: tuple[str, ...]
) -> dict[str, Any]:
    """The ``openapi_extra`` of a route taking image files + option fields.

    Documents both encodings: ``multipart/form-data`` (files as binary parts) and
    ``application/json`` (files as base64 strings).
    """
    opts = params.model_json_schema()
    props = dict(opts.get("properties", {}))
    multipart: dict[str, Any] = {
        "type": "object",
        "required": list(required),
        "properties": {
            **{n: {"type": "string", "format": "binary", "description": d}
               for n, d in files.items()},
            **props,
        },
    }
    json_body: dict[str, Any] = {
        "type": "object",
        "required": list(required),
        "properties": {
            **{n: {"type": "string", "format": "byte", "description": d + " (base64)"}
               for n, d in files.items()},
            **props,
        },
        "additionalProperties": False,
    }
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {"schema": multipart},
                "application/json": {"schema": json_body},
            },
        }
    }
