"""What inside a face is not its skin: per-face skin-colour models and occluder masks.

Used both ways by the classic swapper: on the source, hair, fringes, glasses,
hands and beards are *rejected* (the target's own pixels show there); on the
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
   covers it (a morphological closing inside the features), one touching a brow
   takes the part of it within :data:`BROW_REACH`, and an eye or mouth whose
   surrounding ring is mostly occluded (sunglasses over an eye, a hand over the
   mouth) is occluded as a whole.
   Specks (pores, highlights) are removed by a morphological opening.

Facial hair follows from this rule: a beard or moustache is not skin, so a
source's beard is rejected (a bearded source onto a clean-shaven target gives
the target's clean skin) and a target's beard is kept (it stays on top of the
fused face). Facial hair is always the target's.

Images are (H, W, 3) RGB uint8 or float 0..255; landmarks (N, 3) pixels in the
same frame; masks (H, W) float32 in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from facefuse.faces import topology as topo
from facefuse.fusion.geometry import eye_distance

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
#: Feature (eye, mouth) rings more occluded than this are occluded as a whole.
RING_OCCLUDED = 0.5
#: How far (eye distances) an occluder touching a brow reaches into it.
BROW_REACH = 0.1
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
    them: clear of the eyes, brows, lips, nostrils and the face outline."""
    lm = np.asarray(landmarks, np.float64)[:468, :2]
    clear = FEATURE_CLEARANCE * eye_distance(landmarks)
    avoid = np.concatenate([_feature_points(landmarks), lm[list(topo.FACE_OVAL)]])
    d = np.min(np.linalg.norm(lm[:, None, :] - avoid[None, :, :], axis=2), axis=1)
    return np.flatnonzero(d > clear)


def fit_skin_model(image: np.ndarray, landmarks: np.ndarray) -> SkinModel | None:
    """Robust skin-colour model of the face; None when too few vertices are in the image."""
    idx = skin_vertices(landmarks)
    h, w = image.shape[:2]
    xy = landmarks[idx, :2]
    inside = (xy[:, 0] >= 0) & (xy[:, 0] < w) & (xy[:, 1] >= 0) & (xy[:, 1] < h)
    if inside.sum() < 20:
        return None
    sigma = max(0.5, 0.02 * eye_distance(landmarks))
    blurred = cv2.GaussianBlur(image.astype(np.float32), (0, 0), sigma)
    pts = np.asarray(xy[inside], np.float32)
    cols = cv2.remap(blurred, pts[:, 0:1].copy(), pts[:, 1:2].copy(), cv2.INTER_LINEAR,
                     borderMode=cv2.BORDER_REFLECT_101).reshape(-1, 3)
    f = _features(cols).astype(np.float64)
    med = np.median(f, axis=0)
    mad = np.median(np.abs(f - med), axis=0) * 1.4826 + 1e-6
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
    return SkinModel(mean, np.linalg.inv(cov + 1e-12 * np.eye(3)), float(np.median(luma)))


def skin_probability(image: np.ndarray, model: SkinModel, sigma: float = 0.0) -> np.ndarray:
    """(H, W) float32 probability-like score that each pixel is this face's skin.

    ``sigma`` (pixels) blurs the image first, so texture and noise do not count.
    """
    img = image.astype(np.float32)
    if sigma > 0.3:
        img = cv2.GaussianBlur(img, (0, 0), sigma)
    f = _features(img) - model.mean.astype(np.float32)
    luma = 0.299 * img[..., 0] + 0.587 * img[..., 1] + 0.114 * img[..., 2]
    # Highlights: light reflected off the skin's surface adds white, moving the
    # chromaticity toward grey by at most the share of the luma above the skin's
    # median. Shadows: light bounced between skin surfaces is skin-coloured, so
    # shaded skin is more saturated, by at most the share of luma it lost. That
    # much motion along the grey–skin line is forgiven; a white object is further.
    to_grey = np.float32(1.0 / 3.0) - model.mean[:2].astype(np.float32)
    span = float(np.linalg.norm(to_grey))
    if span > 1e-6:
        u = to_grey / span
        along = f[..., 0] * u[0] + f[..., 1] * u[1]
        safe = np.maximum(luma, 1.0)
        greyer = span * np.clip(1.0 - model.median_luma / safe, 0.0, 1.0)
        richer = span * np.clip(1.0 - safe / model.median_luma, 0.0, 1.0)
        shift = np.clip(along, -richer, greyer)
        f[..., 0] -= shift * u[0]
        f[..., 1] -= shift * u[1]
    q = np.einsum("hwi,ij,hwj->hw", f, model.inv_cov.astype(np.float32), f)
    d = np.sqrt(np.maximum(q, 0.0))
    p = np.clip((SKIN_D_HIGH - d) / (SKIN_D_HIGH - SKIN_D_LOW), 0.0, 1.0)
    p[luma < DARK_SHARE * model.median_luma] = 0.0
    out: np.ndarray = p.astype(np.float32)
    return out


