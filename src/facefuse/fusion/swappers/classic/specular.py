"""Specular highlights on the skin: found, and taken out of a source face.

A shiny nose tip or forehead is the source photo's light, not its owner's skin:
carried into the target it reads as a bright pasted patch, since the
relighting's low-order (diffuse) model cannot move it. Per face, from the pixels
and the mesh, no model:

1. the skin is the face outline without the features (eyes, brows, lips);
2. its local mean luma ``M`` (a masked Gaussian of :data:`MEAN_SIGMA` eye
   distances) is the diffuse level; a pixel is a highlight by how far its luma
   stands above it, relatively: weight 0 at :data:`START` above, 1 at
   :data:`FULL` above (skin texture and pores stay well under the start);
3. a highlight is replaced by the local mean colour of the skin around it,
   the highlights themselves left out of that mean.

The weight is soft (no hard edge) and zero off the skin.
"""

from __future__ import annotations

import cv2
import numpy as np

from facefuse.fusion import mask as masks
from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.swappers.classic import occlusion as occ
from facefuse.imaging.channels import each_channel
from facefuse.imaging.pixels import masked_blur
from facefuse.imaging.stats import median

#: Relative brightness over the local skin mean where a highlight starts, and
#: where it is fully one.
START = 0.18
FULL = 0.35
#: A highlight is whiter than the skin: its saturation under this share of the
#: skin's local saturation counts fully, at the skin's own not at all.
WHITER = 0.7
#: Pixels darker than this share of the skin's median luma are not the skin.
DARK = 0.6
#: The skin's edge (the outline's, where background or hair borders it) is left
#: out by this many eye distances.
EDGE_INSET = 0.08
#: σ of the local skin mean, in eye distances.
MEAN_SIGMA = 0.12
#: Growth of the highlight's weight over its fringe (which stands less above the
#: skin than the start but is part of it), and its softening (σ); eye distances.
GROW = 0.03
EDGE_SIGMA = 0.02


def _luma(rgb: np.ndarray) -> np.ndarray:
    out: np.ndarray = cv2.cvtColor(np.asarray(rgb, np.float32), cv2.COLOR_RGB2GRAY)
    return out


def _saturation(rgb: np.ndarray) -> np.ndarray:
    """(H, W) float32 HSV saturation (max − min) / max of an RGB image."""
    r, g, b = cv2.split(np.asarray(rgb, np.float32))
    hi = cv2.max(cv2.max(r, g), b)
    lo = cv2.min(cv2.min(r, g), b)
    out: np.ndarray = (hi - lo) / np.maximum(hi, 1.0)
    return out


def _lit(area: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``area`` without its pixels darker than :data:`DARK` of its median luma
    (shadows, hair, a dark occluder: not the skin whose mean a highlight is read
    against, nor a colour to fill one with)."""
    inside = area > 0.5
    if not inside.any():
        return area
    out: np.ndarray = area * (y > DARK * float(median(y[inside])))
    return out.astype(np.float32)


def skin(rgb: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """(H, W) float32 in [0, 1]: the face's skin (outline without the features)."""
    h, w = rgb.shape[:2]
    inside = occ.outline_mask(landmarks, rgb.shape)
    out: np.ndarray = inside * (1.0 - masks.features_mask(landmarks, (0, 0, w, h)))
    return out.astype(np.float32)


def highlights(rgb: np.ndarray, landmarks: np.ndarray,
               where: np.ndarray | None = None) -> np.ndarray:
    """(H, W) float32 in [0, 1]: how much each pixel of ``rgb`` (H, W, 3) is a
    specular highlight of the face's skin (``where``: the skin, default
    :func:`skin`)."""
    area = skin(rgb, landmarks) if where is None else where
    eye = eye_distance(landmarks)
    y = _luma(rgb)
    mean_rgb = masked_blur(np.asarray(rgb, np.float32), _lit(area, y),
                           max(1.0, MEAN_SIGMA * eye))
    mean = _luma(mean_rgb)
    rel = (y - mean) / np.maximum(mean, 8.0)
    weight = np.clip((rel - START) / (FULL - START), 0.0, 1.0)
    if not weight.any():  # the common case: no pixel stands out enough
        return np.zeros(y.shape, np.float32)
    whiter = 1.0 - _saturation(rgb) / np.maximum(_saturation(mean_rgb), 1e-3)
    weight *= np.clip(whiter / (1.0 - WHITER), 0.0, 1.0)
    inset = max(1, round(EDGE_INSET * eye))
    weight *= cv2.erode((area > 0.5).astype(np.uint8), np.ones((2 * inset + 1,) * 2, np.uint8))
    grow = max(1, round(GROW * eye))
    weight = cv2.dilate(weight.astype(np.float32), cv2.getStructuringElement(
        cv2.MORPH_ELLIPSE, (2 * grow + 1, 2 * grow + 1)))
    out: np.ndarray = cv2.GaussianBlur(weight, (0, 0), max(0.7, EDGE_SIGMA * eye))
    return np.clip(out * 1.5, 0.0, 1.0).astype(np.float32)


def suppress(rgb: np.ndarray, landmarks: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``rgb`` (H, W, 3) uint8 with its skin's highlights replaced by the surrounding
    skin's local mean colour; the highlight weight (H, W) and that mean colour
    (H, W, 3) float32. ``rgb`` itself and no mean when there is no highlight."""
    area = skin(rgb, landmarks)
    weight = highlights(rgb, landmarks, area)
    if float(weight.max()) <= 0.0:
        return rgb, weight, None
    eye = eye_distance(landmarks)
    mean = masked_blur(np.asarray(rgb, np.float32), _lit(area, _luma(rgb)) * (1.0 - weight),
                       max(1.0, MEAN_SIGMA * eye))
    return apply(rgb, weight, mean), weight, mean


def apply(rgb: np.ndarray, weight: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """``rgb`` (H, W, 3) uint8 pulled toward ``mean`` (H, W, 3) by ``weight`` (H, W)."""
    out = rgb.astype(np.float32)
    out += each_channel(weight) * (mean - out)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
