"""Low-order lighting of a face from its mesh: second-order spherical harmonics.

A face under distant light is, to first approximation, a Lambertian surface of
near-constant skin albedo; its irradiance is captured by the 9 real spherical
harmonics of the surface normal (Ramamoorthi & Hanrahan 2001), and Bitouk et al.
(2008) relight swapped faces this way. The mesh gives normals for free:

1. per-vertex normals (N, 3) from the mesh's triangles, oriented toward the
   camera, in a frame with x right, y up, z toward the viewer;
2. the observed colour at reliably-skin vertices (see
   :func:`facefuse.fusion.swappers.classic.occlusion.skin_vertices`) is fitted per channel as
   ``Y(n) @ c`` — ``c`` (9, 3) absorbs the constant albedo — by ridge-regularised
   least squares (the first and second bands are damped: a face shows only a
   hemisphere of normals, so the fit is otherwise ill-conditioned);
3. relighting a source face into a target scene multiplies the source's colour at
   each vertex by ``shading_target(n_fused) / shading_source(n_source)``: the
   source's own lighting is divided out and the target's multiplied in, while the
   albedo (skin tone, freckles, identity) stays the source's.

All landmark arrays are (N, 3) pixels (x right, y down, z depth in the same
scale with smaller z nearer the camera, as the face mesh returns them).
"""

from __future__ import annotations

import cv2
import numpy as np

from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.swappers.classic.detail import LUMA
from facefuse.fusion.swappers.classic.occlusion import skin_vertices
from facefuse.imaging.channels import each_channel
from facefuse.imaging.stats import median

#: Ridge weight on the first and second SH bands (the basis values are O(1));
#: the constant term is free.
RIDGE = (0.0, 0.02, 0.02, 0.02, 0.1, 0.1, 0.1, 0.1, 0.1)
#: The shading never falls below this share of its mean: no division blow-ups at
#: grazing normals.
MIN_SHADING = 0.25
#: Clamp on the per-vertex relighting gain.
MAX_GAIN = 3.0
#: Fewer usable skin vertices than this and a face's lighting is not estimated.
MIN_FIT_VERTICES = 40
#: Vertex colours are averaged over this share of the eye distance.
COLOUR_RADIUS_FRACTION = 0.04


