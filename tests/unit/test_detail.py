"""The face layer at the photo's own resolution: the target's pixels are never
resampled through the working scale, and the fused skin is as detailed as the
photo's."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from facefuse.faces.types import Face
from facefuse.fusion import mask as masks
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.swappers.classic import detail
from facefuse.fusion.types import FuseOptions


def _band_energy(rgb: np.ndarray, where: np.ndarray) -> float:
    y = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY).astype(np.float32)
    return float(np.mean(np.square((y - cv2.GaussianBlur(y, (0, 0), 1.2))[where])))


def _skin(image: np.ndarray, face: Face) -> np.ndarray:
    """The face oval's inner part without the features, (H, W) bool."""
    assert face.landmarks is not None
    h, w = image.shape[:2]
    region = (0, 0, w, h)
    oval = masks.oval_mask(face.landmarks, region) > 0.99
    out: np.ndarray = oval & (masks.features_mask(face.landmarks, region) < 0.01)
    return out


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b) ** 2))
    return 99.0 if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def test_an_unmoved_mesh_and_no_change_return_the_target_exactly() -> None:
    rng = np.random.default_rng(0)
    full = rng.integers(0, 256, (90, 70, 3), dtype=np.uint8)
    frame = detail.Scaled(full, (35, 45))
    h, w = 45, 35
    gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    valid = np.ones((h, w), bool)
    small = cv2.resize(full, (w, h), interpolation=cv2.INTER_AREA).astype(np.float32)
    layer = detail.full_resolution_layer(frame, (gx, gy), frame, (gx, gy), valid, small, small,
                                         np.zeros((h, w), np.float32), np.ones((h, w), np.float32))
    assert np.array_equal(layer, full.astype(np.float32))


def test_full_maps_of_the_identity_are_the_identity_at_every_scale() -> None:
    frame = detail.Scaled(np.zeros((101, 64, 3), np.uint8), (23, 37))
    gx, gy = np.meshgrid(np.arange(23, dtype=np.float32), np.arange(37, dtype=np.float32))
    mx, my = detail.full_maps(gx, gy, np.ones((37, 23), bool), frame, frame,
                              (0, 0, 64, 101))
    fx, fy = np.meshgrid(np.arange(64, dtype=np.float32), np.arange(101, dtype=np.float32))
    assert np.abs(mx - fx).max() < 1e-3 and np.abs(my - fy).max() < 1e-3


def test_a_smooth_map_has_no_tears_and_a_fold_tears_on_both_sides() -> None:
    """A remap that turns, scales and shifts smoothly has no tear; one whose right
    part jumps 40 source pixels away (a fold of the mesh) tears in the two columns
    beside the jump only; pixels off the mesh never count."""
    h, w = 60, 80
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    mx = 0.9 * xx - 0.2 * yy + 5.0
    my = 0.2 * xx + 0.9 * yy + 3.0
    valid = np.ones((h, w), bool)
    assert not detail.map_tears(mx, my, valid).any()
    folded = mx.copy()
    folded[:, 50:] += 40.0
    tears = detail.map_tears(folded, my, valid)
    assert tears[:, 49:51].all() and tears.sum() == 2 * h
    # The same jump between two pixels of which one is off the mesh: no tear.
    off = valid.copy()
    off[:, 50] = False
    assert not detail.map_tears(folded, my, off)[:, 49].any()


@pytest.mark.parametrize("seed", range(40))
def test_an_upsampled_window_is_the_upsample_where_it_is_not_zero(seed: int) -> None:
    """Outside :func:`detail.nonzero_window` the whole upsample is exactly 0, and
    inside it :func:`detail.upsample_window` gives the upsample's values."""
    rng = np.random.default_rng(seed)
    h, w = (int(v) for v in rng.integers(5, 60, 2))
    size = (int(w * rng.uniform(1.01, 4.0)), int(h * rng.uniform(1.01, 4.0)))
    small = np.zeros((h, w), np.float32)
    y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
    small[y:y + int(rng.integers(1, 6)), x:x + int(rng.integers(1, 6))] = rng.uniform(0.1, 1.0)
    ratio = (w / size[0], h / size[1])
    whole = detail.upsample(small, size)
    window = detail.nonzero_window(small, ratio, size)
    assert window is not None
    x0, y0, x1, y1 = window
    outside = np.ones(whole.shape, bool)
    outside[y0:y1, x0:x1] = False
    assert not whole[outside].any()
    part = detail.upsample_window(small, ratio, window)
    np.testing.assert_allclose(part, whole[y0:y1, x0:x1], atol=1e-4)
    assert detail.nonzero_window(np.zeros((h, w), np.float32), ratio, size) is None


