"""Alignment templates and similarity warps that cut model chips out of photos.

Coordinates are pixels, x right and y down; a pixel's centre sits on integer
coordinates (dlib's and OpenCV's convention). Every transform is a (2, 3)
float64 affine ``M`` that maps image pixels to chip pixels.

dlib's face chip (``dlib.get_face_chip`` / ``get_face_chip_details``) is
reproduced exactly, given the same points:

1. A least-squares similarity (Umeyama) is fitted from the template, placed in
   a ``size`` px chip as ``(padding + t) / (1 + 2 * padding) * size``, to the
   image points.
2. dlib turns it into a rotated rectangle of side ``size * scale`` centred on
   the image of chip point ``size / 2``, whose corner *pixels* become chip
   pixels ``0`` and ``size - 1``. So a template point ``u`` lands on chip
   pixel ``(size - 1) / 2 + (u - size / 2) * k``, ``k = scale * (size - 1) /
   (size * scale - 1)`` — half a pixel up-left of ``u`` and up to ``1/size``
   closer to the centre (:func:`chip_transform` folds this in).
3. When the chip is more than 2× smaller than its image region, dlib first
   halves the region with its 5×5 Gaussian pyramid (``pyramid_down<2>``,
   integer arithmetic, including its quarter-pixel offset), then samples
   bilinearly, truncating to uint8; samples whose 2×2 neighbourhood leaves the
   image are black (:func:`warp_chip`).

Given dlib's own 5 landmarks, ``warp_chip(image, chip_transform(points,
DLIB_FIVE_POINT_TEMPLATE), 150)`` is bit-identical to ``dlib.get_face_chip``.

The geometric constants below come from dlib's BSL-licensed
``dlib/image_transforms/interpolation.h`` (the 5-point template) and from
insightface's ``face_align.py`` (the ArcFace template); they are geometry, not
model weights.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from facefuse.errors import InvalidArgumentError
from facefuse.faces.types import MESH_FIVE_POINTS

# ----------------------------------------------------------------------------------------
# Templates
# ----------------------------------------------------------------------------------------

#: dlib's 5-point face template in its normalised face frame (the face spans
#: about [0, 1] × [0, 1]), in the order of dlib's 5-point shape predictor:
#: image-right eye outer corner, image-right eye inner corner, image-left eye
#: outer corner, image-left eye inner corner, nose base.
DLIB_FIVE_POINT_TEMPLATE: np.ndarray = np.array(
    [
        [0.8595674595992, 0.2134981538014],
        [0.6460604764104, 0.2289674387677],
        [0.1205750620789, 0.2137274526848],
        [0.3340850613712, 0.2290642403242],
        [0.4901123135679, 0.6277975316475],
    ]
)

#: Where the five mesh points :data:`~facefuse.faces.types.MESH_FIVE_POINTS`
#: (263, 362, 33, 133, 2) of the iris-refined MediaPipe mesh sit, on average,
#: in dlib's normalised face frame. Measured: the mesh points of 40 faces (the
#: sample photos, flipped, rotated ±10° and rescaled ×0.5/×1.7) mapped through
#: the chip transform that dlib's own 5-point predictor gives for the same
#: face, averaged and mirror-symmetrised. Against dlib's template the mesh's
#: nose point 2 sits higher (0.590 vs 0.628) and the refined eye corners match
#: to ~0.005. Fitting the mesh to this template instead of dlib's lowers the
#: embedding drift from dlib's own chips (see tests/unit/test_align.py).
MESH_FIVE_POINT_TEMPLATE: np.ndarray = np.array(
    [
        [0.8624, 0.2211],
        [0.6450, 0.2251],
        [0.1226, 0.2211],
        [0.3400, 0.2251],
        [0.4925, 0.5897],
    ]
)


def template_in_chip(template: np.ndarray, size: int, padding: float) -> np.ndarray:
    """A normalised face template placed in a ``size`` px chip with ``padding``.

    ``(padding + t) / (1 + 2 * padding) * size``, as dlib's
    ``get_face_chip_details`` does. Returns (K, 2) float64 chip coordinates.
    """
    t = np.asarray(template, np.float64)
    return (padding + t) / (1.0 + 2.0 * padding) * float(size)


#: dlib's 5-point template in its 150 px recognition chip (padding 0.25), in the
#: coordinates dlib fits the similarity to: image-right eye outer (110.957,
#: 46.350), inner (89.606, 47.897); image-left eye outer (37.058, 46.373), inner
#: (58.409, 47.906); nose base (74.011, 87.780). In chip *pixels* these land
#: about half a pixel up-left (see step 2 above and :func:`chip_transform`).
DLIB_CHIP_150: np.ndarray = template_in_chip(DLIB_FIVE_POINT_TEMPLATE, 150, 0.25)

#: The standard 5-point ArcFace template for 112×112 chips (insightface
#: ``arcface_dst``): subject's right eye (image left), left eye, nose tip, right
#: mouth corner, left mouth corner.
ARCFACE_112: np.ndarray = np.array(
    [
        [38.2946, 51.6963],
        [73.5318, 51.5014],
        [56.0252, 71.7366],
        [41.5493, 92.3655],
        [70.7299, 92.2041],
    ]
)

#: The ArcFace template for 128×128 chips as inswapper uses it (FaceFusion's
#: ``arcface_128_v2``): insightface's ``estimate_norm`` convention for sizes that
#: are multiples of 128 scales by ``size / 128`` (here 1) and shifts x by
#: ``8 * size / 128``, i.e. ``ARCFACE_112 + (8, 0)`` — not a 128/112 rescale.
ARCFACE_128: np.ndarray = ARCFACE_112 + np.array([8.0, 0.0])


# ----------------------------------------------------------------------------------------
# Transforms
# ----------------------------------------------------------------------------------------


def similarity_transform(
    src: np.ndarray, dst: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """Least-squares similarity (rotation, uniform scale, translation) ``src → dst``.

    Umeyama's method, without reflection (in closed form for equal weights).
    Args: ``src``, ``dst`` (K, 2) points (K ≥ 2), optional (K,) non-negative
    weights. Returns (2, 3) float64 ``M`` with ``dst ≈ M @ [x, y, 1]``.
    """
    s = np.asarray(src, np.float64)
    d = np.asarray(dst, np.float64)
    if s.ndim != 2 or s.shape[1] != 2 or s.shape != d.shape or len(s) < 2:
        raise InvalidArgumentError(
            f"need two matching (K>=2, 2) point sets, got {s.shape} and {d.shape}"
        )
    if weights is None:
        return _similarity_unweighted(s, d)
    w = np.asarray(weights, np.float64)
    if w.shape != (len(s),) or np.any(w < 0) or w.sum() <= 0:
        raise InvalidArgumentError("weights must be K non-negative numbers with a positive sum")
    w = w / w.sum()
    mu_s = w @ s
    mu_d = w @ d
    xs, xd = s - mu_s, d - mu_d
    var_s = float(w @ (xs**2).sum(axis=1))
    if var_s <= 0:
        raise InvalidArgumentError("source points are all the same")
    cov = (xd * w[:, None]).T @ xs
    u, sv, vt = np.linalg.svd(cov)
    flip = np.eye(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        flip[1, 1] = -1.0
    rot = u @ flip @ vt
    scale = float((sv * np.diag(flip)).sum()) / var_s
    t = mu_d - scale * rot @ mu_s
    return np.hstack([scale * rot, t[:, None]])


def _similarity_unweighted(s: np.ndarray, d: np.ndarray) -> np.ndarray:
    """:func:`similarity_transform` with equal weights, in closed form: in 2-D the
    best rotation and scale are ``(Σ xs·xd, Σ xs × xd) / Σ |xs|²`` of the centred
    points, the same optimum Umeyama's SVD (with its reflection guard) reaches, at a
    tenth of the cost on the few points the fusion fits (to rounding error)."""
    mu_s = s.mean(axis=0)
    mu_d = d.mean(axis=0)
    xs, xd = s - mu_s, d - mu_d
    var_s = float((xs * xs).sum())
    if var_s <= 0:
        raise InvalidArgumentError("source points are all the same")
    a = float((xs * xd).sum()) / var_s
    b = float((xs[:, 0] * xd[:, 1] - xs[:, 1] * xd[:, 0]).sum()) / var_s
    m0x, m0y = float(mu_s[0]), float(mu_s[1])
    return np.array([[a, -b, float(mu_d[0]) - (a * m0x - b * m0y)],
                     [b, a, float(mu_d[1]) - (b * m0x + a * m0y)]])


def invert_affine(M: np.ndarray) -> np.ndarray:
    """Inverse of a (2, 3) affine."""
    A = np.asarray(M, np.float64)[:, :2]
    t = np.asarray(M, np.float64)[:, 2]
    Ai = np.linalg.inv(A)
    return np.hstack([Ai, (-Ai @ t)[:, None]])


def transform_points(M: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply a (2, 3) affine to (K, 2+) points (extra columns ignored) → (K, 2) float64."""
    p = np.asarray(points, np.float64)[:, :2]
    A = np.asarray(M, np.float64)
    return p @ A[:, :2].T + A[:, 2]


