"""Fusion options and results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from facefuse.errors import InvalidArgumentError
from facefuse.faces.types import Face

BlendMode = Literal["multiband", "poisson", "alpha"]
TargetMode = Literal["one", "many", "reference"]

#: Default smallest usable face: pixels between the outer eye corners.
MIN_EYE_DISTANCE_PX = 40.0
#: The range a caller may set ``min_face_size`` in (pixels between the outer eye corners).
MIN_FACE_SIZE_RANGE = (16.0, 1024.0)


@dataclass(frozen=True)
class FuseOptions:
    """How to fuse.

    ``degree`` 0..100: 0 returns the target unchanged, 100 the full source
    identity. ``shape`` and ``texture`` (0..100, default = degree) refine it:
    how far the geometry and the skin texture move toward the source.

    The mask parts (classic swapper; all on by default, see docs/fusion.md):
    ``relight`` relights the source face with the target's lighting (spherical
    harmonics on the mesh normals) before the tone transfer;
    ``reject_source_occluders`` shows the target's own pixels where the source's
    face is covered (hair, glasses, hands, a beard, background);
    ``keep_target_occluders`` keeps whatever covers the target's face on top of
    the fused face; ``symmetric_fill`` takes what the source photo hides or
    foreshortens (a turned head's far side) from the mirrored other half of the
    source face, or the target's own pixels where neither half is shown.

    ``min_face_size`` (pixels between the outer eye corners, 16..1024, default 40):
    smaller faces (source or target) are not used. In ``many`` mode and with a
    mapping such a target face is skipped and reported (:class:`SkippedFace`); in
    ``one`` and ``reference`` mode it is an error.
    """

    degree: float = 100.0
    shape: float | None = None
    texture: float | None = None
    mode: TargetMode = "one"
    target_face_index: int | None = None
    blend: BlendMode = "multiband"
    swapper: str = "classic"
    evaluate: bool = True
    relight: bool = True
    reject_source_occluders: bool = True
    keep_target_occluders: bool = True
    symmetric_fill: bool = True
    min_face_size: float = MIN_EYE_DISTANCE_PX

    def __post_init__(self) -> None:
        for name in ("degree", "shape", "texture"):
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 100:
                raise InvalidArgumentError(f"{name} must be a number in 0..100, not {v!r}",
                                           code=f"invalid_{name}")
        if self.mode not in ("one", "many", "reference"):
            raise InvalidArgumentError(f"mode must be one|many|reference, not {self.mode!r}",
                                       code="invalid_mode")
        if self.blend not in ("multiband", "poisson", "alpha"):
            raise InvalidArgumentError(f"blend must be multiband|poisson|alpha, not {self.blend!r}",
                                       code="invalid_blend")
        for name in ("relight", "reject_source_occluders", "keep_target_occluders",
                     "symmetric_fill"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"{name} must be true or false",
                                           code=f"invalid_{name}")
        lo, hi = MIN_FACE_SIZE_RANGE
        v = self.min_face_size
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise InvalidArgumentError(
                f"min_face_size must be a number of pixels in {lo:g}..{hi:g}, not {v!r}",
                code="invalid_min_face_size")
        if self.target_face_index is not None and self.target_face_index < 0:
            raise InvalidArgumentError("target_face_index must be >= 0",
                                       code="invalid_target_face_index")

    @property
    def shape_weight(self) -> float:
        return (self.degree if self.shape is None else self.shape) / 100.0

    @property
    def texture_weight(self) -> float:
        return (self.degree if self.texture is None else self.texture) / 100.0


@dataclass(frozen=True)
class SkippedFace:
    """A target face that was chosen (``many`` mode, a mapping) but not fused.

    Attributes:
        target_index: the face's index in the target (0 = largest).
        box: its box ``(x0, y0, x1, y1)`` in target pixels.
        reason: the stable code of the error it would have raised
            (``target_face_too_small``, ``target_face_profile``, ...).
        message: the same, for people.
    """

    target_index: int
    box: tuple[float, float, float, float]
    reason: str
    message: str

    def to_dict(self, *, message: bool = True) -> dict[str, object]:
        """``{"index", "box" (whole pixels), "reason"[, "message"]}``."""
        d: dict[str, object] = {"index": self.target_index,
                                "box": [round(v) for v in self.box], "reason": self.reason}
        if message:
            d["message"] = self.message
        return d


@dataclass
class FusedFace:
    """One target face that was fused: where, with which mask, and its quality."""

    target_index: int
    target_face: Face
    region: tuple[int, int, int, int]
    mask: np.ndarray  # (h, w) float32 blend mask over region
    quality: dict[str, float] = field(default_factory=dict)
    #: Which source image the fused identity came from (face mapping).
    source_index: int = 0
    #: (N, 3) the mesh the face was rendered with, target-image pixels (None when
    #: nothing was rendered): the output's face geometry without re-analysing it.
    landmarks: np.ndarray | None = None
    #: Share (0..1) of the face's pixels whose colour came from beyond the source's
    #: face outline (measured when evaluating; the swapper may not report it).
    outside_source: float | None = None


@dataclass
class FusionResult:
    """The fused image (RGB uint8, the target's size) and how it was made."""

    image: np.ndarray
    source_face: Face
    fused: list[FusedFace]
    timings_ms: dict[str, float]
    notes: list[str] = field(default_factory=list)
    #: Chosen target faces that could not be fused, and why.
    skipped: list[SkippedFace] = field(default_factory=list)

    @property
    def quality(self) -> dict[str, float]:
        """Quality of the first fused face (see :func:`facefuse.fusion.quality.evaluate`)."""
        return self.fused[0].quality if self.fused else {}

    def report(self) -> dict[str, object]:
        """A JSON-ready summary: fused faces, skipped faces, timings, quality, notes."""
        return {
            "source_face": self.source_face.to_dict(),
            "fused_faces": [
                {"target_index": f.target_index, "source_index": f.source_index,
                 "target_face": f.target_face.to_dict(),
                 "region": list(f.region),
                 "quality": {k: round(float(v), 4) for k, v in f.quality.items()}}
                for f in self.fused
            ],
            "skipped_faces": [s.to_dict() for s in self.skipped],
            "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items()},
            "notes": self.notes,
        }