def _poly(canvas: np.ndarray, points: np.ndarray) -> None:
    cv2.fillPoly(canvas, [np.round(points * 4).astype(np.int32)], 255, lineType=cv2.LINE_AA,
                 shift=2)


def _disc(r: float) -> np.ndarray:
    k = max(1, round(r))
    k_: np.ndarray = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * k + 1, 2 * k + 1))
    return k_


def feature_masks(landmarks: np.ndarray, shape: tuple[int, int]) -> list[np.ndarray]:
    """Binary (H, W) uint8 masks of the face's own non-skin features: each eye,
    each brow, the lips, the nostrils — slightly grown so their edges count."""
    d = eye_distance(landmarks)
    lm = landmarks[:, :2].astype(np.float64)
    out = []
    for idx, grow in ((topo.EYE_IMAGE_LEFT, 0.06), (topo.EYE_IMAGE_RIGHT, 0.06),
                      (_BROW_LEFT, 0.04), (_BROW_RIGHT, 0.04), (topo.LIPS_OUTER, 0.04)):
        m = np.zeros(shape, np.uint8)
        _poly(m, lm[list(idx)])
        out.append(cv2.dilate(m, _disc(grow * d)))
    m = np.zeros(shape, np.uint8)
    for a, b in _NOSTRIL_PAIRS:
        c = 0.5 * (lm[a] + lm[b])
        cv2.circle(m, (round(c[0]), round(c[1])), max(1, round(NOSTRIL_RADIUS * d)), 255, -1)
    out.append(m)
    return out


def occluder_mask(image: np.ndarray, landmarks: np.ndarray, *, outside: float = 0.0,
                  model: SkinModel | None = None) -> np.ndarray:
    """Mask (H, W) float32 of what covers the face in ``image``: 1 on an occluder,
    0 on skin and on the face's features; ``outside`` beyond the face outline
    (1 when the caller must not take pixels from there). See the module doc."""
    h, w = image.shape[:2]
    face = np.zeros((h, w), np.uint8)
    _poly(face, landmarks[list(topo.FACE_OVAL), :2].astype(np.float64))
    beyond = outside * (1.0 - face.astype(np.float32) / 255.0)
    model = model or fit_skin_model(image, landmarks)
    if model is None:
        return beyond
    d = eye_distance(landmarks)
    feats = feature_masks(landmarks, (h, w))
    any_feat = np.maximum.reduce(feats)
    occ = (1.0 - skin_probability(image, model, max(0.5, 0.01 * d))) * (face / 255.0)
    feat = any_feat > 127
    occ[feat] = 0.0
    binary = (occ > 0.5).astype(np.uint8)
    binary = cv2.morphologyEx(binary, cv2.MORPH_OPEN, _disc(0.03 * d))
    # An occluder crossing a feature (a bar over the lips) covers it where it
    # continues on both sides: close the mask, but only inside the features.
    closed = cv2.morphologyEx(binary, cv2.MORPH_CLOSE, _disc(0.1 * d))
    binary[feat] = closed[feat]
    # A feature whose ring is mostly covered is covered too (sunglasses, a hand).
    ring_k = _disc(0.12 * d)
    for m in feats[:2] + feats[4:5]:
        fm = m > 127
        if not fm.any():
            continue
        ring = (cv2.dilate(m, ring_k) > 127) & ~(any_feat > 127) & (face > 127)
        if ring.any() and binary[ring].mean() > RING_OCCLUDED:
            binary[fm] = 1
    # Brows are thin: an occluder touching one (a lens rim, a fringe) takes the
    # part of it within a brow's height.
    brows = (np.maximum(feats[2], feats[3]) > 127) & (binary == 0)
    binary[brows] = cv2.dilate(binary, _disc(BROW_REACH * d))[brows]
    out: np.ndarray = np.maximum(binary.astype(np.float32), beyond)
    return out


def soften(mask: np.ndarray, grow_px: float, sigma: float) -> np.ndarray:
    """A binary-ish occluder mask grown by ``grow_px`` pixels and feathered by
    ``sigma`` (so the occluder's own anti-aliased edge is covered too)."""
    m = mask.astype(np.float32)
    if grow_px >= 0.5:
        m = cv2.dilate(m, _disc(grow_px))
    if sigma > 0.3:
        m = cv2.GaussianBlur(m, (0, 0), sigma)
    out: np.ndarray = np.clip(m, 0.0, 1.0).astype(np.float32)
    return out