def chip_transform(
    points: np.ndarray, template: np.ndarray, size: int = 150, padding: float = 0.25
) -> np.ndarray:
    """The image → chip affine that dlib's ``get_face_chip_details`` + ``extract_image_chip``
    use for ``points`` (K, 2) image pixels matching ``template`` (K, 2, normalised).

    dlib fits ``template_in_chip → points`` (least squares in image space), then
    maps the corner pixels of the rotated rectangle of side ``size * scale``
    centred on the chip centre to chip pixels ``0`` and ``size - 1``. Returns
    (2, 3) float64.
    """
    if size < 2:
        raise InvalidArgumentError(f"chip size must be >= 2, got {size}")
    n = float(size)
    fit = similarity_transform(template_in_chip(template, size, padding), points)
    A, t = fit[:, :2], fit[:, 2]
    scale = math.hypot(A[0, 0], A[1, 0])
    centre = A @ np.array([n / 2.0, n / 2.0]) + t
    # chip pixel q → image: centre + A (q - (n-1)/2) * (n*scale - 1) / ((n-1)*scale)
    k = (n * scale - 1.0) / ((n - 1.0) * scale)
    chip_to_image = np.hstack([A * k, (centre - A @ np.full(2, (n - 1.0) / 2.0) * k)[:, None]])
    return invert_affine(chip_to_image)


