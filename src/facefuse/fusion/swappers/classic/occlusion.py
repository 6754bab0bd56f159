"""What inside a face is not its skin: per-face skin-colour models and occluder masks.

Used both ways by the classic swapper: on the source, hair, fringes, glasses,
hands and beards are *filled* from the source's own skin (``skin_fill``); on the
target, the same things are *kept* on top of the fused face.

How a face's occluders are found (all from the mesh and the pixels, no model):

1. **Skin model.** The colours at reliably-skin mesh vertices (cheeks, nose,
   forehead and chin; at least :data:`FEATURE_CLEARANCE` eye distances away from
   eyes, brows, lips, nostrils and the face outline) are measured after a light
   blur, in three features: the chromaticities ``r/(r+g+b)`` and ``g/(r+g+b)``
   (insensitive to shading) and ``log`` luma (loosely weighted). A robust
   Gaussian is fitted: median start, then mean and covariance of the samples
   nearest it (:data:`SKIN_INLIER_SHARE`), so an occluder or beard covering a
   minority of the sample vertices does not pull the model.
2. **Skin probability** of every pixel: 1 below a Mahalanobis distance of
   :data:`SKIN_D_LOW`, 0 above :data:`SKIN_D_HIGH`, linear between; pixels
   darker than :data:`DARK_SHARE` of the skin's median luma are never skin
   (dark hair, sunglasses, deep holes). Highlights and shading are forgiven: a
   pixel brighter than the skin's median may be that much greyer (reflected
   light is white), a darker one that much more saturated (bounced light is
   skin-coloured).
3. **Occluders** are the non-skin pixels inside the face outline, except the
   face's own features (eyes, brows, lips, nostrils — not skin, but not
   occluders either); an occluder that continues on both sides of a feature
   covers it (a morphological closing inside the features), one covering part of
   a brow's, the lips' or the nostrils' surroundings takes the part of the
   feature within :data:`BROW_REACH`, and an eye or mouth whose
   surrounding ring is mostly occluded (sunglasses over an eye, a hand over the
   mouth) is occluded as a whole.
   Specks (pores, highlights) are removed by a morphological opening, and
   islands smaller than :data:`MIN_OCCLUDER_AREA` of the face are dropped.
4. **What the outline takes in from behind the face.** On a turned face the
   mesh's outline overshoots the cheek or temple on the far side, and a sliver of
   background (a flag, a wall) lies inside it: too thin for the opening and
   the island rule, but what a loose outline pulls in. Non-skin pixels within
   :data:`RIM_WIDTH` eye distances of the outline, connected to it, are
   occluders whatever their size, on a face where anything else was found; on a
   source, grown inward by :data:`SOURCE_RIM_GROW` (the blurred silhouette
   beside it).

A dense dark beard is caught by this rule, but stubble, a thin moustache and
thin glasses frames are not (they differ little from skin pixel by pixel, or
break into islands below :data:`MIN_OCCLUDER_AREA`): they are found as regions
by :mod:`facefuse.fusion.swappers.classic.regions`, whose
:func:`~facefuse.fusion.swappers.classic.regions.face_occluders` is this mask
together with them (:func:`on_face_crop` runs both on one crop).

Images are (H, W, 3) RGB uint8 or float 0..255; landmarks (N, 3) pixels in the
same frame; masks (H, W) float32 in [0, 1].
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from facefuse.faces import topology as topo
from facefuse.fusion.geometry import eye_distance, nearest_distance
from facefuse.imaging.stats import median

#: Width of the band inside the outline, in eye distances, where non-skin pixels
#: that reach the outline are background taken in by a loose mesh.
RIM_WIDTH = 0.08
#: Growth inward of that background on a source, in eye distances: the pixels
#: beside it are the silhouette's blurred edge, part background, and carried onto
#: a target's temple or cheek (where a turned source's silhouette lands) they
#: show as a grey-blue smudge.
SOURCE_RIM_GROW = 0.05
#: Skin sample vertices keep at least this many eye distances from every feature point.
FEATURE_CLEARANCE = 0.12
#: Share of the sample vertices (nearest the median) that the skin Gaussian is fitted on.
SKIN_INLIER_SHARE = 0.7
#: Mahalanobis distances between which the skin probability falls from 1 to 0.
SKIN_D_LOW = 3.5
SKIN_D_HIGH = 5.5
#: Pixels darker than this share of the skin's median luma are never skin.
DARK_SHARE = 0.35
#: Floors of the skin model's standard deviations: chromaticity, log luma.
CHROMA_SD_FLOOR = 0.015
LOG_LUMA_SD_FLOOR = 0.12
#: The log-luma spread is widened by this factor: shading is not an occluder.
LOG_LUMA_WIDEN = 2.0
#: Occluder islands smaller than this share of the face's area are dropped; before
#: the feature rules, those under the smaller share (they would only seed them).
MIN_OCCLUDER_AREA = 0.015
EARLY_ISLAND_AREA = 0.004
#: Feature (eye, mouth) rings more occluded than this are occluded as a whole.
RING_OCCLUDED = 0.5
#: How far (eye distances) an occluder next to a brow, the lips or the nostrils
#: reaches into it, when it covers more than this share of its surroundings.
BROW_REACH = 0.1
BROW_RING_OCCLUDED = 0.15
#: Nostrils: discs of this radius (eye distances) between the nose base and each wing.
NOSTRIL_RADIUS = 0.07
#: Brow polygon in contour order (lower edge, then the upper edge back).
_BROW_LEFT = (46, 53, 52, 65, 55, 107, 66, 105, 63, 70)
_BROW_RIGHT = (276, 283, 282, 295, 285, 336, 296, 334, 293, 300)
_NOSTRIL_PAIRS = ((2, 98), (2, 327))


@dataclass(frozen=True)
class SkinModel:
    """A Gaussian over (r chromaticity, g chromaticity, log luma) of one face's skin."""

    mean: np.ndarray  # (3,)
    inv_cov: np.ndarray  # (3, 3)
    median_luma: float


