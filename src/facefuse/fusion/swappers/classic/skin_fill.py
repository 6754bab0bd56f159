"""What covers a source face, filled from the source's own skin before it is warped.

A source's glasses, beard, stubble, hair strands or hand belong to its photo, not to
its person: carried over they paste a frame or a fringe onto every target, and
shown as the *target's* pixels instead (the old rule) they bring the target's
identity back wherever the source was covered. Here they are replaced by the
source's own skin colour around them, spread inward by normalised convolution
(a Gaussian of the colour times the skin weight over the Gaussian of the weight,
from fine to coarse: each pixel takes the finest scale at which enough skin lies
around it). What is filled carries no detail of its own: the render takes the
target photo's fine detail there (the caller's share of the source detail is 0
over the fill), so a filled cheek has the photo's pores, not a smear.

Images (H, W, 3) uint8 or float32 0..255; masks (H, W) float32 in [0, 1].
"""

from __future__ import annotations

import cv2
import numpy as np

#: Scales of the fill's Gaussians, in eye distances (fine to coarse).
FILL_SIGMAS = (0.03, 0.06, 0.12, 0.25, 0.5, 1.0)
#: Share of the full weight a scale needs around a pixel to be used there.
FILL_SUPPORT = 0.25
#: How far the covered part is grown before the fill, in eye distances (an
#: occluder's soft edge and its shadow go with it).
FILL_GROW = 0.04


def covered(occluders: np.ndarray, eye_px: float) -> np.ndarray:
    """(H, W) float32 in [0, 1]: the occluders grown by :data:`FILL_GROW` eye
    distances and feathered by half that, 1 where the fill replaces the source."""
    r = max(1, round(FILL_GROW * eye_px))
    grown = cv2.dilate((occluders > 0.5).astype(np.uint8),
                       cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * r + 1, 2 * r + 1)))
    soft = cv2.GaussianBlur(grown.astype(np.float32), (0, 0), max(0.5, r / 2.0))
    return np.maximum(soft, (occluders > 0.5).astype(np.float32))


def fill_from_skin(image: np.ndarray, cover: np.ndarray, skin: np.ndarray,
                   eye_px: float) -> np.ndarray:
    """(H, W, 3) uint8: ``image`` with the ``cover`` (1: replaced) filled from the
    skin around it (``skin`` > 0: where the source's own skin may be read, its face
    outline less the cover), by normalised convolution from fine to coarse scales
    (:data:`FILL_SIGMAS` × ``eye_px``). Pixels with ``cover`` 0 come back exactly."""
    if not np.any(cover > 0.0):
        return np.asarray(image, np.uint8).copy()
    src = np.asarray(image, np.float32)
    weight = (np.asarray(skin, np.float32) * (1.0 - cover)).astype(np.float32)
    if float(weight.sum()) < 1.0:
        return np.asarray(image, np.uint8).copy()
    lit = src * weight[..., None]
    estimate = np.zeros_like(src)
    need = np.ones(cover.shape, np.float32)  # share still to be filled at coarser scales
    for frac in FILL_SIGMAS:
        sigma = max(0.5, frac * eye_px)
        w = cv2.GaussianBlur(weight, (0, 0), sigma)
        c = cv2.GaussianBlur(lit, (0, 0), sigma)
        peak = float(cv2.GaussianBlur(np.ones_like(weight), (0, 0), sigma).max())
        ok = np.clip(w / max(peak * FILL_SUPPORT, 1e-6), 0.0, 1.0)
        take = need * ok
        estimate += c / np.maximum(w, 1e-6)[..., None] * take[..., None]
        need -= take
    if np.any(need > 1e-3):
        mean = lit.reshape(-1, 3).sum(0) / float(weight.sum())
        estimate += mean[None, None, :] * need[..., None]
    a = cover[..., None]
    out = src * (1.0 - a) + estimate * a
    result: np.ndarray = np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return result