def dlib_chip_transform(
    landmarks: np.ndarray, size: int = 150, padding: float = 0.25
) -> np.ndarray:
    """Image → dlib-style face chip affine from the MediaPipe mesh.

    Args:
        landmarks: (468 or 478, 2+) mesh landmarks in image pixels (iris-refined
            eye contours give the best match; see :data:`MESH_FIVE_POINT_TEMPLATE`).
        size: chip side in pixels (150 for the recognition network).
        padding: dlib's padding around the face (0.25 for recognition).

    Returns:
        (2, 3) float64 ``M`` for :func:`warp_chip`.
    """
    lm = np.asarray(landmarks)
    if lm.ndim != 2 or lm.shape[0] < 468 or lm.shape[1] < 2:
        raise InvalidArgumentError(f"expected (468|478, 2|3) mesh landmarks, got {lm.shape}")
    pts = lm[list(MESH_FIVE_POINTS), :2].astype(np.float64)
    if not np.all(np.isfinite(pts)):
        raise InvalidArgumentError("mesh landmarks contain non-finite values")
    return chip_transform(pts, MESH_FIVE_POINT_TEMPLATE, size, padding)


# ----------------------------------------------------------------------------------------
# Warping
# ----------------------------------------------------------------------------------------


def pyramid_down(img: np.ndarray) -> np.ndarray:
    """dlib's ``pyramid_down<2>``: separable [1 4 6 4 1] filter, every other pixel,
    integer sums truncated by /256. (H, W[, C]) uint8 → ((H-3)//2, (W-3)//2[, C]).

    Output pixel (r, c) is centred on input (2r + 2, 2c + 2), i.e. pixel (r + 1,
    c + 1) of OpenCV's ``pyrDown`` (the same 5×5 kernel, centred on 2r, 2c); those
    never reach the border. On float32 input ``pyrDown`` adds and scales by 1/256
    exactly (the sums are integers of at most 16 × 16 × 255 = 65280), so the
    truncating cast gives dlib's integer result bit for bit, about 10× faster than
    filtering in numpy.
    """
    rows = (img.shape[0] - 3) // 2
    cols = (img.shape[1] - 3) // 2
    down = cv2.pyrDown(img.astype(np.float32))  # drops a single channel's axis
    out = down[1 : rows + 1, 1 : cols + 1].astype(np.uint8)
    return out.reshape((rows, cols, *img.shape[2:]))


