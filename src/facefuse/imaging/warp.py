"""Piecewise-affine warping over a triangle mesh, as one dense map over a region.

Conventions: coordinates are pixels, ``x`` to the right and ``y`` down, and the
centre of pixel ``(row i, column j)`` is at ``(x=j, y=i)`` — the convention of
:func:`cv2.remap` and of OpenCV's drawing functions.

How :func:`piecewise_affine_map` works (no per-triangle ``warpAffine``):

1. one batched solve gives every triangle's affine ``dst → src`` map,
   a (T, 2, 3) coefficient array;
2. the destination triangles are rasterised once into an int32 label image of
   the region (``cv2.fillConvexPoly`` with sub-pixel ``shift``, label = triangle
   index + 1, 0 = outside);
3. the coefficients are gathered by label and applied to the pixel grid in one
   vectorised expression, giving float32 ``map_x``/``map_y`` for ``cv2.remap``.

Where triangles share an edge their affine maps agree on it, so the map is
continuous; a pixel near an edge may be labelled with either neighbour (OpenCV's
filler is inclusive by up to about half a pixel), which costs at most the
difference of the two gradients times that distance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import cv2
import numpy as np
import numpy.typing as npt

from facefuse.errors import InvalidArgumentError
from facefuse.imaging.hull import complete_to_hull

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]
Region = tuple[int, int, int, int]

#: Fixed-point bits for sub-pixel triangle rasterisation (1/256 px).
_SHIFT: Final = 8
#: Triangles with less than this doubled area (px²) in the destination are skipped
#: (and a triangle kept from another frame must still have more, see
#: :func:`doubled_areas`).
MIN_AREA2: Final = 1e-6
#: ``map_x``/``map_y`` value where ``valid_mask`` is False (and ``extrapolate`` is off).
INVALID: Final = -1.0
#: Largest rect margin for Subdiv2D (its super-triangle lives at 3× the rect size,
#: stored as float32: keep it well inside float32's exact-integer range).
_MAX_SUBDIV_MARGIN: Final = 1 << 21
#: cv2.remap keeps map coordinates in a signed 16-bit range internally.
_MAX_REGION_SIDE: Final = 32767


def _as_points(name: str, pts: npt.ArrayLike) -> F64:
    arr = np.asarray(pts, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise InvalidArgumentError(f"{name} must have shape (P, 2), not {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise InvalidArgumentError(f"{name} contains NaN or infinite coordinates")
    return arr


def _as_region(region: Region | npt.ArrayLike) -> Region:
    vals = [int(v) for v in np.asarray(region).reshape(-1)]
    if len(vals) != 4:
        raise InvalidArgumentError(f"region must be (x0, y0, x1, y1), not {region!r}")
    x0, y0, x1, y1 = vals
    if x1 <= x0 or y1 <= y0:
        raise InvalidArgumentError(f"region {vals} is empty (need x1 > x0 and y1 > y0)")
    if x1 - x0 > _MAX_REGION_SIDE or y1 - y0 > _MAX_REGION_SIDE:
        raise InvalidArgumentError(f"region {vals} is larger than {_MAX_REGION_SIDE} px")
    return x0, y0, x1, y1


def triangle_affines(
    src_pts: npt.ArrayLike, dst_pts: npt.ArrayLike, triangles: npt.ArrayLike
) -> tuple[F64, npt.NDArray[np.bool_]]:
    """Affine maps taking each destination triangle onto its source triangle.

    Args:
        src_pts, dst_pts: (P, 2) pixel coordinates (x, y).
        triangles: (T, 3) vertex indices into the point arrays.

    Returns:
        ``(coeffs, ok)``: (T, 2, 3) float64 with ``src = coeffs[t] @ [x, y, 1]``
        for destination pixel ``(x, y)``, and (T,) bool, False for triangles
        that are degenerate (zero area) in the destination (their coefficients
        are zeros).
    """
    dst = _as_points("dst_pts", dst_pts)
    src = _as_source(src_pts, dst)
    tri = _as_triangles(triangles, len(dst))
    inv, ok = _destination_inverses(dst, tri)
    return _apply_inverses(inv, ok, src, tri), ok


def _as_source(src_pts: npt.ArrayLike, dst: F64) -> F64:
    src = _as_points("src_pts", src_pts)
    if src.shape != dst.shape:
        raise InvalidArgumentError(f"src_pts {src.shape} and dst_pts {dst.shape} differ in shape")
    return src


def _as_triangles(triangles: npt.ArrayLike, n_points: int) -> npt.NDArray[np.intp]:
    tri = np.asarray(triangles)
    if (
        tri.ndim != 2
        or tri.shape[1] != 3
        or (tri.size and not np.issubdtype(tri.dtype, np.integer))
    ):
        raise InvalidArgumentError(
            f"triangles must be an int array of shape (T, 3), not {tri.shape}"
        )
    tri = tri.astype(np.intp, copy=False)
    if tri.size and (tri.min() < 0 or tri.max() >= n_points):
        raise InvalidArgumentError(f"triangle indices must be in [0, {n_points})")
    return tri


def _doubled(corners: F64) -> F64:
    """(T,) doubled signed areas ``(v1 - v0) × (v2 - v0)`` of triangles given by
    their corners (T, 3, 2)."""
    c = corners
    out: F64 = (c[:, 1, 0] - c[:, 0, 0]) * (c[:, 2, 1] - c[:, 0, 1]) - (
        c[:, 2, 0] - c[:, 0, 0]) * (c[:, 1, 1] - c[:, 0, 1])
    return out


def doubled_areas(points: npt.ArrayLike, triangles: npt.ArrayLike) -> F64:
    """(T,) float64 doubled signed areas ``(v1 - v0) × (v2 - v0)`` of ``triangles``
    (T, 3) vertex indices on ``points`` (P, 2) pixels: positive in the orientation
    :func:`delaunay` gives its triangles."""
    return _doubled(np.asarray(points, np.float64)[:, :2][np.asarray(triangles, np.intp)])


def _destination_inverses(dst: F64, tri: npt.NDArray[np.intp]) -> tuple[F64, npt.NDArray[np.bool_]]:
    """Per non-degenerate destination triangle the inverse (K, 3, 3) of its
    ``[x y 1]`` corner matrix, and the (T,) bool mask of those triangles: one
    inversion serves every source point set warped onto the same mesh."""
    d = dst[tri]  # (T, 3, 2)
    ok = np.abs(_doubled(d)) > MIN_AREA2
    a = np.concatenate([d[ok], np.ones((int(ok.sum()), 3, 1))], axis=2)  # (K, 3, 3)
    inv: F64 = np.linalg.inv(a) if len(a) else np.zeros((0, 3, 3))
    return inv, ok


def _apply_inverses(inv: F64, ok: npt.NDArray[np.bool_], src: F64,
                    tri: npt.NDArray[np.intp]) -> F64:
    """(T, 2, 3) affine coefficients (zeros for degenerate triangles) taking the
    destination triangles onto ``src``'s, from :func:`_destination_inverses`."""
    coeffs = np.zeros((len(tri), 2, 3), dtype=np.float64)
    if len(inv):
        m = inv @ src[tri[ok]]  # (K, 3, 2): [x y 1] @ m = src
        coeffs[ok] = m.transpose(0, 2, 1)
    return coeffs


