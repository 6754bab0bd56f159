"""Alignment templates, similarity fits and dlib-exact chip warps."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
from dlib_ref import DlibFace, reference, sample_faces
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces.align import (
    ARCFACE_112,
    ARCFACE_128,
    DLIB_CHIP_150,
    DLIB_FIVE_POINT_TEMPLATE,
    MESH_FIVE_POINT_TEMPLATE,
    chip_transform,
    dlib_chip_transform,
    invert_affine,
    pyramid_down,
    similarity_transform,
    template_in_chip,
    transform_points,
    warp_chip,
)
from facefuse.faces.types import MESH_FIVE_POINTS
from facefuse.runtime.registry import ModelRegistry

SAMPLES = ("obama", "obama2", "obama3", "biden", "astronaut")


def rotation(angle: float, scale: float = 1.0) -> np.ndarray:
    c, s = math.cos(angle) * scale, math.sin(angle) * scale
    return np.array([[c, -s], [s, c]])


# -- templates ---------------------------------------------------------------------------------


def test_dlib_chip_150_is_dlibs_template_in_the_chip() -> None:
    assert DLIB_CHIP_150.shape == (5, 2)
    # (0.25 + t) / 1.5 * 150 of dlib's get_face_chip_details constants
    np.testing.assert_allclose(DLIB_CHIP_150[0], [110.9567, 46.3498], atol=1e-3)
    np.testing.assert_allclose(DLIB_CHIP_150[4], [74.0112, 87.7798], atol=1e-3)
    np.testing.assert_allclose(template_in_chip(DLIB_FIVE_POINT_TEMPLATE, 150, 0.25), DLIB_CHIP_150)


def test_arcface_templates() -> None:
    # FaceFusion's arcface_128_v2, normalised by 128: insightface's estimate_norm shifts x by 8
    ff_128 = np.array([[0.36167656, 0.40387734], [0.63696719, 0.40235469],
                       [0.50019687, 0.56044219], [0.38710391, 0.72160547],
                       [0.61507734, 0.72034453]])
    np.testing.assert_allclose(ARCFACE_128 / 128.0, ff_128, atol=1e-7)
    np.testing.assert_allclose(ARCFACE_128 - ARCFACE_112, [[8.0, 0.0]] * 5)


def test_mesh_template_is_mirror_symmetric() -> None:
    t = MESH_FIVE_POINT_TEMPLATE
    axis = t[4, 0]
    np.testing.assert_allclose(t[0, 0] + t[2, 0], 2 * axis, atol=2e-4)
    np.testing.assert_allclose(t[1, 0] + t[3, 0], 2 * axis, atol=2e-4)
    np.testing.assert_allclose(t[[0, 1], 1], t[[2, 3], 1])


# -- similarity fits ---------------------------------------------------------------------------


@hsettings(max_examples=60, deadline=None)
@given(
    angle=st.floats(-math.pi, math.pi),
    scale=st.floats(0.05, 20.0),
    tx=st.floats(-500, 500),
    ty=st.floats(-500, 500),
    seed=st.integers(0, 2**32 - 1),
)
def test_similarity_recovers_an_exact_similarity(
    angle: float, scale: float, tx: float, ty: float, seed: int
) -> None:
    src = np.random.default_rng(seed).uniform(-100, 100, (6, 2))
    M = np.hstack([rotation(angle, scale), [[tx], [ty]]])
    dst = transform_points(M, src)
    fit = similarity_transform(src, dst)
    np.testing.assert_allclose(fit, M, atol=1e-6 * max(1.0, scale) + 1e-6)
    back = transform_points(invert_affine(fit), dst)
    np.testing.assert_allclose(back, src, atol=1e-6)


def test_similarity_never_reflects_and_honours_weights() -> None:
    src = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 5.0], [3.0, 8.0], [7.0, 1.0]])
    mirrored = src * np.array([-1.0, 1.0])
    fit = similarity_transform(src, mirrored)
    assert np.linalg.det(fit[:, :2]) > 0
    # an outlier with zero weight is ignored
    dst = src + np.array([5.0, -3.0])
    dst_bad = dst.copy()
    dst_bad[3] += 40.0
    fit = similarity_transform(src, dst_bad, weights=np.array([1.0, 1.0, 1.0, 0.0, 1.0]))
    np.testing.assert_allclose(transform_points(fit, src), dst, atol=1e-9)
    with pytest.raises(InvalidArgumentError):
        similarity_transform(src, src[:3])
    with pytest.raises(InvalidArgumentError):
        similarity_transform(np.zeros((4, 2)), src)


def test_chip_transform_for_points_already_on_the_chip_template() -> None:
    """At scale 1 dlib's chip is a pure shift: template coordinate u is chip pixel u - 0.5
    (dlib centres the box on size/2, pixel centres are at (size-1)/2)."""
    for size, padding in ((150, 0.25), (64, 0.2), (32, 0.2)):
        pts = template_in_chip(DLIB_FIVE_POINT_TEMPLATE, size, padding)
        np.testing.assert_allclose(
            chip_transform(pts, DLIB_FIVE_POINT_TEMPLATE, size, padding),
            [[1, 0, -0.5], [0, 1, -0.5]], atol=1e-9,
        )


def test_chip_transform_maps_a_scaled_face_like_dlib() -> None:
    """dlib maps the corner pixels of a ``size * scale`` box to chip pixels 0 and size-1,
    so for a face at scale s the template lands at (n-1)/2 + (u - n/2) * k,
    k = s (n-1) / (n s - 1)."""
    n, s = 150, 3.0
    u = DLIB_CHIP_150
    pts = transform_points(np.hstack([rotation(0.3, s), [[40.0], [70.0]]]), u)
    M = chip_transform(pts, DLIB_FIVE_POINT_TEMPLATE, n, 0.25)
    k = s * (n - 1) / (n * s - 1)
    np.testing.assert_allclose(transform_points(M, pts), (n - 1) / 2 + (u - n / 2) * k, atol=1e-9)


def test_dlib_chip_transform_validates_landmarks() -> None:
    with pytest.raises(InvalidArgumentError):
        dlib_chip_transform(np.zeros((5, 2)))
    bad = np.zeros((478, 3))
    bad[MESH_FIVE_POINTS[0]] = np.nan
    with pytest.raises(InvalidArgumentError):
        dlib_chip_transform(bad)


# -- warping -----------------------------------------------------------------------------------


@hsettings(max_examples=40, deadline=None)
@given(x=st.integers(0, 60), y=st.integers(0, 40), size=st.integers(2, 30))
def test_warp_chip_with_a_translation_is_a_crop(x: int, y: int, size: int) -> None:
    img = np.random.default_rng(x * 100 + y).integers(0, 256, (80, 100, 3), dtype=np.uint8)
    M = np.array([[1.0, 0.0, -x], [0.0, 1.0, -y]])
    chip = warp_chip(img, M, size)
    # dlib's bilinear sampler needs the pixel to the right/below: the last row/column is black
    h = min(size, img.shape[0] - 1 - y)
    w = min(size, img.shape[1] - 1 - x)
    np.testing.assert_array_equal(chip[:h, :w], img[y : y + h, x : x + w])
    assert not chip[h:].any()
    assert not chip[:, w:].any()


def _dlib_pyramid_down(img: np.ndarray) -> np.ndarray:
    """dlib's ``pyramid_down<2>`` written out in integers: [1 4 6 4 1] along rows, then
    columns, output (r, c) centred on input (2r + 2, 2c + 2), sum // 256."""
    k = np.array([1, 4, 6, 4, 1], np.int64)
    src = img.astype(np.int64)
    rows, cols = (img.shape[0] - 3) // 2, (img.shape[1] - 3) // 2
    tmp = sum(k[j] * src[:, j : j + 2 * cols - 1 : 2] for j in range(5))
    out = sum(k[j] * tmp[j : j + 2 * rows - 1 : 2] for j in range(5))
    return (out // 256).astype(np.uint8)  # type: ignore[no-any-return]


@hsettings(max_examples=40, deadline=None)
@given(h=st.integers(9, 90), w=st.integers(9, 90), channels=st.sampled_from([0, 1, 3]),
       seed=st.integers(0, 2**16))
def test_pyramid_down_is_dlibs_integer_pyramid(h: int, w: int, channels: int,
                                                seed: int) -> None:
    shape = (h, w) if channels == 0 else (h, w, channels)
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, shape, dtype=np.uint8)
    if seed % 2:  # extremes too: all-white sums reach 65280
        img[rng.random(shape) < 0.5] = 255
    np.testing.assert_array_equal(pyramid_down(img), _dlib_pyramid_down(img))


