"""Faces turned in yaw by rotating their mesh about its centre (for pose checks)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from facefuse.faces.types import Face


def turn_yaw(face: Face, degrees: float) -> Face:
    """A copy of ``face`` whose 478-point mesh is rotated ``degrees`` about the
    vertical axis through its centroid (the box and other fields unchanged)."""
    assert face.landmarks is not None
    lm = face.landmarks.astype(np.float64)
    centre = lm.mean(0)
    a = math.radians(degrees)
    rot = np.array([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]])
    return replace(face, landmarks=((lm - centre) @ rot.T + centre).astype(np.float32))
