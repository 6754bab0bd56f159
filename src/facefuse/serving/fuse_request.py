"""The fusion part of a request, shared by ``/v1/fuse`` and ``/v1/templates/{id}/fuse``.

Images: ``source`` and optionally ``source_1`` … ``source_5`` (without a mapping:
photos of one person, the best face is used; with a mapping: indexed 0 … 5), an
optional ``reference``, and ``target`` where the route takes one. Options:
:class:`~facefuse.serving.schemas.FuseParams`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from facefuse.errors import InvalidArgumentError
from facefuse.fusion.mapping import MAX_MAPPINGS, FacePair, parse_mapping
from facefuse.fusion.types import FuseOptions
from facefuse.serving.cache.keys import sha256_hex
from facefuse.serving.inputs import read_request, validate_params
from facefuse.serving.schemas import FuseParams

__all__ = ["SOURCE_FIELDS", "FuseRequest", "read_fuse_request"]

#: The source image fields, in mapping index order.
SOURCE_FIELDS: tuple[str, ...] = ("source", *(f"source_{i}" for i in range(1, MAX_MAPPINGS)))


@dataclass(frozen=True)
class FuseRequest:
    """A validated fusion request: images, options and the mapping."""

    sources: list[bytes]
    target: bytes | None
    reference: bytes | None
    params: FuseParams
    options: FuseOptions
    mapping: tuple[FacePair, ...] | None

    def decoded_images(self, target: bytes) -> list[bytes]:
        """Every image a fusion of this request into ``target`` decodes (what
        admission reserves memory for): the sources, the target, and the reference
        when ``mode=reference`` uses it."""
        images = [*self.sources, target]
        if self.reference is not None and self.options.mode == "reference":
            images.append(self.reference)
        return images

    def key_options(self, output: dict[str, Any]) -> dict[str, Any]:
        """Everything besides the first source and the target that decides the result
        (for the L2 key); ``output``: the output policy (label, provenance, signing)."""
        opts = self.params.model_dump()
        opts["output"] = output
        opts["reference"] = sha256_hex(self.reference) if self.reference is not None else None
        opts["sources"] = [sha256_hex(s) for s in self.sources[1:]]
        return opts


async def read_fuse_request(request: Request, *, target: bool = True) -> FuseRequest:
    """Read and validate a fusion request (``target``: the route takes a target image)."""
    required = ("source", "target") if target else ("source",)
    images, fields = await read_request(request, required, (*SOURCE_FIELDS[1:], "reference"))
    params = validate_params(FuseParams, fields)
    options = params.options()
    sources = [images["source"]]
    for name in SOURCE_FIELDS[1:]:
        if name in images:
            if len(sources) != SOURCE_FIELDS.index(name):
                raise InvalidArgumentError(f"{name!r} given without {SOURCE_FIELDS[len(sources)]!r}"
                                           " (source images are numbered without gaps)")
            sources.append(images[name])
    mapping = parse_mapping(params.mapping) if params.mapping is not None else None
    reference = images.get("reference")
    if options.mode == "reference" and reference is None and mapping is None:
        raise InvalidArgumentError("mode 'reference' needs a 'reference' image",
                                   code="reference_required")
    return FuseRequest(sources, images.get("target"), reference, params, options, mapping)
