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
    FaceError,
    FaceIndexError,
    FaceProfileError,
    FaceTooSmallError,
    InvalidArgumentError,
    NoFaceError,
)
from facefuse.faces.detectors import Purpose
from facefuse.faces.types import Face
from facefuse.fusion.geometry import eye_distance, head_pose
from facefuse.fusion.quality import identity_similarity
from facefuse.fusion.types import MIN_EYE_DISTANCE_PX, FuseOptions, SkippedFace

__all__ = ["MAX_ABS_YAW_DEG", "MIN_EYE_DISTANCE_PX", "IdentityNeeds", "Selection",
           "check_reference", "check_usable", "none_fusable", "pick_source", "reference_face",
           "select", "select_targets", "skipped_face", "split_usable", "usability_error"]

#: Faces turned further than this (degrees of yaw) are too far in profile.
MAX_ABS_YAW_DEG = 50.0


@dataclass(frozen=True)
class IdentityNeeds:
    """Which analyses need identity embeddings for a fusion request.

    A swapper declares whether it renders from the source's embedding
    (:attr:`~facefuse.fusion.swappers.base.Swapper.needs_source_embedding`: a
    neural one does, the classic one works on geometry alone); embeddings are
    needed besides to report quality or similarity, or to find the reference person.
    """

    source: bool
    target: bool

    @classmethod
    def of(cls, options: FuseOptions, *, similarity: bool = False,
           mapping: bool = False, source_embedding: bool = False) -> IdentityNeeds:
        """The needs of ``options``; ``similarity``: the caller scores the output
        against the source; ``mapping``: the request has one (its target faces are
        named, not found by identity: embedded only to evaluate);
        ``source_embedding``: the swapper renders from the source's embedding."""
        reference = options.mode == "reference" and not mapping
        return cls(
            source=options.evaluate or similarity or source_embedding,
            target=options.evaluate or reference,
        )


@dataclass(frozen=True)
class DetectPurposes:
    """Which faces of each image of a fusion request are used, so which detector
    analyses it (:func:`facefuse.faces.detectors.detector_for`).

    Only the largest face is used of a source (the largest, most frontal across the
    source images), of a reference photo and of the target in ``one`` mode. Every
    face may be used of the target in ``many`` and ``reference`` mode (the person
    to replace may be any of them), of a target whose face is chosen by index, of
    a mapping's target, and of its sources when a pair names a source face other
    than the largest: indices count the faces a listing (``/v1/faces``,
    ``facefuse analyse``) shows, so they must come from the same detector.
    """

    source: Purpose
    target: Purpose
    reference: Purpose = "largest"

    @classmethod
    def of(cls, options: FuseOptions, *, mapping: bool = False,
           source_faces: bool = False) -> DetectPurposes:
        """The purposes of a request with ``options``; ``mapping``: it has one,
        ``source_faces``: the mapping names a source face other than the largest
        (see :func:`facefuse.fusion.mapping.detect_purposes`)."""
        if mapping:
            return cls(source="all" if source_faces else "largest", target="all")
        every = options.mode != "one" or options.target_face_index is not None
        return cls(source="largest", target="all" if every else "largest")


@dataclass(frozen=True)
class Selection:
    """The outcome of :func:`select`.

    Attributes:
        source_index: which source image the source face is from.
        source_face: the face whose identity is fused in.
        targets: indices into the target's faces (largest first) to fuse into.
        notes: human-readable remarks (several faces, several source images).
        skipped: chosen target faces that cannot be fused (``many`` mode only).
    """

    source_index: int
    source_face: Face
    targets: tuple[int, ...]
    notes: tuple[str, ...]
    skipped: tuple[SkippedFace, ...] = ()


def frontalness(face: Face) -> float:
    """cos(yaw) of the face, 1 for frontal; 0 when the mesh is missing."""
    if face.landmarks is None:
        return 0.0
    return max(0.0, math.cos(math.radians(head_pose(face.landmarks)[0])))


