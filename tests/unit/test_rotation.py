"""Quarter turns: detections in a turned image map back to the original exactly."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.faces.rotation import (
    rotate_image,
    turned_detection,
    unrotate_detection,
    unrotate_points,
)
from facefuse.faces.types import Detection


@pytest.mark.parametrize("k", [0, 1, 2, 3])
@pytest.mark.parametrize(("w", "h"), [(7, 5), (4, 9)])
def test_every_pixel_maps_back_to_where_it_came_from(k: int, w: int, h: int) -> None:
    ids = np.arange(w * h).reshape(h, w, 1)
    turned = rotate_image(ids, k)
    ys, xs = np.mgrid[0 : turned.shape[0], 0 : turned.shape[1]]
    centres = np.stack([xs.ravel() + 0.5, ys.ravel() + 0.5], axis=1)
    back = unrotate_points(centres, k, w, h)
    expect = turned[..., 0].ravel()
    got = ids[(back[:, 1] - 0.5).astype(int), (back[:, 0] - 0.5).astype(int), 0]
    np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_detection_maps_back_to_the_same_box_and_keypoints(k: int) -> None:
    w, h = 40, 30
    det = Detection(bbox=np.array([5, 6, 15, 20], np.float32), score=0.9,
                    keypoints=np.array([[8, 10], [12, 10], [10, 14]], np.float32))
    # Where the detection lies in the turned image: apply the inverse map k times over.
    corners = np.array([[5, 6], [15, 20]], np.float64)
    kps = det.keypoints.astype(np.float64)
    tw, th = w, h
    for _ in range(k):
        corners = np.stack([corners[:, 1], tw - corners[:, 0]], axis=1)
        kps = np.stack([kps[:, 1], tw - kps[:, 0]], axis=1)
        tw, th = th, tw
    lo, hi = corners.min(0), corners.max(0)
    in_turned = Detection(bbox=np.array([*lo, *hi], np.float32), score=0.9,
                          keypoints=kps.astype(np.float32))
    back = unrotate_detection(in_turned, k, w, h)
    np.testing.assert_allclose(back.bbox, det.bbox, atol=1e-5)
    np.testing.assert_allclose(back.keypoints, det.keypoints, atol=1e-5)


def test_turned_detection_turns_keypoints_about_the_box_centre() -> None:
    det = Detection(bbox=np.array([0, 0, 20, 20], np.float32), score=0.9,
                    keypoints=np.array([[5, 8], [15, 8]], np.float32))
    half = turned_detection(det, 2)
    np.testing.assert_allclose(half.keypoints, [[15, 12], [5, 12]], atol=1e-5)
    quarter = turned_detection(det, 1)  # eye line now vertical
    assert abs(quarter.keypoints[0, 0] - quarter.keypoints[1, 0]) < 1e-5
    full = turned_detection(turned_detection(quarter, 1), 2)
    np.testing.assert_allclose(full.keypoints, det.keypoints, atol=1e-4)
    np.testing.assert_array_equal(full.bbox, det.bbox)