def rasterize_triangles(
    dst_pts: npt.ArrayLike,
    triangles: npt.ArrayLike,
    region: Region,
    ok: npt.NDArray[np.bool_] | None = None,
) -> I32:
    """Label image of the destination triangles over ``region``.

    Args:
        dst_pts: (P, 2) pixel coordinates.
        triangles: (T, 3) vertex indices.
        region: ``(x0, y0, x1, y1)`` pixel box, end exclusive.
        ok: (T,) bool, triangles to draw (default all).

    Returns:
        (y1 - y0, x1 - x0) int32: triangle index + 1 at each pixel, 0 outside
        every triangle. Where triangles overlap the later index wins.
    """
    x0, y0, x1, y1 = _as_region(region)
    dst = _as_points("dst_pts", dst_pts)
    tri = np.asarray(triangles, dtype=np.intp).reshape(-1, 3)
    labels = np.zeros((y1 - y0, x1 - x0), dtype=np.int32)
    scale = float(1 << _SHIFT)
    local = np.round((dst - (x0, y0)) * scale)
    # Keep fixed-point coordinates inside int32 even for far-away points.
    lim = float(2**30)
    local = np.clip(local, -lim, lim).astype(np.int32)
    draw = np.ones(len(tri), dtype=bool) if ok is None else np.array(ok, dtype=bool)
    polys = local[tri]  # (T, 3, 2) int32 fixed point
    # Skip triangles entirely outside the region (vectorised bounding-box test).
    lo = polys.min(axis=1)
    hi = polys.max(axis=1)
    draw &= (hi[:, 0] >= -scale) & (hi[:, 1] >= -scale)
    draw &= (lo[:, 0] <= (x1 - x0) * scale) & (lo[:, 1] <= (y1 - y0) * scale)
    fill = cv2.fillConvexPoly
    for t in np.flatnonzero(draw).tolist():
        fill(labels, polys[t], t + 1, cv2.LINE_8, _SHIFT)
    return labels


