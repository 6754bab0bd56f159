"""Faces cut by the image frame: found by the every-face detector, meshed and fused,
no duplicates. Real photos and models (the reproducible edge sets of
``facefuse.toolchain.detection_sets``)."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.borders import confident, cut_by_frame, fragments
from facefuse.faces.yunet import YuNetDetector
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import decode_image
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.detection_sets import (
    Case,
    corner_cases,
    fetch_face_free,
    frame_cut_cases,
    pairs,
)

#: Corner groups where asking a cut face the whole-face score misses a corner face.
HARD_CORNERS = ("corners-1920x1080-face90-cut0.35", "corners-1920x1080-face50-cut0.20")


@pytest.fixture(scope="module")
def corners(settings: Settings, sample_images: dict[str, np.ndarray]) -> dict[str, Case]:
    paths = fetch_face_free(settings.home / "face-free", settings.downloads_dir)
    free = {n: decode_image(p) for n, p in paths.items()}
    return {c.name: c for c in corner_cases(sample_images, free)}


@pytest.fixture(scope="module")
def cuts(sample_images: dict[str, np.ndarray]) -> dict[str, Case]:
    return {c.name: c for c in frame_cut_cases(sample_images)}


@pytest.fixture(scope="module")
def yunet(registry: ModelRegistry) -> YuNetDetector:
    return YuNetDetector(registry.get("yunet"), score_threshold=0.8)


def _boxes(det: YuNetDetector, img: np.ndarray) -> np.ndarray:
    return np.array([d.bbox for d in det.detect(img)], np.float64).reshape(-1, 4)


def _no_duplicates(boxes: np.ndarray) -> bool:
    """No box lies by a fifth of its area or more inside another."""
    for i, a in enumerate(boxes):
        for j, b in enumerate(boxes):
            if i == j:
                continue
            iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
            ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
            if iw * ih >= 0.2 * (a[2] - a[0]) * (a[3] - a[1]):
                return False
    return True


def test_corner_faces_are_found_that_the_whole_face_score_misses(
    yunet: YuNetDetector, corners: dict[str, Case]
) -> None:
    strict = YuNetDetector(yunet.model, score_threshold=0.8, edge_score_threshold=0.8)
    for name in HARD_CORNERS:
        case = corners[name]
        found = _boxes(yunet, case.image)
        matched = pairs(found, case.faces)
        assert len(matched) == len(case.faces) == len(found), name  # all, no false one
        assert _no_duplicates(found), name
        before = {j for _, j in pairs(_boxes(strict, case.image), case.faces)}
        assert not {0, 1, 2, 3} <= before, name  # the premise: a corner face was missed


def test_every_corner_and_cut_face_is_found_once(
    yunet: YuNetDetector, corners: dict[str, Case], cuts: dict[str, Case]
) -> None:
    """Corner faces cut by up to a fifth on both axes, large faces with up to 40 %
    outside one edge: each found, no false or duplicate box (a piece of the face
    at the edge, like the brow of a face cut at the top, is not a second face)."""
    cases = [c for n, c in corners.items() if not n.endswith("0.35")]
    cases += [c for n, c in cuts.items() if n.startswith(("obama2-", "biden-"))]
    for case in cases:
        found = _boxes(yunet, case.image)
        assert len(pairs(found, case.faces)) == len(case.faces) == len(found), case.name
        assert _no_duplicates(found), case.name


def test_a_large_face_cut_by_the_frame_is_meshed_and_fused(
    analyser: FaceAnalyser, fuser: FaceFuser, sample_images: dict[str, np.ndarray],
    cuts: dict[str, Case],
) -> None:
    for name in ("obama-span1.3-left-0.40", "biden-span1.3-bottom-0.30"):
        case = cuts[name]
        img = case.image
        faces = analyser.analyse(img, purpose="all")
        assert len(faces) == 1, name
        lm = faces[0].landmarks
        assert lm is not None and np.all(np.isfinite(lm))
        # The mesh follows the face out of the frame: some points lie outside it.
        h, w = img.shape[:2]
        outside = (lm[:, 0] < 0) | (lm[:, 0] > w) | (lm[:, 1] < 0) | (lm[:, 1] > h)
        assert 0.05 < outside.mean() < 0.6, name
        result = fuser.fuse(sample_images["astronaut"], img,
                            FuseOptions(mode="many", evaluate=False))
        assert len(result.fused) == 1 and not result.skipped, name
        x0, y0, x1, y1 = (int(v) for v in case.faces[0])
        inside = result.image[y0:y1, x0:x1].astype(np.int16) - img[y0:y1, x0:x1]
        assert np.abs(inside).mean() > 3.0, name  # the face changed
        assert result.image.shape == img.shape


def test_cut_by_frame_and_fragments_on_known_boxes() -> None:
    boxes = np.array([
        [-10, 20, 40, 80],    # past the left edge, centre inside
        [10, 20, 40, 80],     # inside
        [-60, 20, 40, 80],    # centre outside: more than half unseen
        [70, 60, 120, 110],   # past the right and bottom edges
    ], float)
    assert cut_by_frame(boxes, 100, 100).tolist() == [True, False, False, True]
    keep = confident(np.array([0.6, 0.6, 0.6, 0.9]), boxes, 100, 100, 0.8, 0.5)
    assert keep.tolist() == [True, False, False, True]
    # A weak box mostly inside a strong one is a fragment; a strong one never is.
    frag = fragments(np.array([[0, 0, 100, 100], [80, -5, 120, 30], [200, 0, 260, 60]], float),
                     np.array([0.95, 0.6, 0.6]), 0.8)
    assert frag.tolist() == [False, True, False]


def test_bad_edge_threshold_is_a_typed_error(yunet: YuNetDetector) -> None:
    with pytest.raises(InvalidArgumentError):
        YuNetDetector(yunet.model, edge_score_threshold=1.0)
