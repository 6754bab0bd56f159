"""Face mapping: which source face replaces which target face.

A mapping is a short list of pairs ``{source: image index (+ face index),
target: face index or rectangle}``. Target faces not named are left alone. The
same form is accepted by the library (``facefuse.fuse(..., mapping=...)``), the
CLI (``--map``) and the HTTP API (the ``mapping`` field)::

    [{"source": 0, "target": 1},    # source image 0's largest face → target face 1
     {"source": 1, "source_face": 0, "target": [40, 60, 180, 220]}]  # → the face there

Face indices count largest first, as :mod:`facefuse.faces.stages` orders them. A
rectangle ``[x0, y0, x1, y1]`` (target pixels) names the target face whose box
overlaps it most (intersection over union of at least :data:`MIN_RECT_IOU`, or
whose box centre lies inside it). Resolution is part of face selection and raises
:class:`~facefuse.errors.MappingError` with a code naming the problem. A pair whose
source or target face cannot be fused (too small, in profile, no landmarks: see
:func:`facefuse.fusion.select.usability_error`) is skipped and reported; only a
mapping none of whose pairs can be fused fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from facefuse.errors import FaceError, MappingError, NoFaceError
from facefuse.faces.types import Face
from facefuse.fusion.select import DetectPurposes, none_fusable, skipped_face, usability_error
from facefuse.fusion.types import MIN_EYE_DISTANCE_PX, FuseOptions, SkippedFace

#: Most pairs in one mapping (and source images in one request).
MAX_MAPPINGS = 6
#: A rectangle names a face when their intersection over union reaches this.
MIN_RECT_IOU = 0.3

Rect = tuple[float, float, float, float]


@dataclass(frozen=True)
class FacePair:
    """One mapping entry, before it is matched against the faces.

    Attributes:
        source: index of the source image.
        source_face: index of the face in that image (0 = largest).
        target: target face index (0 = largest), or None when ``rect`` names it.
        rect: ``(x0, y0, x1, y1)`` target pixels, or None when ``target`` names it.
    """

    source: int = 0
    source_face: int = 0
    target: int | None = 0
    rect: Rect | None = None

    def to_dict(self) -> dict[str, object]:
        return {"source": self.source, "source_face": self.source_face,
                "target": list(self.rect) if self.rect is not None else self.target}


@dataclass(frozen=True)
class MappedFace:
    """A resolved pair: the source image and face, and the target face index."""

    source_index: int
    source_face: Face
    target_index: int


def _index(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise MappingError(f"mapping: {what} must be an integer >= 0, not {value!r}",
                           code="mapping_invalid")
    return int(value)


def _rect(value: Sequence[object]) -> Rect:
    if len(value) != 4 or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v)
            for v in value):
        raise MappingError("mapping: a target rectangle is [x0, y0, x1, y1] in pixels",
                           code="mapping_invalid")
    x0, y0, x1, y1 = (float(v) for v in value)  # type: ignore[arg-type]
    if not (x1 > x0 and y1 > y0):
        raise MappingError("mapping: a target rectangle needs x1 > x0 and y1 > y0",
                           code="mapping_invalid")
    return x0, y0, x1, y1


def parse_pair(entry: FacePair | Mapping[str, Any]) -> FacePair:
    """One entry from a dict (``source``, optional ``source_face``, ``target``:
    index or ``[x0, y0, x1, y1]``); a :class:`FacePair` passes through."""
    if isinstance(entry, FacePair):
        return entry
    if not isinstance(entry, Mapping):
        raise MappingError("mapping: each entry is an object {source, target}",
                           code="mapping_invalid")
    unknown = set(entry) - {"source", "source_face", "target"}
    if unknown:
        raise MappingError(f"mapping: unknown key(s) {', '.join(sorted(map(str, unknown)))}",
                           code="mapping_invalid")
    if "target" not in entry:
        raise MappingError("mapping: each entry needs a target", code="mapping_invalid")
    source = _index(entry.get("source", 0), "source")
    source_face = _index(entry.get("source_face", 0), "source_face")
    target = entry["target"]
    if isinstance(target, list | tuple):
        return FacePair(source, source_face, None, _rect(target))
    return FacePair(source, source_face, _index(target, "target"), None)


def parse_mapping(entries: Sequence[FacePair | Mapping[str, Any]]) -> tuple[FacePair, ...]:
    """Validate the form of a mapping (not yet the faces); at most :data:`MAX_MAPPINGS`."""
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise MappingError("mapping must be a list of {source, target} objects",
                           code="mapping_invalid")
    if not entries:
        raise MappingError("mapping is empty", code="mapping_invalid")
    if len(entries) > MAX_MAPPINGS:
        raise MappingError(f"mapping has {len(entries)} entries; at most {MAX_MAPPINGS}",
                           code="mapping_too_many")
    return tuple(parse_pair(e) for e in entries)


def parse_cli_pair(text: str) -> FacePair:
    """``SRC[.FACE]=TARGET`` with TARGET a face index or ``x0,y0,x1,y1``
    (``0=1``, ``1.0=40,60,180,220``)."""
    left, sep, right = text.partition("=")
    try:
        if not sep:
            raise ValueError
        img, _, face = left.strip().partition(".")
        parts = [p for p in right.split(",") if p.strip()]
        target: object = ([float(p) for p in parts] if len(parts) > 1 else int(parts[0]))
        return parse_pair({"source": int(img), "source_face": int(face or 0), "target": target})
    except (ValueError, IndexError):
        raise MappingError(f"--map {text!r}: expected SRC[.FACE]=TARGET, TARGET a face index "
                           "or x0,y0,x1,y1", code="mapping_invalid") from None


def detect_purposes(options: FuseOptions, pairs: Sequence[FacePair] | None) -> DetectPurposes:
    """Which faces of each image a request with ``options`` and mapping ``pairs``
    (None or empty: no mapping) uses: what picks its detectors."""
    if not pairs:
        return DetectPurposes.of(options)
    return DetectPurposes.of(options, mapping=True,
                             source_faces=any(p.source_face > 0 for p in pairs))


def iou(a: np.ndarray | Sequence[float], b: np.ndarray | Sequence[float]) -> float:
    """Intersection over union of two ``(x0, y0, x1, y1)`` boxes."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