def test_warp_chip_gray_and_outside() -> None:
    img = np.full((50, 60), 200, np.uint8)
    chip = warp_chip(img, np.array([[0.5, 0.0, 0.0], [0.0, 0.5, 0.0]]), 20)
    assert chip.shape == (20, 20)
    assert (chip == 200).all()
    far_away = np.array([[1.0, 0.0, 500.0], [0.0, 1.0, 500.0]])
    far = warp_chip(np.full((50, 60, 3), 200, np.uint8), far_away, 16)
    assert far.shape == (16, 16, 3)
    assert not far.any()
    with pytest.raises(InvalidArgumentError):
        warp_chip(img.astype(np.float32), np.eye(2, 3), 16)
    # A region a pixel high or wide has no 2×2 neighbourhood: black, as dlib's.
    for shape in ((1, 100, 3), (100, 1, 3), (1, 1), (1, 40)):
        thin = warp_chip(np.full(shape, 200, np.uint8), np.eye(2, 3), 10)
        assert thin.shape == (10, 10, *shape[2:])
        assert not thin.any()


# -- against dlib ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dlib_faces(settings: Settings, sample_images: dict[str, np.ndarray]) -> dict[str, DlibFace]:
    pytest.importorskip("dlib")
    return sample_faces(settings, sample_images)