@pytest.mark.parametrize(("e_src", "e_tgt", "e_ref"), [(4.0, 1.0, 2.0), (0.5, 1.0, 2.0),
                                                       (0.0, 1.5, 1.0), (9.0, 9.0, 1.0)])
def test_detail_gains_give_the_photo_its_own_energy(e_src: float, e_tgt: float,
                                                    e_ref: float) -> None:
    g, c = detail.detail_gains(e_src, e_tgt, e_ref)
    assert 0.0 <= g <= 1.0 and c >= 0.0
    assert g * g * e_src + c * c * e_tgt == pytest.approx(e_ref, rel=1e-6)


@pytest.fixture(scope="module")
def pair(fuser: FaceFuser, sample_images: dict[str, np.ndarray]) -> tuple[np.ndarray, Face,
                                                                          np.ndarray, list[Face]]:
    # A 2.1 MP target and a source face of about its size: the working scale applies.
    src, tgt = sample_images["obama3"], sample_images["biden"]
    return src, fuser.analyser.analyse(src)[0], tgt, fuser.analyser.analyse(tgt)


def test_degree_1_is_the_target(fuser: FaceFuser, pair: tuple[np.ndarray, Face, np.ndarray,
                                                               list[Face]]) -> None:
    src, sf, tgt, tf = pair
    res = fuser.fuse_faces(src, sf, tgt, tf, [0], FuseOptions(degree=1))
    x0, y0, x1, y1 = res.fused[0].region
    assert _psnr(res.image[y0:y1, x0:x1], tgt[y0:y1, x0:x1]) >= 45.0


def test_degree_100_skin_is_as_detailed_as_the_photo(
        fuser: FaceFuser, pair: tuple[np.ndarray, Face, np.ndarray, list[Face]]) -> None:
    src, sf, tgt, tf = pair
    skin = _skin(tgt, tf[0])
    out = fuser.fuse_faces(src, sf, tgt, tf, [0], FuseOptions(degree=100)).image
    ratio = _band_energy(out, skin) / _band_energy(tgt, skin)
    assert 0.7 <= ratio <= 1.4, ratio


def test_a_textured_target_keeps_its_texture(
        fuser: FaceFuser, pair: tuple[np.ndarray, Face, np.ndarray, list[Face]]) -> None:
    """Fine texture added to the target's skin (pores: 1-2 px specks) is carried to
    the fused face: its finest band at the target's energy whatever the source has
    (the coarser part of the specks lies in the band that is the source's)."""
    src, sf, tgt, tf = pair
    rng = np.random.default_rng(7)
    specks = cv2.GaussianBlur(rng.standard_normal(tgt.shape[:2]).astype(np.float32), (0, 0), 0.5)
    textured = np.clip(tgt.astype(np.float32) + 40.0 * specks[..., None], 0, 255).astype(np.uint8)
    skin = _skin(textured, tf[0])
    plain = fuser.fuse_faces(src, sf, tgt, tf, [0], FuseOptions(degree=100)).image
    out = fuser.fuse_faces(src, sf, textured, tf, [0], FuseOptions(degree=100)).image
    e_textured, e_plain = _band_energy(textured, skin), _band_energy(tgt, skin)
    assert e_textured > 2 * e_plain  # the texture dominates the band
    ratio = _band_energy(out, skin) / e_textured
    assert ratio >= 0.55, ratio
    assert _band_energy(out, skin) > 1.5 * _band_energy(plain, skin)