def _sample_bilinear(src: np.ndarray, A: np.ndarray, size: int) -> np.ndarray:
    """Chip pixel (x, y) ← bilinear ``src`` at ``A @ [x, y, 1]``; truncated to uint8,
    black where the 2×2 neighbourhood leaves ``src`` (dlib's ``interpolate_bilinear``).

    float64 with dlib's operation order (so truncation matches it bit for bit), one
    channel plane at a time: the four neighbours are gathered as uint8 from the
    contiguous plane and every arithmetic step runs over the chip's pixels in one
    flat loop (a pixel's three channels as the inner axis would make each step a
    broadcast over runs of 3). ``warp_chip`` on the five sample photos (150 px RGB
    chips, interleaved): 1.35-2.02 ms → 0.79-1.45 ms.
    """
    h, w = src.shape[:2]
    if h < 2 or w < 2:  # no 2×2 neighbourhood anywhere: all black, as dlib's
        return np.zeros((size, size, *src.shape[2:]), np.uint8)
    ys, xs = np.mgrid[0:size, 0:size]
    px = A[0, 0] * xs.ravel() + A[0, 1] * ys.ravel() + A[0, 2]  # float64 (size²,)
    py = A[1, 0] * xs.ravel() + A[1, 1] * ys.ravel() + A[1, 2]
    left = np.floor(px)
    top = np.floor(py)
    outside = ~((left >= 0) & (top >= 0) & (left + 1 < w) & (top + 1 < h))
    idx = (np.clip(top, 0, max(h - 2, 0)) * w + np.clip(left, 0, max(w - 2, 0)))
    idx = idx.astype(np.intp)
    fx = px - left
    fy = py - top
    gx = 1 - fx
    gy = 1 - fy
    product = np.empty(idx.shape, np.float64)
    planes = [src] if src.ndim == 2 else cv2.split(src)
    out = []
    for plane in planes:
        flat = plane.ravel()  # a view of a contiguous plane, else a copy
        top_row = flat.take(idx).astype(np.float64)
        top_row *= gx
        np.multiply(fx, flat.take(idx + 1), out=product)
        top_row += product
        bottom_row = flat.take(idx + w).astype(np.float64)
        bottom_row *= gx
        np.multiply(fx, flat.take(idx + w + 1), out=product)
        bottom_row += product
        top_row *= gy
        bottom_row *= fy
        top_row += bottom_row
        np.clip(top_row, 0.0, 255.0, out=top_row)
        chan = top_row.astype(np.uint8)  # non-negative: the cast truncates like floor
        chan[outside] = 0
        out.append(chan.reshape(size, size))
    chip: np.ndarray = out[0] if src.ndim == 2 else np.stack(out, axis=2)
    return chip


def warp_chip(image: np.ndarray, M: np.ndarray, size: int) -> np.ndarray:
    """Cut a ``size``×``size`` chip out of ``image`` with the image → chip affine ``M``.

    Samples like dlib's ``extract_image_chip``: when the chip is more than 2×
    smaller than its image region, the region is first reduced with dlib's
    Gaussian pyramid (so large faces do not alias), then sampled bilinearly;
    outside the image is black.

    Args:
        image: (H, W, C) or (H, W) uint8.
        M: (2, 3) affine, image pixels → chip pixels (e.g. :func:`dlib_chip_transform`).
        size: chip side in pixels.

    Returns:
        (size, size, C) or (size, size) uint8.
    """
    img = np.asarray(image)
    if img.dtype != np.uint8 or img.ndim not in (2, 3) or min(img.shape[:2]) < 1:
        raise InvalidArgumentError(
            f"expected a uint8 (H, W[, C]) image, got {img.dtype} {img.shape}"
        )
    if size < 2:
        raise InvalidArgumentError(f"chip size must be >= 2, got {size}")
    Minv = invert_affine(M)  # chip → image
    n = size
    h_img, w_img = img.shape[:2]
    # dlib picks the pyramid level from the chip's region in the image: halve while
    # the halved region still has more pixels than the chip.
    w = (n - 1) * math.hypot(Minv[0, 0], Minv[1, 0]) + 1.0
    h = (n - 1) * math.hypot(Minv[0, 1], Minv[1, 1]) + 1.0
    levels = 0
    while ((w - 1) / 2 + 1) * ((h - 1) / 2 + 1) > n * n:
        w, h = (w - 1) / 2 + 1, (h - 1) / 2 + 1
        levels += 1
    grow = 2.0
    for _ in range(levels):
        grow = grow * 2 + 2
    corners = transform_points(Minv, np.array([[0, 0], [n - 1, 0], [0, n - 1], [n - 1, n - 1]]))
    lo = np.maximum(corners.min(axis=0) - grow, 0.0)
    hi = np.minimum(corners.max(axis=0) + grow, [w_img - 1.0, h_img - 1.0])
    x0, y0 = (math.floor(float(v) + 0.5) for v in lo)  # dlib rounds the box to pixels
    x1, y1 = (math.floor(float(v) + 0.5) for v in hi)
    shape = (n, n, *img.shape[2:])
    if x1 < x0 or y1 < y0:  # the chip does not touch the image
        return np.zeros(shape, np.uint8)
    src = img[y0 : y1 + 1, x0 : x1 + 1]
    A = Minv.copy()
    A[:, 2] -= (x0, y0)
    for _ in range(levels):
        if min(src.shape[:2]) <= 8:  # dlib gives up on tiny regions
            return np.zeros(shape, np.uint8)
        src = pyramid_down(src)
        # dlib's pyramid_down<2>::point_down: p / 2 - (1.25, 0.75)
        A = A / 2.0
        A[:, 2] -= (1.25, 0.75)
    return _sample_bilinear(np.ascontiguousarray(src), A, n)