def _features(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) RGB → (..., 3) float32 features: r and g chromaticity, log luma."""
    x = rgb.astype(np.float32)
    s = x.sum(-1) + 3.0
    luma = 0.299 * x[..., 0] + 0.587 * x[..., 1] + 0.114 * x[..., 2]
    return np.stack([(x[..., 0] + 1.0) / s, (x[..., 1] + 1.0) / s, np.log(luma + 4.0)], -1)


def _feature_points(landmarks: np.ndarray) -> np.ndarray:
    idx = (topo.EYE_IMAGE_LEFT + topo.EYE_IMAGE_RIGHT + _BROW_LEFT + _BROW_RIGHT
           + topo.LIPS_OUTER + (2, 98, 327))
    pts: np.ndarray = landmarks[list(idx), :2].astype(np.float64)
    return pts


def skin_vertices(landmarks: np.ndarray) -> np.ndarray:
    """Indices (K,) of mesh vertices that are reliably skin when nothing covers
    them: clear of the eyes, brows, lips, nostrils and the face outline. Memoised
    by the mesh's bytes (a render's stages ask for one mesh's several times), so
    the array is read-only."""
    mesh = np.ascontiguousarray(np.asarray(landmarks)[:468, :2])
    return _skin_vertices(mesh.tobytes(), mesh.dtype.str, len(mesh))


@functools.lru_cache(maxsize=64)
def _skin_vertices(raw: bytes, dtype: str, n: int) -> np.ndarray:
    landmarks = np.frombuffer(raw, dtype).reshape(n, 2)
    out = _find_skin_vertices(landmarks)
    out.flags.writeable = False
    return out


def _find_skin_vertices(landmarks: np.ndarray) -> np.ndarray:
    lm = np.asarray(landmarks, np.float64)[:468, :2]
    clear = FEATURE_CLEARANCE * eye_distance(landmarks)
    avoid = np.concatenate([_feature_points(landmarks), lm[list(topo.FACE_OVAL)]])
    return np.flatnonzero(nearest_distance(lm, avoid) > clear)


def fit_skin_model(image: np.ndarray, landmarks: np.ndarray, side: int = 0
                   ) -> SkinModel | None:
    """Robust skin-colour model of the face; None when too few vertices are in the
    image. ``side`` −1 / +1: of the vertices left / right of the face's midline
    only (a face lit from one side has two skins), 0: of all."""
    idx = skin_vertices(landmarks)
    if side:
        idx = idx[np.sign(_side_of(landmarks, landmarks[idx, :2])) == side]
    h, w = image.shape[:2]
    xy = landmarks[idx, :2]
    inside = (xy[:, 0] >= 0) & (xy[:, 0] < w) & (xy[:, 1] >= 0) & (xy[:, 1] < h)
    if inside.sum() < 20:
        return None
    # Each vertex reads a few pixels around it: sampled from a 2× area-averaged copy.
    small = cv2.resize(image, (max(1, w // 2), max(1, h // 2)), interpolation=cv2.INTER_AREA)
    pts = (np.asarray(xy[inside], np.float32) + 0.5) * np.float32(0.5) - 0.5
    cols = cv2.remap(small.astype(np.float32), pts[:, 0:1].copy(), pts[:, 1:2].copy(),
                     cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT_101).reshape(-1, 3)
    f = _features(cols).astype(np.float64)
    med = median(f, axis=0)
    mad = median(np.abs(f - med), axis=0) * 1.4826 + 1e-6
    d = np.linalg.norm((f - med) / mad, axis=1)
    keep = f[d <= np.quantile(d, SKIN_INLIER_SHARE)]
    mean = keep.mean(0)
    cov = np.cov(keep.T)
    sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
    floor = np.array([CHROMA_SD_FLOOR, CHROMA_SD_FLOOR, LOG_LUMA_SD_FLOOR])
    target_sd = np.maximum(sd, floor) * np.array([1.0, 1.0, LOG_LUMA_WIDEN])
    # Rescale the covariance to the floored, widened deviations (keeps correlations).
    corr = cov / np.maximum(np.outer(sd, sd), 1e-18)
    np.fill_diagonal(corr, 1.0)
    cov = corr * np.outer(target_sd, target_sd)
    luma = 0.299 * cols[:, 0] + 0.587 * cols[:, 1] + 0.114 * cols[:, 2]
    return SkinModel(mean, np.linalg.inv(cov + 1e-12 * np.eye(3)), float(median(luma)))


#: Rows: r + 1, g + 1, luma, r + g + b + 3 (last column: the constant) — the
#: chromaticity and luma features' ingredients in one pass of ``cv2.transform``.
_FEATURE_MIX = np.array([[1, 0, 0, 1], [0, 1, 0, 1], [0.299, 0.587, 0.114, 0], [1, 1, 1, 3]],
                        np.float32)


#: Width (eye distances) over which the two sides' skin models hand over at the
#: face's midline.
SIDE_BLEND = 0.1


def _side_of(landmarks: np.ndarray, xy: np.ndarray) -> np.ndarray:
    """Signed distance (pixels) of points ``xy`` (..., 2) from the face's midline
    (the line from the forehead's top to the chin): < 0 on the image's left."""
    top, chin = landmarks[topo.FOREHEAD, :2], landmarks[topo.CHIN, :2]
    axis = (chin - top) / max(float(np.linalg.norm(chin - top)), 1e-6)
    rel = xy - top
    out: np.ndarray = axis[1] * rel[..., 0] - axis[0] * rel[..., 1]
    return out


def skin_blur(landmarks: np.ndarray) -> float:
    """σ (pixels) of the blur before a pixel's skin probability is read: a hundredth
    of the eye distance, so texture and noise do not count."""
    return max(0.5, 0.01 * eye_distance(landmarks))


def skin_map(image: np.ndarray, landmarks: np.ndarray, model: SkinModel) -> np.ndarray:
    """(H, W) float32: the probability that each pixel is the face's skin
    (:func:`skin_probability`, blurred by :func:`skin_blur`), by the whole face's
    ``model`` or by the skin model of its own side of the face
    (:func:`fit_skin_model` with ``side`` ±1; the two hand over across
    :data:`SIDE_BLEND` eye distances at the midline), the larger: a face lit from
    one side has two skins, and its shaded, redder or freckled side is skin by its
    own side's model."""
    d = eye_distance(landmarks)
    sigma = skin_blur(landmarks)
    prob = skin_probability(image, model, sigma)
    h, w = image.shape[:2]
    # (The signed distance is linear in x and y: summed from a row and a column.)
    origin = float(_side_of(landmarks, np.zeros(2)))
    dx = float(_side_of(landmarks, np.array([1.0, 0.0]))) - origin
    dy = float(_side_of(landmarks, np.array([0.0, 1.0]))) - origin
    scale = 1.0 / (SIDE_BLEND * d)
    right = np.clip((0.5 + origin * scale)
                    + (dx * scale) * np.arange(w, dtype=np.float32)[None, :]
                    + (dy * scale) * np.arange(h, dtype=np.float32)[:, None],
                    0.0, 1.0).astype(np.float32)
    for side, share in ((-1, 1.0 - right), (1, right)):
        half = fit_skin_model(image, landmarks, side)
        if half is not None:
            np.maximum(prob, skin_probability(image, half, sigma) * share, out=prob)
    return prob


def skin_probability(image: np.ndarray, model: SkinModel, sigma: float = 0.0) -> np.ndarray:
    """(H, W) float32 probability-like score that each pixel is this face's skin.

    ``sigma`` (pixels) blurs the image first, so texture and noise do not count.
    """
    img: np.ndarray = image.astype(np.float32)
    if sigma > 0.3:
        img = cv2.GaussianBlur(img, (0, 0), sigma)
    r1, g1, luma, total = cv2.split(cv2.transform(img, _FEATURE_MIX))
    inv = 1.0 / total
    mean = model.mean.astype(np.float32)
    f0 = r1 * inv - mean[0]
    f1 = g1 * inv - mean[1]
    f2 = cv2.log(luma + np.float32(4.0)) - mean[2]
    # Highlights: light reflected off the skin's surface adds white, moving the
    # chromaticity toward grey by at most the share of the luma above the skin's
    # median. Shadows: light bounced between skin surfaces is skin-coloured, so
    # shaded skin is more saturated, by at most the share of luma it lost. That
    # much motion along the grey–skin line is forgiven; a white object is further.
    to_grey = np.float32(1.0 / 3.0) - mean[:2]
    span = np.float32(np.linalg.norm(to_grey))
    if span > 1e-6:
        u0, u1 = to_grey / span
        along = f0 * u0 + f1 * u1
        ratio = np.float32(model.median_luma) / np.maximum(luma, np.float32(1.0))
        greyer = span * np.clip(1.0 - ratio, 0.0, 1.0)
        richer = span * np.clip(1.0 - 1.0 / ratio, 0.0, 1.0)
        shift = np.clip(along, -richer, greyer)
        f0 -= shift * u0
        f1 -= shift * u1
    a = model.inv_cov.astype(np.float32)
    q = (a[0, 0] * f0 * f0 + a[1, 1] * f1 * f1 + a[2, 2] * f2 * f2
         + 2 * (a[0, 1] * f0 * f1 + a[0, 2] * f0 * f2 + a[1, 2] * f1 * f2))
    d = np.sqrt(np.maximum(q, 0.0))
    p = np.clip((SKIN_D_HIGH - d) * np.float32(1.0 / (SKIN_D_HIGH - SKIN_D_LOW)), 0.0, 1.0)
    p[luma < DARK_SHARE * model.median_luma] = 0.0
    out: np.ndarray = p.astype(np.float32)
    return out


def _poly(canvas: np.ndarray, points: np.ndarray) -> None:
    cv2.fillPoly(canvas, [np.round(points * 4).astype(np.int32)], 255, lineType=cv2.LINE_AA,
                 shift=2)


def disc(r: float) -> np.ndarray:
    k = max(1, round(r))
    k_: np.ndarray = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * k + 1, 2 * k + 1))
    return k_