def test_a_targets_coloured_mark_leaves_no_tinted_ghost(
        fuser: FaceFuser, pair: tuple[np.ndarray, Face, np.ndarray, list[Face]]) -> None:
    """A small dark, cool mark on the target's cheek (a mole, a nostril seen from
    below) that the source does not have: at degree 100 its colour does not stay
    behind the source's skin as a tinted ghost (the luma detail bands alone once
    left the target's colour above the split there)."""
    from facefuse.fusion.geometry import eye_distance

    src, sf, tgt, tf = pair
    assert tf[0].landmarks is not None
    cx, cy = tf[0].landmarks[50, :2]
    r = 0.035 * eye_distance(tf[0].landmarks)
    yy, xx = np.mgrid[0:tgt.shape[0], 0:tgt.shape[1]]
    spot = np.hypot(xx - cx, yy - cy) <= r
    marked = tgt.copy()
    marked[spot] = (marked[spot].astype(np.float32) * (0.45, 0.6, 0.9)).astype(np.uint8)
    plain = fuser.fuse_faces(src, sf, tgt, tf, [0], FuseOptions(degree=100)).image
    out = fuser.fuse_faces(src, sf, marked, tf, [0], FuseOptions(degree=100)).image

    def lab(rgb: np.ndarray) -> np.ndarray:
        out: np.ndarray = cv2.cvtColor(rgb, cv2.COLOR_RGB2LAB)[spot].astype(np.float64)
        return out

    mark = np.abs(lab(marked) - lab(tgt)).mean(0)
    ghost = np.abs(lab(out) - lab(plain)).mean(0)
    assert mark[0] > 30.0 and mark[1:].sum() > 8.0  # the mark is plainly dark and coloured
    assert ghost[1:].sum() < 0.15 * mark[1:].sum(), (ghost, mark)
    assert ghost[0] < 0.1 * mark[0], (ghost, mark)


def _with_highlight(image: np.ndarray, face: Face, point: int) -> tuple[np.ndarray, np.ndarray]:
    """``image`` with a specular highlight (a white Gaussian spot, σ 0.05 eye distances)
    on mesh point ``point``, and the spot's weight (H, W)."""
    from facefuse.fusion.geometry import eye_distance

    assert face.landmarks is not None
    h, w = image.shape[:2]
    x, y = face.landmarks[point, :2]
    sigma = 0.05 * eye_distance(face.landmarks)
    yy, xx = np.mgrid[0:h, 0:w]
    spot = np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * sigma**2)).astype(np.float32)
    out = image.astype(np.float32) + spot[..., None] * (250.0 - image.astype(np.float32))
    return np.clip(out, 0, 255).astype(np.uint8), spot


def test_a_source_highlight_is_not_carried(
        fuser: FaceFuser, pair: tuple[np.ndarray, Face, np.ndarray, list[Face]]) -> None:
    from facefuse.faces import topology as topo

    src, sf, tgt, tf = pair
    shiny, _ = _with_highlight(src, sf, topo.NOSE_TIP)
    assert tf[0].landmarks is not None
    _, where = _with_highlight(tgt, tf[0], topo.NOSE_TIP)
    spot = where > 0.5
    plain = fuser.fuse_faces(src, sf, tgt, tf, [0], FuseOptions()).image
    out = fuser.fuse_faces(shiny, sf, tgt, tf, [0], FuseOptions()).image
    lifted = float(out[spot].mean() - plain[spot].mean())
    unsuppressed = fuser.fuse_faces(shiny, sf, tgt, tf, [0], FuseOptions(relight=False)).image
    carried = float(unsuppressed[spot].mean() - plain[spot].mean())
    assert lifted < 0.3 * carried, (lifted, carried)


def test_the_targets_own_highlight_stays(
        fuser: FaceFuser, pair: tuple[np.ndarray, Face, np.ndarray, list[Face]]) -> None:
    from facefuse.faces import topology as topo

    src, sf, tgt, tf = pair
    shiny, where = _with_highlight(tgt, tf[0], topo.NOSE_TIP)
    spot = where > 0.5
    out = fuser.fuse_faces(src, sf, shiny, tf, [0], FuseOptions()).image
    spot = where > 0.8  # its core: the fringe is the skin's, and fused
    assert float(np.abs(out[spot].astype(np.float32) - shiny[spot]).mean()) < 15.0
