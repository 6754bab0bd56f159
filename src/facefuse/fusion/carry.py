"""What a target face in a clip keeps from one frame to the next.

Some of what the render finds on a target face moves with the face and changes
slowly: its glasses and facial hair (the regions kept on top of the fused face)
and its iris colour. A clip finds them on one frame (:class:`Carried`) and
carries them to the next few, moved with the face by the least-squares
similarity that takes the mesh of the frame they were found on to the mesh of
the frame rendered. What moves on its own — a hand, hair falling across — is
still found on every frame. A face that turned or changed expression (the
similarity fits its mesh badly), or changed size, is looked at again
(:meth:`Carried.fits`).

Besides the cost, a carried region does not flicker: found again on every frame,
a beard's edge or a thin frame comes and goes by a pixel or two.

The frames a :class:`Carried` serves also share one triangulation of the fused
mesh (:meth:`Carried.triangles_for`): the one of the frame it was found on,
used on each frame's fused mesh while every triangle keeps its orientation
there (a mesh that folded over is triangulated on its own). It depends on the
frame it was found on alone, so frames rendered at once get the same clip as
frames rendered in turn. The source-side work that depends on the triangles
(its lighting on the mesh, its side-to-side tone) is then found in the source's
memo instead of being done again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import cv2
import numpy as np

from facefuse.faces.align import similarity_transform
from facefuse.faces.landmarker import MESH_POINTS
from facefuse.fusion.geometry import eye_distance
from facefuse.imaging.warp import MIN_AREA2, doubled_areas

__all__ = ["MAX_RESIDUAL", "MAX_SCALE_CHANGE", "Carried", "IrisReading"]

#: A face whose mesh the similarity fits worse than this (root-mean-square, in eye
#: distances) has turned or changed expression: its regions are found again.
MAX_RESIDUAL = 0.02
#: ... as is a face whose size changed by more than this share.
MAX_SCALE_CHANGE = 0.1


class IrisReading(NamedTuple):
    """A face's eye colours, as the classic swapper reads them
    (:func:`facefuse.fusion.swappers.classic.eyes.iris_colour`): medians (3,) of its
    irises, of the skin under its eyes (the image's float type, float64 for uint8)
    and of its eye whites (float64; None where too few of those show). A squint
    may leave lid skin among the whites' pixels:
    :data:`facefuse.fusion.swappers.classic.eyes.LIGHT_COLOUR_RANGE` bounds what
    that can do."""

    iris: np.ndarray
    skin: np.ndarray
    sclera: np.ndarray | None


@dataclass(frozen=True)
class Carried:
    """A target face's slowly changing findings on one frame.

    Attributes:
        mask: (h, w) float32 in [0, 1], the regions kept on top that move with the
            face (glasses) over ``box`` at ``scale``, or None (none asked).
        box: (x0, y0, x1, y1) image pixels the mask covers.
        ratio: (x, y) mask pixels per image pixel (pixel centres aligned, as the
            working renders resize).
        points: (468, 2) float64 image pixels, the face's mesh when found (the
            similarity is fitted to its dense points).
        iris: the face's iris, under-eye and eye-white colours
            (:func:`facefuse.fusion.swappers.classic.eyes.iris_colour`), or None.
        cut: the face's neighbourhood reached past the image's edge when found (a
            face entering the frame): what lay beyond was not seen, so the next
            frame looks again.
        triangles: (T, 3) a triangulation of the fused mesh on the frame found
            (see :meth:`triangles_for`), or None.
        hair: (h, w) float32 in [0, 1], the face's facial hair (laid over the fused
            face) on the same grid as ``mask``, or None (none asked or found).
        work_eye_px: the eye distance (pixels) the frames it serves are rendered at
            when their face is larger (a live session's, lower than a clip's), or
            None: the swapper's own for a clip's frames.
    """

    mask: np.ndarray | None
    box: tuple[int, int, int, int]
    ratio: tuple[float, float]
    points: np.ndarray
    iris: IrisReading | None
    cut: bool = False
    triangles: np.ndarray | None = None
    hair: np.ndarray | None = None
    work_eye_px: float | None = None

    def triangles_for(self, points: np.ndarray,
                      triangulate: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """(T, 3) triangles for the fused mesh ``points`` (468, 2) of a frame served:
        :attr:`triangles` while every one keeps a positive area on ``points`` (no
        fold; :func:`facefuse.imaging.warp.delaunay`'s orientation), else
        ``triangulate(points)``."""
        if self.triangles is not None and len(self.triangles) and _oriented(
                points, self.triangles):
            return self.triangles
        return triangulate(points)

    def to(self, landmarks: np.ndarray) -> np.ndarray:
        """(2, 3) similarity from the found mesh to ``landmarks`` (N ≥ 468, 2+) image
        pixels."""
        return similarity_transform(self.points,
                                    np.asarray(landmarks, np.float64)[:MESH_POINTS, :2])

    def fits(self, landmarks: np.ndarray) -> bool:
        """Whether the findings still hold for the face at ``landmarks`` (image
        pixels): they were not :attr:`cut` by the image's edge, the similarity fits
        its mesh within :data:`MAX_RESIDUAL` eye distances and its scale is within
        :data:`MAX_SCALE_CHANGE` of 1."""
        if self.cut:
            return False
        lm = np.asarray(landmarks, np.float64)
        m = self.to(lm)
        moved = self.points @ m[:, :2].T + m[:, 2]
        rms = float(np.sqrt(np.mean(np.sum((moved - lm[:MESH_POINTS, :2]) ** 2, axis=1))))
        scale = float(np.sqrt(abs(np.linalg.det(m[:, :2]))))
        return (rms <= MAX_RESIDUAL * max(1.0, eye_distance(lm))
                and abs(scale - 1.0) <= MAX_SCALE_CHANGE)

    def mask_onto(self, landmarks: np.ndarray, origin: tuple[float, float],
                  ratio: tuple[float, float], size: tuple[int, int]) -> np.ndarray | None:
        """The carried mask moved with the face to ``landmarks`` (image pixels), in a
        working frame: the image crop at ``origin`` (x, y) resized by ``ratio`` (x,
        y) to ``size`` (w, h); (h, w) float32, or None without a mask."""
        return self._onto(self.mask, landmarks, origin, ratio, size)

    def hair_onto(self, landmarks: np.ndarray, origin: tuple[float, float],
                  ratio: tuple[float, float], size: tuple[int, int]) -> np.ndarray | None:
        """The carried facial hair moved with the face, as :meth:`mask_onto` moves
        the mask; None without it."""
        return self._onto(self.hair, landmarks, origin, ratio, size)

    def _onto(self, mask: np.ndarray | None, landmarks: np.ndarray,
              origin: tuple[float, float], ratio: tuple[float, float],
              size: tuple[int, int]) -> np.ndarray | None:
        if mask is None:
            return None
        # mask pixel → image pixel (found) → image pixel (now) → working pixel, each
        # with pixel centres aligned: x_small = (x + 0.5)·s − 0.5.
        back = _pixel_scale(1.0 / self.ratio[0], 1.0 / self.ratio[1], self.box[0],
                            self.box[1])
        move = np.vstack([self.to(landmarks), (0.0, 0.0, 1.0)])
        ox, oy = origin
        into = _pixel_scale(ratio[0], ratio[1], -ox * ratio[0], -oy * ratio[1])
        m = (into @ move @ back)[:2]
        out: np.ndarray = cv2.warpAffine(mask, m, size, flags=cv2.INTER_LINEAR,
                                         borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
        return out


def _oriented(points: np.ndarray, tris: np.ndarray) -> bool:
    """Whether every triangle ``tris`` (T, 3) keeps, on ``points`` (N, 2), the
    orientation :func:`facefuse.imaging.warp.delaunay` gives, and more than the
    warp's smallest area."""
    return bool((doubled_areas(points, tris) > MIN_AREA2).all())


def _pixel_scale(sx: float, sy: float, tx: float, ty: float) -> np.ndarray:
    """(3, 3) ``x → (x + 0.5)·s − 0.5 + t`` per axis (t in the output's pixels)."""
    return np.array([[sx, 0.0, 0.5 * sx - 0.5 + tx],
                     [0.0, sy, 0.5 * sy - 0.5 + ty],
                     [0.0, 0.0, 1.0]])
