"""Which parts of the face the source photo shows, seen from the target's pose.

The face mesh is triangulated once in the target (or fused) geometry; each
triangle is then looked at in the source:

* **folded**: its winding is reversed in the source image, i.e. it faces away
  from the camera there (the far cheek of a turned head): the source shows
  another part of the face, or none, at those pixels;
* **foreshortened**: its projected area over its surface area (the cosine of its
  tilt to the camera) is much smaller in the source than in the target: the
  source holds a few pixels stretched over a large target area.

:func:`source_visibility` gives that per triangle and :func:`visible_fraction`
the share of the target face the source shows well (``visible_fraction`` in the
quality figures). The fusion's symmetric fill (:mod:`facefuse.fusion.swappers.classic.symmetry`)
scores triangles the same way, as a continuous weight, and takes what the source
hides from the mirrored other half of its face.
"""

from __future__ import annotations

import numpy as np

from facefuse.faces.landmarker import MESH_POINTS
from facefuse.imaging.warp import delaunay

#: In the quality figure: a triangle counts as well shown when its foreshortening
#: in the source is at least this share of the target's.
WELL_SHOWN = 0.5


def _areas(points: np.ndarray, tris: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Signed projected (image) areas and unsigned surface areas (T,) of ``tris``."""
    a, b, c = points[tris[:, 0]], points[tris[:, 1]], points[tris[:, 2]]
    u, v = b - a, c - a
    signed = 0.5 * (u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0])
    surface = 0.5 * np.linalg.norm(np.cross(u, v), axis=1)
    return signed, surface


def source_visibility(source_pts: np.ndarray, target_pts: np.ndarray, tris: np.ndarray,
                      min_ratio: float) -> tuple[np.ndarray, np.ndarray]:
    """Per triangle: whether the source shows it (not folded, foreshortening at least
    ``min_ratio`` of the target's), and its image area in the target.

    Args:
        source_pts, target_pts: (N, 3) mesh points in pixels (x, y and the
            landmarker's z), each in its own image's frame.
        tris: (T, 3) vertex indices, as triangulated in the target.
    Returns:
        ``(shown (T,) bool, target area (T,) float64 pixels²)``.
    """
    src = np.asarray(source_pts, np.float64)
    tgt = np.asarray(target_pts, np.float64)
    t_signed, t_surface = _areas(tgt, tris)
    s_signed, s_surface = _areas(src, tris)
    cos_t = np.abs(t_signed) / np.maximum(t_surface, 1e-9)
    cos_s = np.abs(s_signed) / np.maximum(s_surface, 1e-9)
    shown = (np.sign(s_signed) == np.sign(t_signed)) & (cos_s >= min_ratio * cos_t)
    return shown, np.abs(t_signed)


def visible_fraction(source_lm: np.ndarray, target_lm: np.ndarray) -> float:
    """Share (0..1) of the target face's image area that the source shows well: the
    468 mesh points triangulated in the target, a triangle counted when
    :func:`source_visibility` at :data:`WELL_SHOWN` keeps it. Landmarks (478, 3)."""
    tgt = np.asarray(target_lm[:MESH_POINTS], np.float64)
    tris = delaunay(tgt[:, :2])
    shown, area = source_visibility(source_lm[:MESH_POINTS], tgt, tris, WELL_SHOWN)
    total = float(area.sum())
    return float(area[shown].sum() / total) if total > 0 else 0.0
