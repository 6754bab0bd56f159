"""The Face record and detector output types.

Coordinates are image pixels, x to the right and y down, in the frame of the
decoded (EXIF-uprighted) RGB image that was analysed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Mesh indices of the five points that match dlib's 5-point layout:
#: image-right eye outer, image-right eye inner, image-left eye outer,
#: image-left eye inner, nose base.
MESH_FIVE_POINTS: tuple[int, int, int, int, int] = (263, 362, 33, 133, 2)


@dataclass(frozen=True)
class Detection:
    """One BlazeFace detection.

    ``bbox`` (4,) float32 ``x0, y0, x1, y1`` in pixels; ``keypoints`` (6, 2)
    float32 in pixels, in BlazeFace order: subject's right eye, left eye, nose
    tip, mouth centre, right ear tragion, left ear tragion (the subject's right
    eye is on the image's left).
    """

    bbox: np.ndarray
    score: float
    keypoints: np.ndarray

    @property
    def width(self) -> float:
        return float(self.bbox[2] - self.bbox[0])

    @property
    def height(self) -> float:
        return float(self.bbox[3] - self.bbox[1])


@dataclass(frozen=True)
class Face:
    """An analysed face: immutable, arrays read-only (caches share it between
    requests; derive changed copies with :func:`dataclasses.replace`).

    Attributes:
        bbox: (4,) float32 ``x0, y0, x1, y1`` pixels (detector box).
        score: detector confidence in [0, 1].
        keypoints: (K, 2) float32 detector keypoints in pixels: BlazeFace's 6 (see
            :class:`Detection`) or YuNet's 5 (see :mod:`facefuse.faces.yunet`).
        landmarks: (478, 3) float32 refined mesh (468 face + 10 iris) in pixels;
            z is relative depth in the same pixel scale (smaller = closer).
        landmarks5: (5, 2) float32 — the :data:`MESH_FIVE_POINTS` of the mesh.
        chip_transform: (2, 3) float64 affine mapping image pixels to the
            150×150 dlib recognition chip.
        embedding: (128,) float32 unit-norm identity vector (cosine similarity).
        embedding_raw: (128,) float32 dlib's raw vector (Euclidean threshold 0.6).
        mesh_score: face-presence probability from the mesh model.
        age: estimated age in years, when attributes are on.
        gender: ``"female"`` / ``"male"`` when attributes are on; gender_score its probability.
    """

    bbox: np.ndarray
    score: float
    keypoints: np.ndarray
    landmarks: np.ndarray | None = None
    landmarks5: np.ndarray | None = None
    chip_transform: np.ndarray | None = None
    embedding: np.ndarray | None = None
    embedding_raw: np.ndarray | None = None
    mesh_score: float | None = None
    age: float | None = None
    gender: str | None = None
    gender_score: float | None = None

    def __post_init__(self) -> None:
        for value in vars(self).values():
            if isinstance(value, np.ndarray):
                value.setflags(write=False)

    @property
    def width(self) -> float:
        return float(self.bbox[2] - self.bbox[0])

    @property
    def height(self) -> float:
        return float(self.bbox[3] - self.bbox[1])

    @property
    def area(self) -> float:
        return self.width * self.height

    def to_dict(self, *, landmarks: bool = False) -> dict[str, object]:
        """JSON-ready dict (lists of floats). Mesh landmarks only on request."""
        d: dict[str, object] = {
            "bbox": [round(float(v), 2) for v in self.bbox],
            "score": round(float(self.score), 4),
            "keypoints": np.round(self.keypoints, 2).tolist(),
        }
        if self.landmarks5 is not None:
            d["landmarks5"] = np.round(self.landmarks5, 2).tolist()
        if landmarks and self.landmarks is not None:
            d["landmarks"] = np.round(self.landmarks, 2).tolist()
        if self.age is not None:
            d["age"] = round(float(self.age), 1)
        if self.gender is not None:
            d["gender"] = self.gender
            d["gender_score"] = round(float(self.gender_score or 0.0), 4)
        return d
