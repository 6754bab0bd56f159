"""Synthetic turned heads: the landmarker finds the face turned, the far background stays."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.types import Face
from facefuse.fusion.geometry import head_pose
from facefuse.toolchain.turned import RING_SCALE, turn_head


@pytest.mark.parametrize("deg", [-35.0, 35.0])
def test_a_turned_head_is_found_turned_by_about_that_much(
        analyser: FaceAnalyser, sample_images: dict[str, np.ndarray],
        analysed_faces: dict[str, Face], deg: float) -> None:
    face = analysed_faces["obama"]
    assert face.landmarks is not None
    image = sample_images["obama"]
    turned = turn_head(image, face.landmarks, deg)
    faces = analyser.analyse(turned, embed=False)
    assert faces and faces[0].landmarks is not None
    before, after = head_pose(face.landmarks)[0], head_pose(faces[0].landmarks)[0]
    # The landmarker reads a large share of the mesh's rotation, opposite in sign
    # for opposite turns.
    assert 0.4 * abs(deg) < abs(after - before) < 1.3 * abs(deg), (before, after)
    assert np.sign(after - before) == -np.sign(deg)
    # Beyond the anchor ring nothing moves.
    lm = face.landmarks[:, :2]
    lo, hi = lm.min(0), lm.max(0)
    centre, half = (lo + hi) / 2, (hi - lo) / 2 * RING_SCALE
    ys, xs = np.mgrid[0:image.shape[0], 0:image.shape[1]]
    far = ((xs - centre[0]) / half[0]) ** 2 + ((ys - centre[1]) / half[1]) ** 2 > 1.05
    assert np.array_equal(turned[far], image[far])
    assert not np.array_equal(turned, image)