def grow(mask: np.ndarray, r: float) -> np.ndarray:
    """Binary (H, W) mask (nonzero = on) grown by a disc of ``r`` pixels, as bool:
    through the distance transform, linear in the pixel count whatever ``r``."""
    dist = cv2.distanceTransform((mask == 0).astype(np.uint8), cv2.DIST_L2, 3)
    out: np.ndarray = dist <= r
    return out


def _grow_near(mask: np.ndarray, r: float) -> tuple[tuple[slice, slice], np.ndarray]:
    """:func:`grow` of a small uint8 ``mask`` computed only on the box that can
    change: its nonzero pixels' bounding box grown by a bit more than ``r`` (the
    3×3 distance's axial step is 0.955 px), clipped to the image. Returns the box
    as slices and the grown mask (bool) over it; outside the box it is False."""
    x, y, w, h = cv2.boundingRect(mask)
    m = int(np.ceil(1.1 * r)) + 2
    box = (slice(max(0, y - m), min(mask.shape[0], y + h + m)),
           slice(max(0, x - m), min(mask.shape[1], x + w + m)))
    return box, grow(mask[box], r)


def _shrink(mask: np.ndarray, r: float) -> np.ndarray:
    """Binary (H, W) mask shrunk by a disc of ``r`` pixels, as bool."""
    dist = cv2.distanceTransform((mask != 0).astype(np.uint8), cv2.DIST_L2, 3)
    out: np.ndarray = dist > r
    return out