def vertex_normals(points: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Unit per-vertex normals (N, 3) of a mesh, oriented toward the camera.

    Args:
        points: (N, 3) mesh in image pixels (x right, y down, z away from camera).
        triangles: (T, 3) int vertex indices (any winding).
    Returns:
        (N, 3) float64 in the SH frame: x right, y up, z toward the viewer.
    """
    p = np.asarray(points, np.float64)
    a, b, c = p[triangles[:, 0]], p[triangles[:, 1]], p[triangles[:, 2]]
    n = np.cross(b - a, c - a)  # area-weighted face normals
    n[n[:, 2] > 0] *= -1.0  # toward the camera: negative z in the mesh's frame
    idx = triangles.reshape(-1)
    rep = np.repeat(n, 3, axis=0)
    acc = np.stack([np.bincount(idx, rep[:, c], minlength=len(p)) for c in range(3)],
                   axis=1).astype(np.float64)
    acc[:, 1:] *= -1.0  # to x right, y up, z toward the viewer
    norm = np.linalg.norm(acc, axis=1, keepdims=True)
    out: np.ndarray = np.where(norm > 0, acc / np.maximum(norm, 1e-12), [0.0, 0.0, 1.0])
    return out


def sh_basis(normals: np.ndarray) -> np.ndarray:
    """The 9 real spherical harmonics (unnormalised) of unit normals (N, 3) → (N, 9)."""
    x, y, z = normals[:, 0], normals[:, 1], normals[:, 2]
    one = np.ones_like(x)
    return np.stack([one, x, y, z, x * y, x * z, y * z, x * x - y * y, 3 * z * z - 1], axis=1)


def vertex_colours(image: np.ndarray, points: np.ndarray, radius: float) -> np.ndarray:
    """Colours (N, 3) float64 of ``image`` (H, W, 3) at ``points`` (N, ≥2) pixels,
    averaged over about ``radius`` pixels (so a vertex reads its neighbourhood, not
    one pore): sampled bilinearly from an area-downsampled copy."""
    h, w = image.shape[:2]
    k = max(1.0, float(radius))
    small = cv2.resize(image, (max(1, round(w / k)), max(1, round(h / k))),
                       interpolation=cv2.INTER_AREA).astype(np.float32)
    fx, fy = small.shape[1] / w, small.shape[0] / h
    xy = np.asarray(points, np.float32)[:, :2]
    mx = ((xy[:, 0:1] + 0.5) * fx - 0.5).astype(np.float32)
    my = ((xy[:, 1:2] + 0.5) * fy - 0.5).astype(np.float32)
    out = cv2.remap(small, mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT_101)
    return np.asarray(out, np.float64).reshape(len(xy), 3)


def fit_lighting(colours: np.ndarray, normals: np.ndarray) -> np.ndarray:
    """SH lighting (9, 3) with ``colours ≈ sh_basis(normals) @ coeffs``.

    Args:
        colours: (K, 3) observed RGB (0..255) at K skin vertices.
        normals: (K, 3) their unit normals (SH frame).
    """
    Y = sh_basis(normals)
    A = Y.T @ Y / len(Y) + np.diag(RIDGE)  # the basis is O(1): the ridge is relative
    B = Y.T @ colours / len(Y)
    coeffs: np.ndarray = np.linalg.solve(A, B)
    return coeffs


def shading(coeffs: np.ndarray, normals: np.ndarray) -> np.ndarray:
    """(N, 3) shading of the lighting ``coeffs`` (9, 3) at ``normals`` (N, 3),
    floored at :data:`MIN_SHADING` of its constant term."""
    s = sh_basis(normals) @ coeffs
    floor = MIN_SHADING * np.maximum(coeffs[0], 1.0)
    out: np.ndarray = np.maximum(s, floor)
    return out


def relight_gains(
    source_coeffs: np.ndarray,
    source_normals: np.ndarray,
    target_coeffs: np.ndarray,
    fused_normals: np.ndarray,
) -> np.ndarray:
    """Per-vertex RGB gains (N, 3): target shading at the fused normals over the
    source's shading at its own normals, clamped to [1/:data:`MAX_GAIN`, :data:`MAX_GAIN`]."""
    g = shading(target_coeffs, fused_normals) / shading(source_coeffs, source_normals)
    out: np.ndarray = np.clip(g, 1.0 / MAX_GAIN, MAX_GAIN)
    return out


def directional_error(coeffs: np.ndarray) -> float:
    """How directional a lighting is: the norm of the first-band (linear) terms over
    the constant term, mean over channels (0 for perfectly even light)."""
    dc = np.maximum(np.abs(coeffs[0]), 1e-6)
    return float(np.mean(np.linalg.norm(coeffs[1:4], axis=0) / dc))


def face_lighting(image: np.ndarray, landmarks: np.ndarray, normals: np.ndarray,
                  occluders: np.ndarray | None = None) -> np.ndarray | None:
    """SH lighting (9, 3) of the face ``landmarks`` (N, 3) in ``image`` (H, W, 3),
    fitted on its reliably-skin vertices that are inside the image and not under
    ``occluders`` (H, W) > 0.5; None when too few remain."""
    idx = skin_vertices(landmarks)
    h, w = image.shape[:2]
    xy = landmarks[idx, :2]
    ok = (xy[:, 0] >= 0) & (xy[:, 0] <= w - 1) & (xy[:, 1] >= 0) & (xy[:, 1] <= h - 1)
    idx = idx[ok]
    if occluders is not None and len(idx):
        xi = np.round(landmarks[idx, 0]).astype(int)
        yi = np.round(landmarks[idx, 1]).astype(int)
        idx = idx[occluders[yi, xi] <= 0.5]
    if len(idx) < MIN_FIT_VERTICES:
        return None
    cols = vertex_colours(image, landmarks[idx], COLOUR_RADIUS_FRACTION * eye_distance(landmarks))
    return fit_lighting(cols, normals[idx])


def source_lighting(source_img: np.ndarray, source_lm: np.ndarray, triangles: np.ndarray,
                    source_occluders: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """The source face's side of :func:`layer_gains`: its vertex normals (M, 3) on
    ``triangles`` and its SH lighting (9, 3), or None (M = ``len(source_lm)``). It
    depends on the source and the triangles alone: a clip whose frames share
    their triangulation keeps it in the source's memo."""
    n_s = vertex_normals(source_lm, triangles)
    return n_s, face_lighting(source_img, source_lm, n_s, source_occluders)


def layer_gains(
    source_img: np.ndarray,
    source_lm: np.ndarray,
    target_img: np.ndarray,
    target_lm: np.ndarray,
    fused_lm: np.ndarray,
    triangles: np.ndarray,
    source_occluders: np.ndarray | None = None,
    target_occluders: np.ndarray | None = None,
    source: tuple[np.ndarray, np.ndarray | None] | None = None,
) -> np.ndarray:
    """Per-vertex RGB gains (M, 3) that relight the source face into the target's
    lighting on the fused mesh (M = ``len(fused_lm)``); all ones when either
    lighting cannot be estimated. Landmarks in each image's own frame; ``source``:
    :func:`source_lighting` of the first M source points when the caller kept it."""
    m = len(fused_lm)
    n_s, c_s = (source if source is not None else
                source_lighting(source_img, source_lm[:m], triangles, source_occluders))
    n_t = vertex_normals(target_lm[:m], triangles)
    n_f = vertex_normals(fused_lm[:m], triangles)
    c_t = face_lighting(target_img, target_lm[:m], n_t, target_occluders)
    if c_s is None or c_t is None:
        return np.ones((m, 3))
    return relight_gains(c_s, n_s, c_t, n_f)


#: Pixels of the source darker than these shares of its skin's median luma (a
#: ramp from the second to the first) are hair, lashes, nostrils, not skin: they
#: keep their own hue when the skin takes the target's tone.
DARK_HUE = (0.35, 0.6)


#: Lowest factor the dark pixels' own saturation is scaled by.
SATURATION_FLOOR = 0.5


def _saturation(layer: np.ndarray, where: np.ndarray) -> float:
    """Median chroma (max − min channel over their mean) of ``layer`` (h, w, 3) on
    ``where`` (h, w) bool, read on every other pixel of every other row."""
    px = layer[::2, ::2][where[::2, ::2]]
    if not len(px):
        return 0.0
    chroma = (px.max(1) - px.min(1)) / (px.mean(1) + 1.0)
    return float(median(chroma))


def keep_dark_hue(relit: np.ndarray, before: np.ndarray, skin: np.ndarray) -> None:
    """Give the dark, non-skin pixels of a relit source layer their own hue back.

    ``relit`` (h, w, 3) float32 (changed in place) is ``before`` (h, w, 3) float32
    after the per-channel gains that give the source's skin the target's tone and
    light; ``skin`` (h, w) > 0.5 where the skin's median luma is read. On brows,
    lashes or stubble those gains are wrong (a dark source's brows on a fair
    target turned blue-grey): pixels darker than :data:`DARK_HUE` of the skin take
    the relit luma with their own hue, their saturation scaled by the square root of
    the skin's (its relit median chroma over its own, at least
    :data:`SATURATION_FLOOR`, never raised): on a muted photo a vivid source's warm
    brows and lids at their own saturation looked painted red.
    """
    y_before = before @ LUMA
    inside = skin > 0.5
    if not inside.any():
        return
    ref = float(median(y_before[::2, ::2][inside[::2, ::2]]))
    lo, hi = DARK_HUE
    dark = np.clip((hi * ref - y_before) / max(1e-3, (hi - lo) * ref), 0.0, 1.0)
    x, y, w, h = cv2.boundingRect((dark > 0).view(np.uint8))
    if w == 0 or h == 0:
        return
    box = (slice(y, y + h), slice(x, x + w))
    r, b, d = relit[box], before[box], each_channel(dark[box])
    own = b * each_channel((r @ LUMA + 1.0) / (y_before[box] + 1.0))
    # Their own hue, at the target photo's saturation: warm brows kept at a vivid
    # source's saturation looked painted red on a cold, muted target.
    # (Half-way, in ratio: the square root of the skin's own change.)
    k = float(np.sqrt(_saturation(relit, inside) / max(_saturation(before, inside), 1e-3)))
    if k < 1.0:
        y_own = each_channel(own @ LUMA)
        own -= y_own
        own *= np.float32(max(k, SATURATION_FLOOR))
        own += y_own
    r += d * (own - r)
