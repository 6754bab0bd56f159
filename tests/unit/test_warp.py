"""Piecewise-affine maps, remapping and the Delaunay fallback (property tests included)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from facefuse.errors import InvalidArgumentError
from facefuse.imaging.warp import (
    INVALID,
    delaunay,
    piecewise_affine_map,
    rasterize_triangles,
    remap_region,
    triangle_affines,
)

# --- helpers -------------------------------------------------------------------------------------


def _grid(region: tuple[int, int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    x0, y0, x1, y1 = region
    ys, xs = np.mgrid[y0:y1, x0:x1]
    return xs.astype(np.float64), ys.astype(np.float64)


def _region_around(pts: np.ndarray, pad: int = 3) -> tuple[int, int, int, int]:
    lo = np.floor(pts.min(axis=0)).astype(int) - pad
    hi = np.ceil(pts.max(axis=0)).astype(int) + pad
    return int(lo[0]), int(lo[1]), int(hi[0]), int(hi[1])


def _signed_distance_to_convex(poly: np.ndarray, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Signed distance (positive inside) of pixel centres to a convex polygon's edges.

    Exact inside; outside it is a lower bound of the true distance (sign is exact).
    """
    centre = poly.mean(axis=0)
    dist = np.full(xs.shape, np.inf)
    for i in range(len(poly)):
        a, b = poly[i], poly[(i + 1) % len(poly)]
        e = b - a
        n = np.array([-e[1], e[0]]) / np.hypot(*e)
        if np.dot(centre - a, n) < 0:
            n = -n
        dist = np.minimum(dist, (xs - a[0]) * n[0] + (ys - a[1]) * n[1])
    return dist


def _hull(pts: np.ndarray) -> np.ndarray:
    return cv2.convexHull(pts.astype(np.float32)).reshape(-1, 2).astype(np.float64)


