"""The synthetic detection sets: their face boxes and maps say where the faces really are."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.config import Settings
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.detection_sets import (
    EDGE_CUTS,
    SAMPLE_FACES,
    Case,
    apply,
    detection_cases,
    fetch_face_free,
    map_box,
    match,
    turn_map,
)


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_turn_map_follows_np_rot90(k: int) -> None:
    img = np.zeros((5, 7), np.uint8)
    img[1, 4] = 1
    yy, xx = np.argwhere(np.rot90(img, k) == 1)[0]
    np.testing.assert_allclose(apply(turn_map(k, 7, 5), np.array([4.5, 1.5])), [xx + 0.5, yy + 0.5])


@pytest.fixture(scope="module")
def cases(settings: Settings, sample_images: dict[str, np.ndarray]) -> list[Case]:
    free = {n: decode_image(p) for n, p in
            fetch_face_free(settings.home / "face-free", settings.downloads_dir).items()}
    return detection_cases(sample_images, free)


def test_every_placed_face_shows_the_photo_pixels_it_claims(
    cases: list[Case], sample_images: dict[str, np.ndarray]
) -> None:
    """The pixel at the mapped face centre matches the photo's (blurred) colour there."""
    checked = 0
    for c in cases:
        for src, m, box in zip(c.sources, c.maps, c.faces, strict=True):
            np.testing.assert_allclose(
                map_box(m, np.array(SAMPLE_FACES[src])).clip(0, None)[:2], box[:2], atol=1e-6)
            face = np.array(SAMPLE_FACES[src])
            centre = (face[:2] + face[2:]) / 2
            x, y = apply(m, centre)
            h, w = c.image.shape[:2]
            if not (0 <= x < w and 0 <= y < h):
                continue
            photo = sample_images[src]
            scale = np.sqrt(abs(np.linalg.det(m[:, :2])))
            r = max(2, int(6 / max(scale, 1e-3)))
            want = photo[int(centre[1]) - r : int(centre[1]) + r,
                         int(centre[0]) - r : int(centre[0]) + r].reshape(-1, 3).mean(0)
            rr = max(1, int(r * scale))
            got = c.image[int(y) - rr : int(y) + rr + 1,
                          int(x) - rr : int(x) + rr + 1].reshape(-1, 3).mean(0)
            assert np.abs(got - want).max() < 30, c.name
            checked += 1
    assert checked > 90


def test_edge_cases_cut_the_face_by_the_stated_fraction(cases: list[Case]) -> None:
    for c in (c for c in cases if c.kind == "edge"):
        full = map_box(c.maps[0], np.array(SAMPLE_FACES[c.sources[0]]))
        side, cut = c.name.split("-")[1], float(c.name.split("-")[2])
        assert cut in EDGE_CUTS
        axis = 0 if side in ("left", "right") else 1
        kept = (c.faces[0][axis + 2] - c.faces[0][axis]) / (full[axis + 2] - full[axis])
        assert abs(kept - (1 - cut)) < 0.02, c.name


def test_match_counts_found_faces_and_false_positives() -> None:
    truth = np.array([[0, 0, 10, 10], [20, 20, 40, 40]], float)
    found = np.array([[1, 1, 11, 9], [100, 100, 110, 110], [19, 22, 41, 39]], float)
    assert match(found, truth) == (2, 1)
    assert match(np.zeros((0, 4)), truth) == (0, 0)
    # A box around two faces contains both their centres, but neither face its centre.
    apart = np.array([[0, 0, 10, 10], [50, 50, 60, 60]], float)
    assert match(np.array([[0, 0, 60, 60]], float), apart) == (0, 1)
