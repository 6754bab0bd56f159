"""What the source shows from the target's pose: folded and edge-on triangles of the
mesh (real meshes of the sample photos, turned in yaw)."""

from __future__ import annotations

import numpy as np
import pytest
from face_poses import turn_yaw

from facefuse.faces.landmarker import MESH_POINTS
from facefuse.faces.types import Face
from facefuse.fusion.visibility import WELL_SHOWN, source_visibility, visible_fraction
from facefuse.imaging.warp import delaunay


def _mesh(face: Face) -> np.ndarray:
    assert face.landmarks is not None
    return face.landmarks[:MESH_POINTS].astype(np.float64)


def test_the_same_pose_shows_everything(analysed_faces: dict[str, Face]) -> None:
    pts = _mesh(analysed_faces["obama"])
    tris = delaunay(pts[:, :2])
    shown, area = source_visibility(pts, pts, tris, WELL_SHOWN)
    assert shown.all() and (area > 0).all()
    assert visible_fraction(pts, pts) == 1.0


def _hidden_share_right(source: np.ndarray, target: np.ndarray) -> tuple[float, float]:
    """(hidden share of the target face's area, share of it right of the nose tip)."""
    tris = delaunay(target[:, :2])
    shown, area = source_visibility(source, target, tris, WELL_SHOWN)
    centres = target[tris[~shown], :2].mean(axis=1)
    right = float(area[~shown][centres[:, 0] > target[1, 0]].sum() / area[~shown].sum())
    return float(area[~shown].sum() / area.sum()), right


@pytest.mark.parametrize("deg", [35, -35])
def test_a_turned_source_hides_the_far_side(analysed_faces: dict[str, Face], deg: float) -> None:
    face = analysed_faces["obama"]
    target = _mesh(face)
    hidden, right = _hidden_share_right(_mesh(turn_yaw(face, deg)), target)
    assert 0.05 < hidden < 0.4
    assert right > 0.8 or right < 0.2, right  # on one side of the nose
    _, mirrored = _hidden_share_right(_mesh(turn_yaw(face, -deg)), target)
    assert (mirrored > 0.5) != (right > 0.5)  # the other turn hides the other side
    assert abs(visible_fraction(_mesh(turn_yaw(face, deg)), target) - (1 - hidden)) < 1e-9