def _area(poly: np.ndarray) -> float:
    x, y = poly[:, 0], poly[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _random_points(seed: int, n: int, size: float, origin: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pts = origin + rng.uniform(0, size, (n, 2))
    return np.round(pts * 8) / 8  # a 1/8 px lattice makes ties and duplicates possible


def _lattice(pts: np.ndarray) -> list[tuple[int, int]]:
    """1/8 px lattice points as exact integers (units of 1/8 px)."""
    return [(round(x * 8), round(y * 8)) for x, y in pts.tolist()]


def _cross_int(o: tuple[int, int], a: tuple[int, int], b: tuple[int, int]) -> int:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _exact_hull_area2(pts: np.ndarray) -> int:
    """Doubled convex-hull area of lattice points in (1/8 px)², exactly (monotone chain)."""
    p = sorted(set(_lattice(pts)))
    chain: list[tuple[int, int]] = []
    for seq in (p, p[::-1]):
        half: list[tuple[int, int]] = []
        for q in seq:
            while len(half) >= 2 and _cross_int(half[-2], half[-1], q) <= 0:
                half.pop()
            half.append(q)
        chain += half[:-1]
    return abs(sum(a[0] * b[1] - a[1] * b[0] for a, b in zip(chain, chain[1:] + chain[:1], strict=True)))


def _exact_triangles_area2(pts: np.ndarray, tri: np.ndarray) -> int:
    q = _lattice(pts)
    return sum(_cross_int(q[a], q[b], q[c]) for a, b, c in tri.tolist())


def _random_affine(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    angle = rng.uniform(-np.pi, np.pi)
    scale = rng.uniform(0.5, 2.0, 2)
    shear = rng.uniform(-0.3, 0.3)
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    lin = rot @ np.array([[scale[0], shear], [0.0, scale[1]]])
    t = rng.uniform(-2000, 2000, (2, 1))
    return np.hstack([lin, t])


def _apply(a: np.ndarray, pts: np.ndarray) -> np.ndarray:
    out: np.ndarray = pts @ a[:, :2].T + a[:, 2]
    return out


point_sets = st.builds(
    _random_points,
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(3, 30),
    size=st.floats(8.0, 80.0),
    origin=st.floats(0.0, 3000.0),
)


# --- properties -----------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(pts=point_sets)
# Subdiv2D alone dropped the 1/64 px² sliver of a point just inside a 49 px hull edge.
@example(pts=_random_points(29, 18, 67.0, 0.0))
def test_delaunay_tiles_the_convex_hull(pts: np.ndarray) -> None:
    tri = delaunay(pts)
    hull2 = _exact_hull_area2(pts)
    assume(hull2 > 2 * 64)  # more than 1 px²
    assert tri.dtype == np.int32
    assert tri.ndim == 2
    assert tri.shape[1] == 3
    assert tri.min() >= 0
    assert tri.max() < len(pts)
    v = pts[tri]
    cross = (v[:, 1, 0] - v[:, 0, 0]) * (v[:, 2, 1] - v[:, 0, 1]) - (v[:, 2, 0] - v[:, 0, 0]) * (
        v[:, 1, 1] - v[:, 0, 1]
    )
    assert np.all(cross > 0)  # one orientation, no degenerate triangles
    assert len({tuple(sorted(t)) for t in tri.tolist()}) == len(tri)
    # No directed edge twice: neighbours sit on opposite sides of every shared edge.
    edges = [e for a, b, c in tri.tolist() for e in ((a, b), (b, c), (c, a))]
    assert len(set(edges)) == len(edges)
    # Exact on the lattice: the triangles' area is the hull's, not just close to it.
    assert _exact_triangles_area2(pts, tri) == hull2


def test_delaunay_keeps_the_slivers_along_the_hull() -> None:
    # b is 1/64 px² inside the hull edge a–c (exact: cross = -2 in (1/8 px)²): the
    # finite super-triangle alone joined b to a virtual vertex and lost (a, b, c).
    a, b, c = (15, 510), (301, 518), (408, 521)
    for inner in ([(200, 300)], [(200, 100), (100, 200), (300, 200)], [(200, 505)]):
        pts = np.array([a, b, c, *inner], float) / 8
        tri = delaunay(pts)
        assert _exact_triangles_area2(pts, tri) == _exact_hull_area2(pts)
        assert [0, 1, 2] in [sorted(t) for t in tri.tolist()]


@settings(max_examples=60, deadline=None)
@given(pts=point_sets)
def test_identity_mesh_gives_the_identity_map(pts: np.ndarray) -> None:
    tri = delaunay(pts)
    hull = _hull(pts)
    assume(len(tri) > 0 and _area(hull) > 4.0)
    region = _region_around(pts)
    mx, my, valid = piecewise_affine_map(pts, pts, tri, region)
    xs, ys = _grid(region)
    assert mx.dtype == np.float32
    assert mx.shape == xs.shape
    assert valid.dtype == np.bool_
    np.testing.assert_allclose(mx[valid], xs[valid], atol=1e-3)
    np.testing.assert_allclose(my[valid], ys[valid], atol=1e-3)
    d = _signed_distance_to_convex(hull, xs, ys)
    assert np.all(valid[d > 1.0])  # every pixel well inside the hull is covered
    assert not np.any(valid[d < -1.0])  # nothing well outside it is
    assert np.all(mx[~valid] == INVALID)


@settings(max_examples=60, deadline=None)
@given(pts=point_sets, seed=st.integers(0, 2**32 - 1), extrapolate=st.booleans())
def test_affine_mesh_gives_the_affine_map(pts: np.ndarray, seed: int, extrapolate: bool) -> None:
    tri = delaunay(pts)
    assume(len(tri) > 0)
    a = _random_affine(seed)
    region = _region_around(pts)
    mx, my, valid = piecewise_affine_map(_apply(a, pts), pts, tri, region, extrapolate=extrapolate)
    xs, ys = _grid(region)
    ex = a[0, 0] * xs + a[0, 1] * ys + a[0, 2]
    ey = a[1, 0] * xs + a[1, 1] * ys + a[1, 2]
    where = np.ones_like(valid) if extrapolate else valid
    assert np.any(where)
    np.testing.assert_allclose(mx[where], ex[where], atol=1e-3)
    np.testing.assert_allclose(my[where], ey[where], atol=1e-3)


@settings(max_examples=50, deadline=None)
@given(pts=point_sets, seed=st.integers(0, 2**32 - 1))
def test_each_pixel_uses_its_own_triangle(pts: np.ndarray, seed: int) -> None:
    """Non-affine warp: inside each triangle (≥ 1 px from its edges) its own affine applies."""
    tri = delaunay(pts)
    assume(len(tri) > 0)
    src = pts + np.random.default_rng(seed).uniform(-6, 6, pts.shape)
    region = _region_around(pts)
    mx, my, valid = piecewise_affine_map(src, pts, tri, region)
    coeffs, ok = triangle_affines(src, pts, tri)
    xs, ys = _grid(region)
    checked = 0
    for t in np.flatnonzero(ok):
        inner = _signed_distance_to_convex(pts[tri[t]], xs, ys) >= 1.0
        if not inner.any():
            continue
        c = coeffs[t]
        assert np.all(valid[inner])
        np.testing.assert_allclose(
            mx[inner], (c[0, 0] * xs + c[0, 1] * ys + c[0, 2])[inner], atol=1e-3
        )
        np.testing.assert_allclose(
            my[inner], (c[1, 0] * xs + c[1, 1] * ys + c[1, 2])[inner], atol=1e-3
        )
        checked += int(inner.sum())
    src_tri = src[tri[ok]]
    dst_tri = pts[tri[ok]]
    # The affines really map each destination triangle's corners onto the source corners.
    corners = np.einsum("tij,tkj->tki", coeffs[ok][:, :, :2], dst_tri) + coeffs[ok][:, None, :, 2]
    np.testing.assert_allclose(corners, src_tri, atol=1e-6)
    assume(checked > 0)


# --- examples -------------------------------------------------------------------------------------


def test_warping_a_photo_matches_warp_affine(sample_images: dict[str, np.ndarray]) -> None:
    img = sample_images["astronaut"]
    rng = np.random.default_rng(7)
    dst = rng.uniform(120, 380, (60, 2))
    a = np.array([[0.9, -0.15, 30.0], [0.12, 1.05, -20.0]])  # dst → src
    tri = delaunay(dst)
    region = (100, 100, 400, 400)
    mx, my, valid = piecewise_affine_map(_apply(a, dst), dst, tri, region)
    ours = remap_region(img, mx, my)
    # Reference: OpenCV warps the whole frame with the inverse map convention.
    ref = cv2.warpAffine(img, a, (512, 512), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP)
    ref = ref[100:400, 100:400]
    diff = np.abs(ours.astype(int) - ref.astype(int))[valid]
    assert valid.mean() > 0.5
    assert diff.mean() < 0.5
    assert diff.max() <= 2


def test_remap_region_identity_and_half_pixel(sample_images: dict[str, np.ndarray]) -> None:
    img = sample_images["obama"]
    xs, ys = _grid((200, 300, 420, 500))
    out = remap_region(img, xs.astype(np.float32), ys.astype(np.float32))
    np.testing.assert_array_equal(out, img[300:500, 200:420])
    half = remap_region(
        img.astype(np.float32), (xs + 0.5).astype(np.float32), ys.astype(np.float32)
    )
    expected = 0.5 * (img[300:500, 200:420].astype(np.float32) + img[300:500, 201:421])
    np.testing.assert_allclose(half, expected, atol=0.05)
    with pytest.raises(InvalidArgumentError):
        remap_region(img, xs.astype(np.float32), ys[:-1].astype(np.float32))


def test_remap_region_reflects_at_the_border() -> None:
    img = np.arange(100, dtype=np.float32).reshape(10, 10)
    mx = np.array([[-1.0, -2.0]], np.float32)
    my = np.zeros((1, 2), np.float32)
    assert remap_region(img, mx, my).tolist() == [[1.0, 2.0]]  # reflect-101


def test_region_outside_every_triangle() -> None:
    pts = np.array([[0, 0], [10, 0], [0, 10]], float)
    mx, my, valid = piecewise_affine_map(pts, pts, [[0, 1, 2]], (100, 100, 120, 110))
    assert mx.shape == (10, 20)
    assert not valid.any()
    assert np.all(mx == INVALID)
    assert np.all(my == INVALID)
    # With extrapolation but nothing to extrapolate from, still invalid.
    mx2, _, _ = piecewise_affine_map(pts, pts, [[0, 1, 2]], (100, 100, 120, 110), extrapolate=True)
    assert np.all(mx2 == INVALID)


def test_degenerate_triangles_are_skipped() -> None:
    pts = np.array([[0, 0], [20, 0], [0, 20], [10, 0]], float)
    tris = np.array([[0, 1, 2], [0, 3, 1]])  # the second is a line
    coeffs, ok = triangle_affines(pts, pts, tris)
    assert ok.tolist() == [True, False]
    assert np.all(coeffs[1] == 0)
    labels = rasterize_triangles(pts, tris, (0, 0, 21, 21), ok)
    assert set(np.unique(labels).tolist()) == {0, 1}
    mx, _, valid = piecewise_affine_map(pts, pts, tris, (0, 0, 21, 21))
    xs, _ = _grid((0, 0, 21, 21))
    np.testing.assert_allclose(mx[valid], xs[valid], atol=1e-4)


def test_ok_mask_of_the_caller_is_not_modified() -> None:
    pts = np.array([[0, 0], [20, 0], [0, 20], [500, 500], [520, 500], [500, 520]], float)
    tris = np.array([[0, 1, 2], [3, 4, 5]])
    ok = np.array([True, True])
    rasterize_triangles(pts, tris, (0, 0, 30, 30), ok)
    assert ok.tolist() == [True, True]


def test_delaunay_examples() -> None:
    square = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], float)
    tri = delaunay(square, (0, 0, 10, 10))  # points on the rect's far edge are fine
    assert tri.shape == (2, 3)
    assert sorted(set(tri.ravel().tolist())) == [0, 1, 2, 3]
    dup = np.vstack([square, square[:1]])
    assert delaunay(dup).max() < 4  # the duplicate's first index is used
    assert delaunay(square[:2]).shape == (0, 3)
    assert delaunay(np.array([[0, 0], [1, 1], [2, 2], [3, 3]], float)).shape == (0, 3)
    gx, gy = np.meshgrid(np.arange(10) * 7.0 + 50, np.arange(10) * 5.0 + 20)
    grid = np.stack([gx.ravel(), gy.ravel()], axis=1)
    assert delaunay(grid).shape == (2 * 9 * 9, 3)


def test_argument_validation() -> None:
    pts = np.array([[0, 0], [10, 0], [0, 10]], float)
    with pytest.raises(InvalidArgumentError, match="region"):
        piecewise_affine_map(pts, pts, [[0, 1, 2]], (10, 10, 10, 20))
    with pytest.raises(InvalidArgumentError, match="region"):
        piecewise_affine_map(pts, pts, [[0, 1, 2]], (0, 0, 40000, 10))
    with pytest.raises(InvalidArgumentError, match="differ"):
        piecewise_affine_map(pts, pts[:2], [[0, 1, 2]], (0, 0, 10, 10))
    with pytest.raises(InvalidArgumentError, match="indices"):
        piecewise_affine_map(pts, pts, [[0, 1, 3]], (0, 0, 10, 10))
    with pytest.raises(InvalidArgumentError, match="int"):
        piecewise_affine_map(pts, pts, [[0.0, 1.0, 2.0]], (0, 0, 10, 10))
    with pytest.raises(InvalidArgumentError, match="NaN"):
        piecewise_affine_map(pts * np.nan, pts, [[0, 1, 2]], (0, 0, 10, 10))
    with pytest.raises(InvalidArgumentError, match=r"\(P, 2\)"):
        delaunay(np.zeros((4, 3)))
