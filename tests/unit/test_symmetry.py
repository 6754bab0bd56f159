"""The mesh's left/right vertex pairs and the symmetric fill of what the source hides
(real models, the sample photos and turned pairs made from them)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from face_poses import turn_yaw

from facefuse.faces import topology as topo
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.landmarker import EYE_CONTOUR_INDICES, MESH_POINTS
from facefuse.faces.mesh_mirror import MIRROR
from facefuse.faces.types import Face
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.geometry import relative_pose
from facefuse.fusion.swappers.classic import ClassicSwapper
from facefuse.fusion.swappers.classic import symmetry as sym
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.warp import delaunay
from facefuse.toolchain.mesh_symmetry import derive_mirror
from facefuse.toolchain.trials import BEFORE
from facefuse.toolchain.turned import turn_head

M = np.asarray(MIRROR)


def test_the_pairing_is_an_involution_over_the_mesh() -> None:
    assert len(M) == MESH_POINTS and sorted(set(M.tolist())) == list(range(MESH_POINTS))
    assert (M[M] == np.arange(MESH_POINTS)).all()
    # A few vertices lie on the midline; most have a partner on the other side.
    assert 10 < int((np.arange(MESH_POINTS) == M).sum()) < 60


def test_the_stored_pairing_is_what_the_landmarker_gives(
        analyser: FaceAnalyser, sample_images: dict[str, np.ndarray]) -> None:
    def landmarks_of(image: np.ndarray) -> np.ndarray | None:
        faces = analyser.analyse(image, embed=False)
        return faces[0].landmarks if faces else None

    assert derive_mirror(landmarks_of, sample_images.values()) == MIRROR


def test_the_pairing_agrees_with_the_named_contours() -> None:
    """The hand-written contour tables of both sides (eyes, brows, iris-model eye
    contours) pair index by index; the oval and lips map onto themselves reversed."""
    for left, right in ((topo.EYE_IMAGE_LEFT, topo.EYE_IMAGE_RIGHT),
                        (topo.BROW_IMAGE_LEFT, topo.BROW_IMAGE_RIGHT), EYE_CONTOUR_INDICES,
                        (topo.EYE_OUTER[:1], topo.EYE_OUTER[1:]),
                        (topo.MOUTH_CORNERS[:1], topo.MOUTH_CORNERS[1:])):
        assert M[list(left)].tolist() == list(right)
    oval = np.asarray(topo.FACE_OVAL)
    assert M[oval].tolist() == oval[(-np.arange(len(oval))) % len(oval)].tolist()
    for chin_to_nose in (topo.CHIN, topo.NOSE_TIP, topo.FOREHEAD):
        assert M[chin_to_nose] == chin_to_nose


@pytest.mark.parametrize("name", ["obama", "astronaut"])  # the frontal photos
def test_the_pairing_maps_one_side_of_the_face_to_the_other(
        analysed_faces: dict[str, Face], name: str) -> None:
    lm = analysed_faces[name].landmarks
    assert lm is not None
    pts = lm[:MESH_POINTS, :2].astype(np.float64)
    # Signed distance to the midline (forehead to chin), in eye distances.
    a, b = pts[topo.FOREHEAD], pts[topo.CHIN]
    n = np.array([b[1] - a[1], a[0] - b[0]]) / np.linalg.norm(b - a)
    side = (pts - a) @ n / np.linalg.norm(pts[topo.EYE_OUTER[0]] - pts[topo.EYE_OUTER[1]])
    off = np.abs(side) > 0.08
    assert off.sum() > 300
    assert (np.sign(side[off]) != np.sign(side[M][off])).all()
    # Mirror partners sit at about the same distance from the midline.
    assert np.median(np.abs(np.abs(side[off]) - np.abs(side[M][off]))) < 0.05


def test_a_turn_hides_one_side_and_its_mirror_shows_it(analysed_faces: dict[str, Face]) -> None:
    face = analysed_faces["obama"]
    assert face.landmarks is not None
    target = face.landmarks[:MESH_POINTS].astype(np.float64)
    tris = delaunay(target[:, :2])
    same = sym.plan_fill(target, target, tris)
    assert not same.needed and same.direct.min() >= sym.FULLY_SHOWN
    turned = turn_yaw(face, 40).landmarks
    assert turned is not None
    plan = sym.plan_fill(turned.astype(np.float64), target, tris)
    assert plan.needed
    hidden = plan.direct < 0.5
    assert 0.05 < hidden.mean() < 0.5
    # The hidden vertices lie on one side of the nose, and their mirror side shows them.
    right = target[hidden, 0] > target[topo.NOSE_TIP, 0]
    assert right.mean() > 0.9 or right.mean() < 0.1
    assert np.median(plan.mirror[hidden]) > 0.9


@pytest.mark.parametrize("deg", [-35.0, 35.0])
def test_no_fill_where_both_halves_show_the_face_alike(analysed_faces: dict[str, Face],
                                                       deg: float) -> None:
    """A frontal source shows both halves alike, however the target is turned, and a
    source turned as the target is shows what the target shows: the mirror has
    nothing better to give. A source turned the other way does."""
    face = analysed_faces["obama"]
    assert face.landmarks is not None
    frontal = face.landmarks[:MESH_POINTS].astype(np.float64)
    turned = turn_yaw(face, deg).landmarks
    assert turned is not None
    turned = turned[:MESH_POINTS].astype(np.float64)
    tris = delaunay(turned[:, :2])
    assert not sym.plan_fill(frontal, turned, tris).needed
    assert not sym.plan_fill(turned, turned, tris).needed
    other = turn_yaw(face, -deg).landmarks
    assert other is not None
    plan = sym.plan_fill(other[:MESH_POINTS].astype(np.float64), turned, tris)
    assert plan.needed and (plan.mirror - plan.direct).max() >= sym.MIRROR_GAIN


def test_outside_share_counts_samples_beyond_the_outline() -> None:
    outline = np.zeros((20, 20), np.float32)
    outline[5:15, 5:15] = 1.0
    ys, xs = np.mgrid[0:4, 0:4].astype(np.float32)
    face = np.ones((4, 4), bool)
    inside = [(np.ones((4, 4), np.float32), xs + 6.0, ys + 6.0)]
    assert sym.outside_share(inside, outline, face) == 0.0
    # Columns at x = 12.5 .. 15.5: the last two have a bilinear tap beyond x = 14.
    edge = [(np.ones((4, 4), np.float32), xs + 12.5, ys + 6.0)]
    assert sym.outside_share(edge, outline, face) == pytest.approx(0.5)
    # Exactly on the last inside column: the tap beyond it has no weight.
    on_edge = [(np.ones((4, 4), np.float32), np.full((4, 4), 14.0, np.float32), ys + 6.0)]
    assert sym.outside_share(on_edge, outline, face) == 0.0
    # A zero weight means the colour does not come from there.
    assert sym.outside_share([(np.zeros((4, 4), np.float32), xs, ys)], outline, face) == 0.0


@pytest.fixture(scope="module")
def turned_pair(fuser: FaceFuser, sample_images: dict[str, np.ndarray]
                ) -> tuple[np.ndarray, Face, np.ndarray, list[Face]]:
    """A source photo and a target of another person turned about 26° from it."""
    src = sample_images["obama2"]
    tgt = sample_images["biden"]
    sf = fuser.analyser.analyse(src, embed=False)
    tf = fuser.analyser.analyse(tgt, embed=False)
    assert sf[0].landmarks is not None and tf[0].landmarks is not None
    assert abs(relative_pose(sf[0].landmarks, tf[0].landmarks)[0]) > 20
    return src, sf[0], tgt, tf


def _fuse(fuser: FaceFuser, pair: tuple[np.ndarray, Face, np.ndarray, list[Face]],
          options: FuseOptions) -> tuple[np.ndarray, float | None]:
    src, sf, tgt, tf = pair
    r = fuser.fuse_faces(src, sf, tgt, tf, [0], dataclasses.replace(options, evaluate=True))
    return r.image, r.fused[0].outside_source


def test_no_output_pixel_of_a_turned_pair_comes_from_beyond_the_source_face(
        fuser: FaceFuser, turned_pair: tuple[np.ndarray, Face, np.ndarray, list[Face]]) -> None:
    filled, outside = _fuse(fuser, turned_pair, FuseOptions())
    assert outside == 0.0
    # Without the outline gating the same pair does sample beyond it.
    _, outside_before = _fuse(fuser, turned_pair, BEFORE)
    assert outside_before is not None and outside_before > 0.01
    # The fill changes the face (it takes the hidden side from the other half).
    plain, outside_plain = _fuse(fuser, turned_pair,
                                 dataclasses.replace(FuseOptions(), symmetric_fill=False))
    assert outside_plain == 0.0
    changed = np.abs(filled.astype(np.int16) - plain.astype(np.int16)).max(-1) > 8
    assert changed.sum() > 200


def test_a_source_turned_about_38_degrees_is_filled_from_its_visible_half(
        fuser: FaceFuser, sample_images: dict[str, np.ndarray],
        analysed_faces: dict[str, Face]) -> None:
    """A synthetic turned source (its far side squeezed or hidden) into a frontal target."""
    biden = analysed_faces["biden"]
    assert biden.landmarks is not None
    src = turn_head(sample_images["biden"], biden.landmarks, -35.0)
    tgt = sample_images["obama"]
    sf = fuser.analyser.analyse(src, embed=False)
    tf = fuser.analyser.analyse(tgt, embed=False)
    assert sf[0].landmarks is not None and tf[0].landmarks is not None
    assert abs(relative_pose(sf[0].landmarks, tf[0].landmarks)[0]) > 30
    pair = (src, sf[0], tgt, tf)
    filled, outside = _fuse(fuser, pair, FuseOptions())
    assert outside == 0.0
    _, outside_before = _fuse(fuser, pair, BEFORE)
    assert outside_before is not None and outside_before > 0.02
    plain, _ = _fuse(fuser, pair, dataclasses.replace(FuseOptions(), symmetric_fill=False))
    changed = np.abs(filled.astype(np.int16) - plain.astype(np.int16)).max(-1) > 8
    assert changed.sum() > 2000


def test_nothing_from_beyond_the_outline_where_the_fill_is_not_needed(
        sample_images: dict[str, np.ndarray], analysed_faces: dict[str, Face]) -> None:
    """A frontal source onto a turned target takes no fill; its direct sample is
    still cut at the source's face outline, with the source's occluder mask off too."""
    options = FuseOptions(reject_source_occluders=False, evaluate=True)
    for source, target in (("astronaut", "obama3"), ("obama", "obama2")):
        layer = ClassicSwapper(cache_sources=False).render(
            sample_images[source], analysed_faces[source], sample_images[target],
            analysed_faces[target], options)
        assert layer.outside_source == 0.0, (source, target, layer.outside_source)
