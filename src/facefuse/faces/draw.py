"""Draw analysed faces for people to look at (boxes, keypoints, mesh)."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from facefuse.faces.types import Face


def draw_faces(rgb: np.ndarray, faces: Sequence[Face]) -> np.ndarray:
    """A copy of ``rgb`` (H, W, 3 uint8) with each face's box (green), mesh
    points (cyan), iris points (magenta) and detector keypoints (red)."""
    out = np.ascontiguousarray(rgb.copy())
    scale = max(1, round(max(rgb.shape[:2]) / 800))
    for i, f in enumerate(faces):
        x0, y0, x1, y1 = (round(float(v)) for v in f.bbox)
        cv2.rectangle(out, (x0, y0), (x1, y1), (0, 220, 0), 2 * scale)
        label = f"{i}: {f.score:.2f}"
        if f.age is not None and f.gender is not None:
            label += f" {f.gender[0].upper()} {f.age:.0f}"
        cv2.putText(out, label, (x0, max(12, y0 - 6)), cv2.FONT_HERSHEY_SIMPLEX,
                    0.5 * scale, (0, 220, 0), scale, cv2.LINE_AA)
        if f.landmarks is not None:
            for j, (x, y) in enumerate(f.landmarks[:, :2]):
                colour = (255, 0, 255) if j >= 468 else (0, 200, 255)
                cv2.circle(out, (round(float(x)), round(float(y))), scale, colour, -1)
        for x, y in f.keypoints:
            cv2.circle(out, (round(float(x)), round(float(y))), 3 * scale, (255, 0, 0), -1)
    return out