def test_warp_chip_reproduces_dlib_get_face_chip(
    settings: Settings, sample_images: dict[str, np.ndarray], dlib_faces: dict[str, DlibFace]
) -> None:
    """Given dlib's own five points, our transform + warp cut dlib's chip (every pyramid
    level: the samples, halved, and enlarged ×1.7)."""
    cases = [(sample_images[n], dlib_faces[n]) for n in SAMPLES]
    ref = reference(settings)
    for name, factor in (("obama", 0.5), ("obama3", 1.7), ("astronaut", 1.7)):
        img = cv2.resize(sample_images[name], None, fx=factor, fy=factor,
                         interpolation=cv2.INTER_AREA if factor < 1 else cv2.INTER_CUBIC)
        cases.append((img, ref.face(img)))
    for img, face in cases:
        M = chip_transform(face.points, DLIB_FIVE_POINT_TEMPLATE, 150, 0.25)
        chip = warp_chip(img, M, 150)
        diff = np.abs(chip.astype(int) - face.chip.astype(int))
        # measured: bit-identical on all of these
        assert diff.max() <= 1, diff.max()
        assert (diff == 0).mean() >= 0.999, (diff > 0).sum()


@pytest.fixture(scope="module")
def mesh_faces(
    settings: Settings, model_dir: Path, sample_images: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """name → (478, 3) iris-refined mesh landmarks of the largest face."""
    from facefuse.faces.analyser import FaceAnalyser

    analyser = FaceAnalyser(settings, ModelRegistry(settings.replace(precision="fp32")))
    out = {}
    for name in SAMPLES:
        faces = analyser.analyse(sample_images[name], embed=False)
        assert faces, name
        assert faces[0].landmarks is not None
        out[name] = faces[0].landmarks
    return out


def test_mesh_chips_embed_close_to_dlib_chips(
    settings: Settings,
    sample_images: dict[str, np.ndarray],
    dlib_faces: dict[str, DlibFace],
    mesh_faces: dict[str, np.ndarray],
) -> None:
    """Embedding drift (L2, raw vectors) of our mesh-aligned chip from dlib's own chip.

    Measured: 0.10, 0.14, 0.06, 0.06, 0.06 (mean 0.085) with the calibrated mesh
    template; 0.14, 0.16, 0.11, 0.09, 0.13 (mean 0.124) when the mesh points are
    fitted to dlib's template directly. For scale: 1 px of jitter on dlib's own
    points drifts ~0.06.
    """
    from facefuse.faces.recognizer import Recognizer

    rec = Recognizer(ModelRegistry(settings.replace(precision="fp32")).get("dlib_resnet"))
    ours, plain, ref = [], [], []
    for name in SAMPLES:
        img, lm = sample_images[name], mesh_faces[name]
        ours.append(warp_chip(img, dlib_chip_transform(lm), 150))
        five = lm[list(MESH_FIVE_POINTS), :2]
        plain.append(warp_chip(img, chip_transform(five, DLIB_FIVE_POINT_TEMPLATE), 150))
        ref.append(dlib_faces[name].chip)
    e_ref = rec.embed_chips(np.stack(ref))
    drift = np.linalg.norm(rec.embed_chips(np.stack(ours)) - e_ref, axis=1)
    drift_plain = np.linalg.norm(rec.embed_chips(np.stack(plain)) - e_ref, axis=1)
    assert drift.max() < 0.2, dict(zip(SAMPLES, drift.round(3), strict=True))
    assert drift.mean() < 0.12, drift.mean()
    assert drift.mean() < drift_plain.mean(), (drift.mean(), drift_plain.mean())


def test_mesh_template_rederives_from_dlib(
    dlib_faces: dict[str, DlibFace], mesh_faces: dict[str, np.ndarray]
) -> None:
    """The calibrated constant is where the mesh's five points fall in the frame that
    dlib's own 5-point fit defines (measured on these five photos: within 0.009)."""
    where = []
    chip_template = template_in_chip(DLIB_FIVE_POINT_TEMPLATE, 150, 0.25)
    for name in SAMPLES:
        fit = similarity_transform(chip_template, dlib_faces[name].points)
        pts = transform_points(invert_affine(fit), mesh_faces[name][list(MESH_FIVE_POINTS)])
        where.append(pts / 150 * 1.5 - 0.25)
    mean = np.mean(where, axis=0)
    assert np.abs(mean - MESH_FIVE_POINT_TEMPLATE).max() < 0.015, mean.round(4)
    # and the mesh's nose point really sits above dlib's nose base
    assert mean[4, 1] < DLIB_FIVE_POINT_TEMPLATE[4, 1] - 0.02


def test_warp_chip_reduces_large_regions_through_the_pyramid() -> None:
    """A 1-px checkerboard seen 4x smaller must come out flat grey (dlib's 5-tap pyramid
    cancels it exactly); plain bilinear sampling would alias it to black or white."""
    yy, xx = np.mgrid[0:800, 0:800]
    board = np.where((yy + xx) % 2 == 0, 255, 0).astype(np.uint8)
    M = np.array([[0.25, 0.0, -10.0], [0.0, 0.25, -10.0]])
    chip = warp_chip(board, M, 150)
    assert chip.min() >= 126, chip.min()
    assert chip.max() <= 128, chip.max()
    # same inputs, same bytes: the warp is a pure function
    np.testing.assert_array_equal(chip, warp_chip(board.copy(), M.copy(), 150))


def test_unweighted_similarity_is_umeyamas() -> None:
    """The closed form used for equal weights gives Umeyama's fit (the weighted
    path with all weights 1), reflected point sets included."""
    rng = np.random.default_rng(3)
    for k in (2, 3, 7, 40):
        for flip in (1.0, -1.0):
            s = rng.random((k, 2)) * 400
            ang, sc = rng.uniform(-3, 3), rng.uniform(0.5, 2.0)
            r = sc * np.array([[np.cos(ang), -np.sin(ang)], [np.sin(ang), np.cos(ang)]])
            d = (s @ r.T + (30.0, -12.0) + rng.normal(0, 3, (k, 2))) * (flip, 1.0)
            np.testing.assert_allclose(similarity_transform(s, d),
                                       similarity_transform(s, d, np.ones(k)),
                                       rtol=1e-9, atol=1e-9)