def usability_error(face: Face, which: str,
                    min_eye_distance: float = MIN_EYE_DISTANCE_PX) -> FaceError | None:
    """The typed error (code naming ``which`` image) that makes ``face`` unusable:
    no mesh, fewer than ``min_eye_distance`` pixels between the outer eye corners, or
    turned past :data:`MAX_ABS_YAW_DEG`; None when it can be fused."""
    if face.landmarks is None:
        return FaceError(f"the {which} face's landmarks could not be found",
                         code=f"{which}_face_landmarks_failed")
    d = eye_distance(face.landmarks)
    if d < min_eye_distance:
        return FaceTooSmallError(
            f"the {which} face is too small to fuse: {d:.0f} px between the outer eye corners "
            f"(need at least {min_eye_distance:.0f})", code=f"{which}_face_too_small")
    yaw = head_pose(face.landmarks)[0]
    if abs(yaw) > MAX_ABS_YAW_DEG:
        return FaceProfileError(
            f"the {which} face is too far in profile to fuse well (yaw {yaw:+.0f}°, "
            f"limit ±{MAX_ABS_YAW_DEG:.0f}°)", code=f"{which}_face_profile")
    return None


def check_usable(face: Face, which: str,
                 min_eye_distance: float = MIN_EYE_DISTANCE_PX) -> None:
    """Raise :func:`usability_error`'s error when the face cannot be fused well."""
    err = usability_error(face, which, min_eye_distance)
    if err is not None:
        raise err


def skipped_face(index: int, face: Face, err: FaceError) -> SkippedFace:
    """The report of target face ``index`` left out because of ``err``."""
    x0, y0, x1, y1 = (float(v) for v in face.bbox[:4])
    return SkippedFace(index, (x0, y0, x1, y1), err.code, err.message)


def split_usable(faces: Sequence[Face], chosen: Sequence[int],
                 min_eye_distance: float = MIN_EYE_DISTANCE_PX,
                 ) -> tuple[list[int], list[SkippedFace]]:
    """``chosen`` target faces split into those that can be fused and those skipped.

    Raises the largest chosen face's error (its own class and code, the message
    saying none could be fused) when no chosen face is usable.
    """
    usable: list[int] = []
    skipped: list[SkippedFace] = []
    first: FaceError | None = None
    for i in chosen:
        err = usability_error(faces[i], "target", min_eye_distance)
        if err is None:
            usable.append(i)
            continue
        first = first or err
        skipped.append(skipped_face(i, faces[i], err))
    if not usable and first is not None:
        raise none_fusable(first, len(chosen))
    return usable, skipped


def none_fusable(first: FaceError, count: int) -> FaceError:
    """The error of a request none of whose ``count`` chosen faces can be fused:
    the first one's class and code, saying so."""
    return type(first)(f"none of the {count} chosen face(s) can be fused; the first: "
                       f"{first.message}", code=first.code)


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


def check_reference(mode: str, reference: bool, mapping: bool) -> None:
    """What a reference image goes with: it picks the person to replace in mode
    ``reference``, where it is needed unless a mapping names the faces itself.

    Args:
        mode: the fusion mode. reference: a reference image was given. mapping: a
            face mapping was given.

    Raises:
        InvalidArgumentError: ``options_conflict`` for a reference with another mode
            or with a mapping (it would be ignored); ``reference_required`` for mode
            ``reference`` with neither a reference nor a mapping.
    """
    if reference and (mode != "reference" or mapping):
        raise InvalidArgumentError(
            "a reference image picks the face to replace in mode 'reference'; "
            + ("a mapping names the faces itself" if mapping
               else f"mode {mode!r} would ignore it"), code="options_conflict")
    if mode == "reference" and not reference and not mapping:
        raise InvalidArgumentError("mode 'reference' needs a 'reference' image",
                                   code="reference_required")


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
        options: the fusion options (mode, target face index, smallest face).
        reference: the faces of the reference image, if one was given.
    """
    index, source, notes = pick_source(sources)
    check_usable(source, "source", options.min_face_size)
    chosen = select_targets(targets, options, reference_face(options, reference))
    if options.mode == "many":
        usable, skipped = split_usable(targets, chosen, options.min_face_size)
        return Selection(index, source, tuple(usable), tuple(notes), tuple(skipped))
    for i in chosen:
        check_usable(targets[i], "target", options.min_face_size)
    return Selection(index, source, tuple(chosen), tuple(notes))