def feature_masks(landmarks: np.ndarray, shape: tuple[int, int]) -> list[np.ndarray]:
    """Binary (H, W) uint8 masks of the face's own non-skin features: each eye,
    each brow, the lips, the nostrils — slightly grown so their edges count."""
    d = eye_distance(landmarks)
    lm = landmarks[:, :2].astype(np.float64)
    out = []
    for idx, reach in ((topo.EYE_IMAGE_LEFT, 0.06), (topo.EYE_IMAGE_RIGHT, 0.06),
                      (_BROW_LEFT, 0.04), (_BROW_RIGHT, 0.04), (topo.LIPS_OUTER, 0.04)):
        m = np.zeros(shape, np.uint8)
        pts = np.round(lm[list(idx)] * 4).astype(np.int32)
        # The polygon grown by a disc: filled, plus its outline drawn that thick.
        cv2.fillPoly(m, [pts], 255, shift=2)
        cv2.polylines(m, [pts], True, 255, thickness=max(1, round(2 * reach * d)), shift=2)
        out.append(m)
    m = np.zeros(shape, np.uint8)
    for a, b in _NOSTRIL_PAIRS:
        c = 0.5 * (lm[a] + lm[b])
        cv2.circle(m, (round(c[0]), round(c[1])), max(1, round(NOSTRIL_RADIUS * d)), 255, -1)
    out.append(m)
    return out


