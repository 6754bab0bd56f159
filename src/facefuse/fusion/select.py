"""Face selection: which source face, which target faces, and whether they can be
fused. The one module both the library and the server select with.

Inputs are analysed faces, largest first (see :mod:`facefuse.faces.stages`);
nothing here runs a model. Errors are typed with codes that name the image
(``source_no_face``, ``target_face_too_small``, ``reference_required``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from facefuse.errors import (
    FaceIndexError,
    FaceProfileError,
    FaceTooSmallError,
    InvalidArgumentError,
    NoFaceError,
)
from facefuse.faces.types import Face
from facefuse.fusion.geometry import eye_distance, head_pose
from facefuse.fusion.quality import identity_similarity
from facefuse.fusion.types import FuseOptions

#: Faces whose outer eye corners are closer than this (pixels) are too small to fuse well.
MIN_EYE_DISTANCE_PX = 40.0
#: Faces turned further than this (degrees of yaw) are too far in profile.
MAX_ABS_YAW_DEG = 50.0


@dataclass(frozen=True)
class IdentityNeeds:
    """Which analyses need identity embeddings for a fusion request.

    The classic swapper works on geometry alone; embeddings are needed to report
    quality or similarity, to find the reference person, or to feed a neural swapper.
    """

    source: bool
    target: bool

    @classmethod
    def of(cls, options: FuseOptions, *, similarity: bool = False) -> IdentityNeeds:
        """The needs of ``options``; ``similarity``: the caller scores the output
        against the source."""
        reference = options.mode == "reference"
        return cls(
            source=options.evaluate or similarity or options.swapper != "classic",
            target=options.evaluate or reference,
        )


@dataclass(frozen=True)
class Selection:
    """The outcome of :func:`select`.

    Attributes:
        source_index: which source image the source face is from.
        source_face: the face whose identity is fused in.
        targets: indices into the target's faces (largest first) to fuse into.
        notes: human-readable remarks (several faces, several source images).
    """

    source_index: int
    source_face: Face
    targets: tuple[int, ...]
    notes: tuple[str, ...]


def frontalness(face: Face) -> float:
    """cos(yaw) of the face, 1 for frontal; 0 when the mesh is missing."""
    if face.landmarks is None:
        return 0.0
    return max(0.0, math.cos(math.radians(head_pose(face.landmarks)[0])))


def check_usable(face: Face, which: str) -> None:
    """Raise a typed error naming ``which`` image when the face cannot be fused well."""
    assert face.landmarks is not None
    d = eye_distance(face.landmarks)
    if d < MIN_EYE_DISTANCE_PX:
        raise FaceTooSmallError(
            f"the {which} face is too small to fuse: {d:.0f} px between the outer eye corners "
            f"(need at least {MIN_EYE_DISTANCE_PX:.0f})", code=f"{which}_face_too_small")
    yaw = head_pose(face.landmarks)[0]
    if abs(yaw) > MAX_ABS_YAW_DEG:
        raise FaceProfileError(
            f"the {which} face is too far in profile to fuse well (yaw {yaw:+.0f}°, "
            f"limit ±{MAX_ABS_YAW_DEG:.0f}°)", code=f"{which}_face_profile")


def pick_source(candidates: Sequence[Sequence[Face]]) -> tuple[int, Face, list[str]]:
    """Best source face over all source images (the largest face of each; then
    largest × most frontal). Returns (image index, face, notes)."""
    best: tuple[float, int, Face] | None = None
    notes: list[str] = []
    for i, faces in enumerate(candidates):
        if len(faces) > 1:
            notes.append(f"source image {i} has {len(faces)} faces; the largest is used")
        for f in faces[:1]:
            score = f.area * frontalness(f)
            if best is None or score > best[0]:
                best = (score, i, f)
    if best is None:
        raise NoFaceError("no face found in the source image", code="source_no_face")
    if len(candidates) > 1:
        notes.append(f"{len(candidates)} source images; used image {best[1]} "
                     "(largest, most frontal face)")
    return best[1], best[2], notes


def reference_face(options: FuseOptions, reference: Sequence[Face] | None) -> Face | None:
    """The person to replace in ``mode="reference"`` (the reference image's largest
    face); None in the other modes."""
    if options.mode != "reference":
        return None
    if reference is None:
        raise InvalidArgumentError("mode 'reference' needs a reference image with a face",
                                   code="reference_required")
    if not reference:
        raise NoFaceError("no face found in the reference image", code="reference_no_face")
    return reference[0]


def select_targets(faces: Sequence[Face], options: FuseOptions,
                   reference: Face | None) -> list[int]:
    """Indices (into ``faces``, largest first) of the target faces to fuse."""
    if not faces:
        raise NoFaceError("no face found in the target image", code="target_no_face")
    if options.mode == "many":
        return list(range(len(faces)))
    if options.mode == "reference":
        if reference is None or reference.embedding is None:
            raise InvalidArgumentError("mode 'reference' needs a reference image with a face",
                                       code="reference_required")
        sims = [identity_similarity(f, reference) for f in faces]
        return [int(np.argmax([-1.0 if s is None else s for s in sims]))]
    idx = options.target_face_index or 0
    if idx >= len(faces):
        raise FaceIndexError(f"target face index {idx} out of range: the target has "
                             f"{len(faces)} face(s)")
    return [idx]


def select(
    sources: Sequence[Sequence[Face]],
    targets: Sequence[Face],
    options: FuseOptions,
    reference: Sequence[Face] | None = None,
) -> Selection:
    """Choose and check the source face and the target faces of one request.

    Args:
        sources: the faces of each source image (largest first).
        targets: the faces of the target image (largest first).
        options: the fusion options (mode, target face index).
        reference: the faces of the reference image, if one was given.
    """
    index, source, notes = pick_source(sources)
    check_usable(source, "source")
    chosen = select_targets(targets, options, reference_face(options, reference))
    for i in chosen:
        check_usable(targets[i], "target")
    return Selection(index, source, tuple(chosen), tuple(notes))
