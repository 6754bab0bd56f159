"""Synthetic turned heads: a photo's face region re-drawn as if the head had turned.

The sample photos turn at most about 13°; pairs 30–45° apart need more. This
module makes them, clearly synthetic, from a real photo and its mesh:

1. the 468 mesh points (x, y in pixels, the landmarker's z scaled like x) are
   rotated about the vertical axis through their centroid by the given yaw;
2. a ring of fixed anchors around the face (an ellipse 1.7 times the mesh's
   extent) keeps the far background in place;
3. the photo is warped piecewise-affinely from the original to the rotated
   points (triangulated in the original), the triangles drawn far to near so
   the near side covers what turned away.

The far cheek is squeezed and the near one stretched from real pixels; hair and
background between the face and the anchors are stretched too. The result is
analysed again like any photo, so its pose is what the landmarker finds.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from facefuse.faces.landmarker import MESH_POINTS
from facefuse.imaging.warp import delaunay, piecewise_affine_map

#: Anchor ring: semi-axes as multiples of the mesh's half-extent, and its points.
RING_SCALE = 1.7
RING_POINTS = 24


def rotate_yaw(points: np.ndarray, degrees: float) -> np.ndarray:
    """(N, 3) points rotated ``degrees`` about the vertical axis through their centroid
    (positive: the face's image-right side moves away from the camera)."""
    p = np.asarray(points, np.float64)
    c = p.mean(0)
    a = math.radians(degrees)
    rot = np.array([[math.cos(a), 0.0, math.sin(a)], [0.0, 1.0, 0.0],
                    [-math.sin(a), 0.0, math.cos(a)]])
    out: np.ndarray = (p - c) @ rot.T + c
    return out


def turn_head(image: np.ndarray, landmarks: np.ndarray, degrees: float) -> np.ndarray:
    """(H, W, 3) uint8: ``image`` with the face of ``landmarks`` (≥ 468, 3) turned by
    ``degrees`` of yaw (see the module doc); pixels beyond the anchor ring unchanged."""
    src = np.asarray(landmarks[:MESH_POINTS], np.float64)
    dst = rotate_yaw(src, degrees)
    lo, hi = src[:, :2].min(0), src[:, :2].max(0)
    centre, half = (lo + hi) / 2.0, (hi - lo) / 2.0 * RING_SCALE
    t = np.linspace(0.0, 2.0 * math.pi, RING_POINTS, endpoint=False)
    ring = centre + np.stack([np.cos(t), np.sin(t)], 1) * half
    src2 = np.vstack([src[:, :2], ring])
    dst2 = np.vstack([dst[:, :2], ring])
    tris = delaunay(src2)
    # Far triangles first: the rasteriser lets the later (nearer) one win.
    z = np.concatenate([dst[:, 2], np.full(RING_POINTS, dst[:, 2].max())])
    tris = tris[np.argsort(-z[tris].mean(1), kind="stable")]
    h, w = image.shape[:2]
    mx, my, valid = piecewise_affine_map(src2, dst2, tris, (0, 0, w, h))
    warped = cv2.remap(image, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    out = image.copy()
    out[valid] = warped[valid]
    return out