def outline_mask(landmarks: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(H, W) float32: 1 inside the mesh's face outline, 0 outside (anti-aliased)."""
    m = np.zeros(shape[:2], np.uint8)
    _poly(m, np.asarray(landmarks, np.float64)[list(topo.FACE_OVAL), :2])
    out: np.ndarray = m.astype(np.float32) * np.float32(1.0 / 255.0)
    return out


def occluder_mask(image: np.ndarray, landmarks: np.ndarray, *,
                  scale: float = 1.0) -> np.ndarray:
    """Mask (H, W) float32 of what covers the face in ``image``: 1 on an occluder,
    0 on skin, on the face's features and outside the face outline. See the
    module doc.

    ``scale`` < 1 computes it on the image resized by that factor (cheaper; the
    result is upsampled, so its edges are soft) — for masks that are feathered
    anyway. Only the face outline's bounding box is examined.
    """
    return on_face_crop(image, landmarks, occluders_on_crop, scale=scale)


def on_face_crop(image: np.ndarray, landmarks: np.ndarray,
                 fn: Callable[[np.ndarray, np.ndarray], np.ndarray], *,
                 scale: float = 1.0) -> np.ndarray:
    """``fn(crop, local_landmarks) -> (h, w) float32 mask`` evaluated on the face
    outline's bounding box of ``image`` (see :func:`on_box`)."""
    h, w = image.shape[:2]
    lm = np.asarray(landmarks, np.float64)
    oval = lm[list(topo.FACE_OVAL), :2]
    x0 = int(np.clip(np.floor(oval[:, 0].min()) - 2, 0, w))
    y0 = int(np.clip(np.floor(oval[:, 1].min()) - 2, 0, h))
    x1 = int(np.clip(np.ceil(oval[:, 0].max()) + 3, 0, w))
    y1 = int(np.clip(np.ceil(oval[:, 1].max()) + 3, 0, h))
    return on_box(image, lm, (x0, y0, x1, y1), fn, scale=scale)


def on_box(image: np.ndarray, landmarks: np.ndarray, box: tuple[int, int, int, int],
           fn: Callable[[np.ndarray, np.ndarray], np.ndarray], *,
           scale: float = 1.0, min_side: int = 4) -> np.ndarray:
    """``fn(crop, local_landmarks) -> (h, w) float32 mask`` evaluated on ``box``
    (x0, y0, x1, y1; clipped to the image) of ``image``, resized by ``scale`` < 1
    (at least ``min_side`` pixels a side) and the result upsampled, pasted into an
    (H, W) float32 mask that is 0 elsewhere (all 0 when the box is smaller than
    ``min_side``)."""
    h, w = image.shape[:2]
    x0, y0 = max(0, box[0]), max(0, box[1])
    x1, y1 = min(w, box[2]), min(h, box[3])
    out = np.zeros((h, w), np.float32)
    if x1 - x0 < min_side or y1 - y0 < min_side:
        return out
    crop = image[y0:y1, x0:x1]
    local = np.asarray(landmarks, np.float64).copy()
    local[:, 0] -= x0
    local[:, 1] -= y0
    if scale < 1.0:
        size = (max(min_side, round((x1 - x0) * scale)),
                max(min_side, round((y1 - y0) * scale)))
        crop = cv2.resize(crop, size, interpolation=cv2.INTER_AREA)
        local[:, :2] *= (size[0] / (x1 - x0), size[1] / (y1 - y0))
        local[:, 2] *= scale
    m = fn(np.ascontiguousarray(crop), local)
    if scale < 1.0:
        m = cv2.resize(m, (x1 - x0, y1 - y0), interpolation=cv2.INTER_LINEAR)
    out[y0:y1, x0:x1] = m
    return out


def occluders_on_crop(image: np.ndarray, landmarks: np.ndarray,
                      rim_grow: float = 0.0) -> np.ndarray:
    """:func:`occluder_mask` on an image cropped to the face; the background taken
    in by the outline grown inward by ``rim_grow`` eye distances (see
    :data:`SOURCE_RIM_GROW`)."""
    h, w = image.shape[:2]
    face = np.zeros((h, w), np.uint8)
    _poly(face, landmarks[list(topo.FACE_OVAL), :2].astype(np.float64))
    model = fit_skin_model(image, landmarks)
    if model is None:
        return np.zeros((h, w), np.float32)
    d = eye_distance(landmarks)
    feats = feature_masks(landmarks, (h, w))
    any_feat = np.maximum.reduce(feats)
    # (Each side by its own skin too: shading is not an occluder.)
    occ = (1.0 - skin_map(image, landmarks, model)) * (face / 255.0)
    feat = any_feat > 127
    occ[feat] = 0.0
    binary: np.ndarray = cv2.morphologyEx((occ > 0.5).astype(np.uint8), cv2.MORPH_OPEN,
                                          disc(0.03 * d))
    area = max(1, int(face.sum() // 255))
    drop_islands(binary, EARLY_ISLAND_AREA * area)
    if not binary.any():  # the common case: nothing covers the face
        # (The rim rule is not applied to an otherwise clean face: there it made
        # the output depend on the source's background, the very thing it keeps
        # out, in 1.1% of the changed pixels of a biden -> obama2 fusion.)
        return np.zeros((h, w), np.float32)
    # An occluder crossing a feature (a bar over the lips) covers it where it
    # continues on both sides: close the mask, but only inside the features.
    closed = _shrink(grow(binary, 0.1 * d), 0.1 * d)
    binary[feat] = closed[feat]
    # A feature whose ring is mostly covered is covered too (sunglasses, a hand).
    for m in feats[:2] + feats[4:]:
        fm = m > 127
        if not fm.any():
            continue
        box, grown = _grow_near(m, 0.12 * d)
        ring = grown & ~feat[box] & (face[box] > 127)
        if ring.any() and binary[box][ring].mean() > RING_OCCLUDED:
            binary[fm] = 1
    # An occluder that covers a good part of a brow's, the lips' or the nostrils'
    # surroundings (a lens rim, a fringe, a bar along the lip) takes the part of
    # the feature within :data:`BROW_REACH` of it.
    reach = None
    for m in feats[2:]:
        fm = (m > 127) & (binary == 0)
        if not fm.any():
            continue
        # The ring includes neighbouring features: an eye covered by now counts.
        box, grown = _grow_near(m, 0.1 * d)
        ring = grown & (m[box] <= 127) & (face[box] > 127)
        if ring.any() and binary[box][ring].mean() > BROW_RING_OCCLUDED:
            reach = grow(binary, BROW_REACH * d) if reach is None else reach
            binary[fm] = reach[fm]
    # Small islands are shading, stubble or a highlight, not something in front.
    drop_islands(binary, MIN_OCCLUDER_AREA * area)
    rim = rim_background(occ > 0.5, face > 127, RIM_WIDTH * d)
    if rim.any() and rim_grow > 0.0:
        rim = grow(rim, rim_grow * d) & (face > 127)
    binary[rim] = 1
    out: np.ndarray = binary.astype(np.float32)
    return out


def rim_background(non_skin: np.ndarray, face: np.ndarray, width: float) -> np.ndarray:
    """(H, W) bool: the ``non_skin`` pixels within ``width`` px inside the ``face``
    outline (both (H, W) bool) that are connected, inside that band, to the
    outline's own edge pixels (see the module doc, step 4)."""
    # Distance of each face pixel to the outline (one transform for both bands).
    inward = cv2.distanceTransform(face.astype(np.uint8), cv2.DIST_L2, 3)
    band = face & (inward <= width)
    candidates = (non_skin & band).astype(np.uint8)
    if not candidates.any():
        return np.zeros(face.shape, bool)
    edge = face & (inward <= 1.5)
    _, labels = cv2.connectedComponents(candidates, connectivity=8)
    touching = np.unique(labels[edge & (candidates > 0)])
    out: np.ndarray = np.isin(labels, touching[touching > 0])
    return out


def drop_islands(binary: np.ndarray, min_area: float) -> None:
    """Clear (in place) the 8-connected islands of ``binary`` (uint8) smaller than
    ``min_area`` pixels."""
    n, labels, stats, _ = cv2.connectedComponentsWithStats(binary, connectivity=8)
    if n > 1:
        small = stats[:, cv2.CC_STAT_AREA] < min_area
        small[0] = False
        binary[small[labels]] = 0


def soften(mask: np.ndarray, grow_px: float, sigma: float) -> np.ndarray:
    """A binary-ish occluder mask grown by ``grow_px`` pixels and feathered by
    ``sigma`` (so the occluder's own anti-aliased edge is covered too)."""
    m: np.ndarray = mask.astype(np.float32)
    if grow_px >= 0.5:
        m = cv2.dilate(m, disc(grow_px))
    if sigma > 0.3:
        m = cv2.GaussianBlur(m, (0, 0), sigma)
    out: np.ndarray = np.clip(m, 0.0, 1.0).astype(np.float32)
    return out


def readable_skin(image: np.ndarray, lm: np.ndarray, outline: np.ndarray) -> np.ndarray:
    """(H, W) float32: where a fill may read the face's skin: its ``outline`` weighed
    by the skin probability. (The whole face's skin model: each side's would cost
    three probability maps for a weight the fill's wide Gaussians smooth anyway.)"""
    model = fit_skin_model(image, lm)
    if model is None:
        return outline
    out: np.ndarray = outline * skin_probability(image, model, skin_blur(lm))
    return out
