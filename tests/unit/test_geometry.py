"""Property tests for the fusion geometry (similarities, angles, polygons, fused shape)."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from facefuse.faces import topology as topo
from facefuse.faces.types import Face
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.geometry import (
    euler_angles,
    fit_similarity_3d,
    fused_shape,
    nearest_distance,
    openness,
    points_inside,
    relative_pose,
)


def rotation(yaw: float, pitch: float, roll: float) -> np.ndarray:
    """R = Rz(roll) · Ry(yaw) · Rx(pitch), degrees."""
    y, p, r = (math.radians(v) for v in (yaw, pitch, roll))
    rx = np.array([[1, 0, 0], [0, math.cos(p), -math.sin(p)], [0, math.sin(p), math.cos(p)]])
    ry = np.array([[math.cos(y), 0, math.sin(y)], [0, 1, 0], [-math.sin(y), 0, math.cos(y)]])
    rz = np.array([[math.cos(r), -math.sin(r), 0], [math.sin(r), math.cos(r), 0], [0, 0, 1]])
    rotation: np.ndarray = rz @ ry @ rx
    return rotation


angles = st.floats(-60, 60)


@settings(max_examples=60, deadline=None)
@given(yaw=angles, pitch=angles, roll=angles, scale=st.floats(0.2, 5.0),
       seed=st.integers(0, 2**31 - 1))
def test_similarity_fit_recovers_a_known_transform(yaw: float, pitch: float, roll: float,
                                                   scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    src = rng.normal(size=(40, 3)) * 50
    R = rotation(yaw, pitch, roll)
    t = rng.normal(size=3) * 100
    dst = scale * src @ R.T + t
    sim = fit_similarity_3d(src, dst)
    assert np.allclose(sim.apply(src), dst, atol=1e-6 * scale * 100)
    assert math.isclose(sim.scale, scale, rel_tol=1e-6)
    got = euler_angles(sim.R)
    assert np.allclose(got, (yaw, pitch, roll), atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(3, 12))
def test_points_inside_matches_opencv(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    # A star-shaped polygon (no self-intersections) and random points around it.
    ang = np.sort(rng.uniform(0, 2 * np.pi, n))
    rad = rng.uniform(20, 60, n)
    poly = np.c_[100 + rad * np.cos(ang), 100 + rad * np.sin(ang)]
    pts = rng.uniform(20, 180, (468, 2))
    lm = np.zeros((468, 3))
    lm[:, :2] = pts
    contour = tuple(range(n))
    lm[:n, :2] = poly
    got = set(points_inside(lm, contour))
    cv_poly = poly.astype(np.float32).reshape(-1, 1, 2)
    for i in range(n, 468):
        d = cv2.pointPolygonTest(cv_poly, (float(pts[i, 0]), float(pts[i, 1])), True)
        if abs(d) > 1e-3:  # points on an edge may go either way
            assert (i in got) == (d > 0), (i, d)


def test_fused_shape_endpoints_and_expression(analysed_faces: dict[str, Face]) -> None:
    src, tgt = analysed_faces["obama"].landmarks, analysed_faces["astronaut"].landmarks
    assert src is not None and tgt is not None
    assert np.array_equal(fused_shape(src, tgt, 0.0), tgt.astype(np.float64))
    full = fused_shape(src, tgt, 1.0)
    # Openness is similarity-invariant and the eye/lip regions move rigidly.
    for k, v in openness(tgt).items():
        assert math.isclose(openness(full)[k], v, abs_tol=1e-6), k
    # The outline stays where the target's is.
    assert np.allclose(full[list(topo.FACE_OVAL), :2], tgt[list(topo.FACE_OVAL), :2])
    # Pose (fitted on the stable points) stays the target's within a few degrees.
    assert max(abs(a) for a in relative_pose(tgt, full)) < 3.0


def test_relative_pose_of_a_rotated_mesh(analysed_faces: dict[str, Face]) -> None:
    mesh = analysed_faces["obama"].landmarks
    assert mesh is not None
    lm = mesh.astype(np.float64)
    c = lm.mean(0)
    turned = (lm - c) @ rotation(20, -10, 5).T + c
    assert np.allclose(relative_pose(lm, turned), (20, -10, 5), atol=1e-6)


@pytest.mark.parametrize("turn_deg", [90.0, 180.0, 270.0, 35.0])
def test_head_pose_yaw_and_pitch_do_not_depend_on_roll(
        analysed_faces: dict[str, Face], turn_deg: float) -> None:
    """The same mesh turned in the image plane (a photo upside down or on its side):
    the same yaw and pitch, the roll turned by as much."""
    from facefuse.fusion.geometry import head_pose

    for name in ("obama", "astronaut"):
        lm = np.asarray(analysed_faces[name].landmarks, np.float64)
        centre = lm[:, :2].mean(axis=0)
        a = np.radians(turn_deg)
        rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        turned = lm.copy()
        turned[:, :2] = (lm[:, :2] - centre) @ rot.T + centre
        (yaw, pitch, roll), (yaw_t, pitch_t, roll_t) = head_pose(lm), head_pose(turned)
        assert abs(yaw_t - yaw) < 1e-6 and abs(pitch_t - pitch) < 1e-6
        assert abs((roll_t - roll - turn_deg + 180) % 360 - 180) < 1e-6


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_of_a_target_fuses(
        fuser: FaceFuser, sample_paths: dict[str, Path], tmp_path: Path,
        orientation: int) -> None:
    """An upright photo tagged with each EXIF orientation decodes turned or mirrored:
    its face is found and fused in all eight, never refused as a profile."""
    from PIL import Image

    target = tmp_path / f"o{orientation}.jpg"
    with Image.open(sample_paths["astronaut"]) as im:
        exif = im.getexif()
        exif[0x0112] = orientation
        im.convert("RGB").save(target, quality=92, exif=exif)
    from facefuse.imaging.decode import decode_image

    result = fuser.fuse(sample_paths["obama"], target)
    assert result.image.shape == decode_image(target).shape


def test_nearest_distance_is_the_brute_force_one() -> None:
    """The matrix-product form agrees with every pairwise distance's minimum, on
    mesh-sized point sets at image coordinates and on coincident points."""
    rng = np.random.default_rng(7)
    points = rng.random((468, 3)) * 2000.0
    others = np.concatenate([rng.random((116, 3)) * 2000.0, points[:5]])
    brute = np.sqrt(((points[:, None, :2] - others[None, :, :2]) ** 2).sum(-1)).min(1)
    got = nearest_distance(points, others)
    assert np.allclose(got, brute, rtol=0, atol=1e-6)
    assert np.all(got[:5] < 1e-4)  # a point in both sets is at distance 0
