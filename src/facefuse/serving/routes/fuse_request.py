"""The fusion part of a request, shared by ``/v1/fuse`` and ``/v1/templates/{id}/fuse``.

Images: ``source`` and optionally ``source_1`` … ``source_5`` (without a mapping:
photos of one person, the best face is used; with a mapping: indexed 0 … 5), an
optional ``reference``, and ``target`` where the route takes one. Options:
:class:`~facefuse.serving.routes.schemas.FuseParams`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from facefuse.errors import InvalidArgumentError, MappingError
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.mapping import MAX_MAPPINGS, FacePair, parse_mapping
from facefuse.fusion.select import check_reference
from facefuse.fusion.swappers import SwapperInfo
from facefuse.fusion.types import FuseOptions
from facefuse.serving.cache.keys import sha256_hex
from facefuse.serving.http.inputs import read_request, validate_params
from facefuse.serving.routes.schemas import FuseParams

__all__ = ["SOURCE_FIELDS", "FuseRequest", "numbered_sources", "read_fuse_request",
           "request_mapping"]

#: The source image fields, in mapping index order.
SOURCE_FIELDS: tuple[str, ...] = ("source", *(f"source_{i}" for i in range(1, MAX_MAPPINGS)))


@dataclass(frozen=True)
class FuseRequest:
    """A validated fusion request: images, options and the mapping."""

    sources: list[bytes]
    target: bytes | None
    reference: bytes | None
    params: FuseParams
    #: With ``swapper`` the name of the one that renders (the default when not named).
    options: FuseOptions
    mapping: tuple[FacePair, ...] | None
    #: What renders it: its name and the versions of its models are in the result key.
    swapper: SwapperInfo

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
        opts["swapper"] = {"name": self.swapper.name, "models": dict(self.swapper.models)}
        opts["output"] = output
        opts["reference"] = sha256_hex(self.reference) if self.reference is not None else None
        opts["sources"] = [sha256_hex(s) for s in self.sources[1:]]
        return opts


async def read_fuse_request(request: Request, fuser: FaceFuser, *,
                            target: bool = True) -> FuseRequest:
    """Read and validate a fusion request (``target``: the route takes a target image)
    against the swappers ``fuser`` has (``unknown_swapper``)."""
    required = ("source", "target") if target else ("source",)
    images, fields = await read_request(request, required, (*SOURCE_FIELDS[1:], "reference"))
    params = validate_params(FuseParams, fields)
    options = fuser.resolve(params.options())
    sources = numbered_sources(images)
    mapping = request_mapping(params.mapping, len(sources))
    reference = images.get("reference")
    check_reference(options.mode, reference is not None, mapping is not None)
    return FuseRequest(sources, images.get("target"), reference, params, options, mapping,
                       fuser.swapper_info(options.swapper))


def numbered_sources(images: Mapping[str, bytes]) -> list[bytes]:
    """``source``, ``source_1``, … of a request's images, in mapping index order.

    Raises:
        InvalidArgumentError: a source numbered after a gap (``source_2`` without
            ``source_1``).
    """
    sources = [images["source"]]
    for name in SOURCE_FIELDS[1:]:
        if name in images:
            if len(sources) != SOURCE_FIELDS.index(name):
                raise InvalidArgumentError(f"{name!r} given without {SOURCE_FIELDS[len(sources)]!r}"
                                           " (source images are numbered without gaps)")
            sources.append(images[name])
    return sources


def request_mapping(raw: Sequence[Any] | None, sources: int) -> tuple[FacePair, ...] | None:
    """A request's mapping, checked in what it says before any face is seen: its form,
    each source image it names among the ``sources`` sent, no target face named twice
    in the same words (one index, or one rectangle, twice). The codes are those the
    fusion gives the same fault once the faces are known.

    Raises:
        MappingError: ``mapping_invalid``, ``mapping_too_many``,
            ``mapping_source_out_of_range``, ``mapping_duplicate_target``.
    """
    if raw is None:
        return None
    pairs = parse_mapping(raw)
    seen: dict[object, int] = {}
    for n, p in enumerate(pairs):
        if p.source >= sources:
            raise MappingError(f"mapping[{n}]: source image {p.source} out of range "
                               f"({sources} source image(s))",
                               code="mapping_source_out_of_range")
        target = p.rect if p.rect is not None else p.target
        if target in seen:
            raise MappingError(f"mapping[{n}] and mapping[{seen[target]}] both replace "
                               f"target face {target}", code="mapping_duplicate_target")
        seen[target] = n
    return pairs
