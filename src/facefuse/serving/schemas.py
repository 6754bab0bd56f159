"""Request options and response bodies of the HTTP API (pydantic models).

The option models validate the non-file fields of a request, whichever way it came
(multipart form fields are strings, JSON values are typed); unknown fields are
refused so a typo (``degre=50``) is an error, not a silently ignored option.
The response models only document the API (OpenAPI); handlers build plain dicts.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from facefuse.fusion.types import MIN_EYE_DISTANCE_PX, MIN_FACE_SIZE_RANGE

__all__ = [
    "EmbedParams",
    "ErrorBody",
    "FacesParams",
    "FuseParams",
    "VerifyParams",
    "image_request_body",
]


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FuseParams(_Params):
    """Options of ``POST /v1/fuse``."""

    degree: float = Field(100.0, ge=0, le=100, description="0 returns the target unchanged, "
                          "100 the full source identity.")
    shape: float | None = Field(None, ge=0, le=100,
                                description="Geometry weight (default: degree).")
    texture: float | None = Field(None, ge=0, le=100,
                                  description="Skin texture weight (default: degree).")
    mode: Literal["one", "many", "reference"] = Field(
        "one", description="one: the face at target_face_index (largest first); many: every "
        "face; reference: the target face most like the `reference` image's face.")
    target_face_index: int | None = Field(None, ge=0, description="Face to replace in mode one "
                                          "(0 = largest).")
    blend: Literal["multiband", "poisson", "alpha"] = "multiband"
    min_face_size: float = Field(
        MIN_EYE_DISTANCE_PX, ge=MIN_FACE_SIZE_RANGE[0], le=MIN_FACE_SIZE_RANGE[1],
        description="Smallest face used, source or target (pixels between the outer eye "
        "corners). In mode "
        "many and with a mapping, smaller faces (and faces in profile or without "
        "landmarks) are skipped and listed in the X-Facefuse-Skipped-Faces header; the "
        "request fails only when no face can be fused.")
    relight: bool = Field(True, description="Relight the source face with the target's "
                          "lighting (spherical harmonics on the face mesh).")
    reject_source_occluders: bool = Field(True, description="Show the target's own pixels "
                                          "where something covers the source's face (hair, "
                                          "glasses, a hand, a beard).")
    keep_target_occluders: bool = Field(True, description="Keep whatever covers the target's "
                                        "face (glasses, a hand, hair, a beard) on top.")
    symmetric_fill: bool = Field(True, description="Where the source photo hides or squeezes "
                                 "part of the face the target shows (a turned head), take it "
                                 "from the mirrored other half of the source face.")
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

    @field_validator("mapping", mode="before")
    @classmethod
    def _mapping_json(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, str) and (info.context or {}).get("typed"):
            raise ValueError("mapping must be a JSON list (a string only in multipart)")
        if isinstance(v, str):
            try:
                return json.loads(v)
            except ValueError:
                raise ValueError("mapping must be JSON") from None
        return v

    @field_validator("format", mode="before")
    @classmethod
    def _format_alias(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = v.strip().lower()
            return "jpeg" if v == "jpg" else v
        return v


class FacesParams(_Params):
    """Options of ``POST /v1/faces``."""

    landmarks: bool = Field(False, description="Include the 478-point mesh of each face.")
    attributes: bool = Field(False, description="Estimate age and gender.")


class EmbedParams(_Params):
    """``POST /v1/embed`` takes no options."""


class VerifyParams(_Params):
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