def _fill_nearest(labels: I32) -> I32:
    """Give every 0 pixel the label of the nearest labelled pixel (5×5 Euclidean approx.)."""
    inside = labels > 0
    if inside.all() or not inside.any():
        return labels
    # Zero pixels of `src` are the sites; DIST_LABEL_PIXEL numbers them 1.. in raster order.
    src = (~inside).astype(np.uint8)
    _, nearest = cv2.distanceTransformWithLabels(
        src, cv2.DIST_L2, cv2.DIST_MASK_5, labelType=cv2.DIST_LABEL_PIXEL
    )
    site_labels = labels[inside]  # raster order, matches the site numbering
    out: I32 = site_labels[nearest.astype(np.intp) - 1].astype(np.int32)
    return out


def piecewise_affine_map(
    src_pts: npt.ArrayLike,
    dst_pts: npt.ArrayLike,
    triangles: npt.ArrayLike,
    region: Region,
    *,
    extrapolate: bool = False,
) -> tuple[F32, F32, npt.NDArray[np.bool_]]:
    """Dense ``cv2.remap`` maps of a piecewise-affine warp over a destination region.

    For every pixel of ``region`` inside a destination triangle, the source
    coordinate given by that triangle's affine (barycentric) map.

    Args:
        src_pts: (P, 2) source pixel coordinates (x, y), any float dtype.
        dst_pts: (P, 2) destination pixel coordinates, same point order.
        triangles: (T, 3) int vertex indices (e.g. from :func:`delaunay`).
        region: ``(x0, y0, x1, y1)`` destination pixel box, end exclusive.
        extrapolate: if True, pixels outside every triangle use the affine map of
            the nearest triangle instead of :data:`INVALID` (smooth continuation
            beyond the hull, handy under a feathered mask).

    Returns:
        ``(map_x, map_y, valid_mask)``: two (y1 - y0, x1 - x0) float32 arrays
        of absolute source coordinates in pixels, for ``cv2.remap`` of the source
        image into the region; and a bool array of the same shape, True where a
        destination triangle covers the pixel (rasterised conservatively: it
        includes pixels whose centre is up to about half a pixel outside the
        hull). Where ``valid_mask`` is False the maps hold :data:`INVALID`
        unless ``extrapolate``.
    """
    (maps,), valid = piecewise_affine_maps([src_pts], dst_pts, triangles, region,
                                           extrapolate=extrapolate)
    return maps[0], maps[1], valid


def piecewise_affine_maps(
    src_sets: Sequence[npt.ArrayLike],
    dst_pts: npt.ArrayLike,
    triangles: npt.ArrayLike,
    region: Region,
    *,
    extrapolate: bool = False,
) -> tuple[list[tuple[F32, F32]], npt.NDArray[np.bool_]]:
    """:func:`piecewise_affine_map` for several source point sets sharing one
    destination mesh: the triangles are rasterised once.

    Returns ``([(map_x, map_y) per source set], valid_mask)``.
    """
    x0, y0, x1, y1 = _as_region(region)
    dst = _as_points("dst_pts", dst_pts)
    sources = [_as_source(p, dst) for p in src_sets]
    tri = _as_triangles(triangles, len(dst))
    inv, ok = _destination_inverses(dst, tri)
    tables = []
    for src in sources:
        coeffs = _apply_inverses(inv, ok, src, tri)
        # Shift the constant term to region-local pixel coordinates to keep precision;
        # row 0 is the "outside every triangle" entry. Per axis, one float32 table of
        # (T + 1,) for each of the x, y and constant coefficients: three small
        # gathers per axis instead of a float64 (h, w, 3) one.
        table = np.empty((2, 3, len(coeffs) + 1), dtype=np.float32)
        table[:, :, 0] = ((0.0, 0.0, INVALID), (0.0, 0.0, INVALID))
        table[:, :2, 1:] = coeffs[:, :, :2].transpose(1, 2, 0)
        table[:, 2, 1:] = (coeffs[:, :, 2] + coeffs[:, :, 0] * x0 + coeffs[:, :, 1] * y0).T
        tables.append(table)
    labels = rasterize_triangles(dst, tri, (x0, y0, x1, y1), ok)
    valid = labels > 0
    if extrapolate:
        labels = _fill_nearest(labels)
    # (Every gather below would convert int32 indices to intp again: once here.
    # They index the tables' rows 0..T by construction: no bounds check needed.)
    index = labels.astype(np.intp)
    xs = np.arange(x1 - x0, dtype=np.float32)[None, :]
    ys = np.arange(y1 - y0, dtype=np.float32)[:, None]
    maps: list[tuple[F32, F32]] = []
    for table in tables:
        per_axis = []
        for axis in (0, 1):
            a, b, c = (np.take(table[axis, k], index, mode="clip") for k in range(3))
            a *= xs
            b *= ys
            a += b
            a += c
            per_axis.append(a)
        maps.append((per_axis[0], per_axis[1]))
    return maps, valid


