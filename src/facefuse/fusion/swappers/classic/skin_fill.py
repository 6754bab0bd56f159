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

from facefuse.fusion.swappers.classic.detail import LUMA

#: Scales of the fill's Gaussians, in eye distances (fine to coarse).
FILL_SIGMAS = (0.03, 0.1, 0.3, 1.0)
#: Share of the full weight a scale needs around a pixel to be used there.
FILL_SUPPORT = 0.25
#: The wide Gaussians run on a copy reduced to about this σ (pixels).
REDUCED_SIGMA = 3.0
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


def _blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """A Gaussian of ``sigma`` pixels, worked out on a copy reduced so that the
    Gaussian is about :data:`REDUCED_SIGMA` pixels there, then enlarged again (a wide
    Gaussian's kernel on the full image cost ~80 ms a source; the fill is smooth at
    that scale anyway)."""
    h, w = image.shape[:2]
    k = max(1, int(sigma / REDUCED_SIGMA))
    if k == 1:
        return cv2.GaussianBlur(image, (0, 0), sigma)
    small = cv2.resize(image, (max(1, w // k), max(1, h // k)), interpolation=cv2.INTER_AREA)
    small = cv2.GaussianBlur(small, (0, 0), sigma / k)
    out: np.ndarray = cv2.resize(small, (w, h), interpolation=cv2.INTER_LINEAR)
    return out


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
    # The weight and the weighted colour blurred together (one 4-channel image);
    # what follows is worked out on the covered pixels alone.
    stack = np.concatenate([src * weight[..., None], weight[..., None]], axis=2)
    where = np.nonzero(cover > 0.0)
    estimate = np.zeros((len(where[0]), 3), np.float32)
    need = np.ones(len(where[0]), np.float32)  # share still to be filled, coarser
    for frac in FILL_SIGMAS:
        blurred = _blur(stack, max(0.5, frac * eye_px))[where]
        w = blurred[:, 3]
        # (A Gaussian of ones is 1 everywhere, borders reflected: the full weight.)
        take = need * np.clip(w / FILL_SUPPORT, 0.0, 1.0)
        estimate += blurred[:, :3] * (take / np.maximum(w, 1e-6))[:, None]
        need -= take
    if np.any(need > 1e-3):
        mean = stack[..., :3].reshape(-1, 3).sum(0) / float(weight.sum())
        estimate += mean[None, :] * need[:, None]
    a = cover[where][:, None]
    out = src.copy()
    out[where] = src[where] * (1.0 - a) + estimate * a
    result: np.ndarray = np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return result


#: What the finders missed on a source (a lens's lower rim, a strand across the
#: forehead, a hand's shadow): after the fill, skin pixels darker than this share
#: of the luma of the skin around them (the filled image blurred over
#: :data:`RESIDUE_SIGMA` eye distances) ...
RESIDUE_DARK = 0.72
RESIDUE_SIGMA = 0.1
#: ... that survive an opening by a disc of this radius (eye distances: pores,
#: wrinkles and thin lines are narrower), in pieces of at least this area (eye
#: distances squared) or this length (eye distances; a freckle or a mole is
#: smaller and round, a rim's piece long) ...
RESIDUE_OPEN = 0.012
RESIDUE_AREA = 0.008
RESIDUE_LENGTH = 0.1
#: ... away from the features (eyes, brows, lips, nostrils: their own darkness is
#: the face's), grown by this much.
RESIDUE_CLEAR = 0.04


def dark_residue(image: np.ndarray, filled: np.ndarray, inside: np.ndarray,
                 features: np.ndarray, eye_px: float) -> np.ndarray:
    """(H, W) float32 in {0, 1}: what is still dark on ``image`` once its occluders
    are ``filled`` (both (H, W, 3)), inside the face (``inside`` > 0.5) and off its
    ``features`` (> 0.5 there; grown by :data:`RESIDUE_CLEAR`), by the thresholds
    above: a piece of an occluder the finders left, to be filled too."""
    y = np.asarray(image, np.float32) @ LUMA
    around = _blur(np.asarray(filled, np.float32) @ LUMA, max(0.5, RESIDUE_SIGMA * eye_px))
    r = max(1, round(RESIDUE_CLEAR * eye_px))
    clear = cv2.dilate((features > 0.5).astype(np.uint8),
                       cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * r + 1, 2 * r + 1)))
    dark = ((y < RESIDUE_DARK * around) & (inside > 0.5) & (clear == 0)).astype(np.uint8)
    k = max(1, round(RESIDUE_OPEN * eye_px))
    dark = cv2.morphologyEx(dark, cv2.MORPH_OPEN,
                            cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * k + 1, 2 * k + 1)))
    _, labels, stats, _ = cv2.connectedComponentsWithStats(dark, connectivity=8)
    large = ((stats[:, cv2.CC_STAT_AREA] >= RESIDUE_AREA * eye_px * eye_px)
             | (np.maximum(stats[:, cv2.CC_STAT_WIDTH], stats[:, cv2.CC_STAT_HEIGHT])
                >= RESIDUE_LENGTH * eye_px))
    large[0] = False
    out: np.ndarray = large[labels].astype(np.float32)
    return out