def face_in_rect(faces: Sequence[Face], rect: Rect) -> int:
    """Index of the face ``rect`` names: the best IoU at least :data:`MIN_RECT_IOU`,
    else the largest face whose box centre lies inside ``rect``."""
    best, best_iou = -1, MIN_RECT_IOU
    for i, f in enumerate(faces):
        score = iou(f.bbox, rect)
        if score >= best_iou:
            best, best_iou = i, score
    if best >= 0:
        return best
    for i, f in enumerate(faces):
        cx, cy = (f.bbox[0] + f.bbox[2]) / 2, (f.bbox[1] + f.bbox[3]) / 2
        if rect[0] <= cx <= rect[2] and rect[1] <= cy <= rect[3]:
            return i
    shown = ", ".join(f"{v:g}" for v in rect)
    raise MappingError(f"mapping: no target face in the rectangle [{shown}]",
                       code="mapping_rect_no_face")


def _source_faces(n: int, p: FacePair, sources: Sequence[Sequence[Face]]) -> Sequence[Face]:
    """The faces of pair ``n``'s source image, checked to hold its source face."""
    if p.source >= len(sources):
        raise MappingError(f"mapping[{n}]: source image {p.source} out of range "
                           f"({len(sources)} source image(s))",
                           code="mapping_source_out_of_range")
    faces = sources[p.source]
    if p.source_face >= len(faces):
        raise MappingError(f"mapping[{n}]: source image {p.source} has {len(faces)} "
                           f"face(s), no face {p.source_face}",
                           code="mapping_source_out_of_range")
    return faces


def _target_index(n: int, p: FacePair, targets: Sequence[Face]) -> int:
    """The target face pair ``n`` names, by index or rectangle."""
    if p.rect is not None:
        return face_in_rect(targets, p.rect)
    assert p.target is not None
    if p.target >= len(targets):
        raise MappingError(f"mapping[{n}]: target face {p.target} out of range (the target "
                           f"has {len(targets)} face(s))", code="mapping_target_out_of_range")
    return p.target


def resolve(
    pairs: Sequence[FacePair],
    sources: Sequence[Sequence[Face]],
    targets: Sequence[Face],
    min_eye_distance: float = MIN_EYE_DISTANCE_PX,
) -> tuple[list[MappedFace], list[SkippedFace]]:
    """Match a parsed mapping against analysed faces and check each chosen face.

    Args:
        pairs: from :func:`parse_mapping`.
        sources: the faces of each source image (largest first).
        targets: the faces of the target image (largest first).
        min_eye_distance: the smallest usable face (pixels between the outer eye corners).

    Returns:
        The pairs to fuse, and the target faces skipped because their pair's source
        or target face cannot be fused (reason ``source_face_too_small``, ...).

    Raises:
        MappingError: an index out of range, a rectangle without a face, a target twice.
        NoFaceError / FaceTooSmallError / FaceProfileError: no pair can be fused (the
            first pair's reason).
    """
    if not targets:
        raise NoFaceError("no face found in the target image", code="target_no_face")
    out: list[MappedFace] = []
    skipped: list[SkippedFace] = []
    first: FaceError | None = None
    seen: dict[int, int] = {}
    for n, p in enumerate(pairs):
        faces = _source_faces(n, p, sources)
        t = _target_index(n, p, targets)
        if t in seen:
            raise MappingError(f"mapping[{n}] and mapping[{seen[t]}] both replace target "
                               f"face {t}", code="mapping_duplicate_target")
        seen[t] = n
        err = (usability_error(faces[p.source_face], "source", min_eye_distance)
               or usability_error(targets[t], "target", min_eye_distance))
        if err is None:
            out.append(MappedFace(p.source, faces[p.source_face], t))
        else:
            first = first or err
            skipped.append(skipped_face(t, targets[t], err))
    if not out and first is not None:
        raise none_fusable(first, len(pairs))
    return out, skipped