def remap_region(
    image: npt.NDArray[Any],
    map_x: F32,
    map_y: F32,
    *,
    interpolation: int = cv2.INTER_LINEAR,
    border_mode: int = cv2.BORDER_REFLECT_101,
) -> npt.NDArray[Any]:
    """Sample ``image`` at the map coordinates (bilinear, reflected border).

    Args:
        image: (H, W) or (H, W, C) uint8/float32 source image.
        map_x, map_y: (h, w) float32 absolute source coordinates in pixels
            (from :func:`piecewise_affine_map`).

    Returns:
        (h, w[, C]) array of ``image``'s dtype: ``out[i, j] = image(map_y[i, j], map_x[i, j])``.
    """
    if map_x.shape != map_y.shape or map_x.ndim != 2:
        raise InvalidArgumentError(
            f"map_x {map_x.shape} and map_y {map_y.shape} must be equal 2-D shapes"
        )
    mx = np.asarray(map_x, dtype=np.float32)
    my = np.asarray(map_y, dtype=np.float32)
    out: npt.NDArray[Any] = np.asarray(
        cv2.remap(image, mx, my, interpolation, borderMode=border_mode)
    )
    return out


def delaunay(points: npt.ArrayLike, rect: Region | None = None) -> I32:
    """Delaunay triangulation of ``points`` (fallback when no mesh topology exists).

    Args:
        points: (P, 2) pixel coordinates; duplicates are merged (the first index wins).
        rect: ``(x0, y0, x1, y1)`` box containing the points; grown to contain
            them all if needed (default: their bounding box). Only its extent
            matters; the result tiles exactly the points' convex hull.

    Returns:
        (T, 3) int32 vertex indices; every triangle has non-zero area and the
        same orientation: ``(v1 - v0) × (v2 - v0) > 0`` in pixel coordinates.
    """
    pts = _as_points("points", points)
    if len(pts) < 3:
        return np.zeros((0, 3), dtype=np.int32)
    lo = pts.min(axis=0)
    hi = pts.max(axis=0)
    if rect is not None:
        rx0, ry0, rx1, ry1 = (float(v) for v in rect)
        lo = np.minimum(lo, (rx0, ry0))
        hi = np.maximum(hi, (rx1, ry1))
    # Subdiv2D builds on a super-triangle around this rect; if it is too close to
    # the points, thin convex-hull triangles come out attached to its virtual
    # vertices and are lost. A margin of 1000× the extent keeps them (checked on
    # random point sets: 10× loses up to 2 px², 100× up to 0.07 px², 1000× none).
    extent = int(np.ceil(max(hi[0] - lo[0], hi[1] - lo[1])))
    margin = min(1000 * extent + 16, _MAX_SUBDIV_MARGIN)
    bx0, by0 = int(np.floor(lo[0])) - margin, int(np.floor(lo[1])) - margin
    bw = int(np.ceil(hi[0])) + margin - bx0
    bh = int(np.ceil(hi[1])) + margin - by0
    subdiv = cv2.Subdiv2D((bx0, by0, bw, bh))
    p32 = np.ascontiguousarray(pts.astype(np.float32) + np.float32(0.0))  # -0.0 → 0.0
    # Each point's float32 (x, y) bit pattern as one int64 key: duplicates merge
    # (the first index wins) and triangle corners map back to indices by search.
    keys = p32.view(np.int64).reshape(-1)
    uniq, first = np.unique(keys, return_index=True)
    subdiv.insert([tuple(v) for v in p32[np.sort(first)].tolist()])
    tris = np.ascontiguousarray(
        np.asarray(subdiv.getTriangleList(), dtype=np.float32).reshape(-1, 3, 2))
    corner = tris.view(np.int64).reshape(-1, 3)
    pos = np.clip(np.searchsorted(uniq, corner), 0, len(uniq) - 1)
    found = uniq[pos] == corner
    ids = first[pos]
    # Drop triangles touching Subdiv2D's virtual outer vertices (no match) or
    # degenerate in indices.
    keep = found.all(axis=1) & (ids[:, 0] != ids[:, 1]) & (ids[:, 1] != ids[:, 2]) & (
        ids[:, 0] != ids[:, 2])
    if not keep.any():
        return np.zeros((0, 3), dtype=np.int32)
    result = ids[keep].astype(np.int32)
    cross = _doubled(pts[result])
    result = result[np.abs(cross) > MIN_AREA2]
    flip = cross[np.abs(cross) > MIN_AREA2] < 0
    result[flip] = result[flip][:, [0, 2, 1]]
    # Hull slivers the finite super-triangle dropped go back (facefuse.imaging.hull).
    out: I32 = complete_to_hull(pts, result.astype(np.int32), np.sort(first))
    return out
