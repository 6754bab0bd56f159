"""Lipstick belongs to the photo: the source's lips take the target's colour.

Lipstick is on a person's photo, not in their face: carried over, a woman's red
lips went onto men. The skin's tone transfer (a Gaussian of a fifth of the eye
distance) averages the lips with the skin around them, so their own colour passes
it. Here the lips are multiplied, per channel, by the ratio of the target's mean
colour to the source's over them (both warped onto the fused mesh): their average
colour becomes the target photo's (its lipstick, if it wears any), their shape and
structure stay the source's. (The same on the lids, out to the lash line, took
identity away — the recogniser's "still the target" rose from 30 to 34 of 65
strangers' pairs — and left a smoky eye's liner where it was: not done.)

Layers (h, w, 3) float32 0..255; landmarks (N, 3) in their frame; masks (h, w)
float32 in [0, 1].
"""

from __future__ import annotations

import numpy as np

from facefuse.fusion import mask as masks

#: Clamp on a region's per-channel colour ratio.
MAX_GAIN = 1.8
#: Fewest pixels of a region for its ratio to be read.
MIN_PIXELS = 12


def _ratio(source: np.ndarray, target: np.ndarray, where: np.ndarray) -> np.ndarray | None:
    """(3,) per-channel ratio of the target's mean colour to the source's on ``where``
    (bool (h, w)), clamped to [1/:data:`MAX_GAIN`, :data:`MAX_GAIN`]; None when
    ``where`` is too small."""
    if int(where.sum()) < MIN_PIXELS:
        return None
    s = source[where].mean(0)
    t = target[where].mean(0)
    gain: np.ndarray = np.clip(t / np.maximum(s, 1.0), 1.0 / MAX_GAIN, MAX_GAIN)
    return gain.astype(np.float32)


def take_photo_colours(source_layer: np.ndarray, target_layer: np.ndarray,
                       landmarks: np.ndarray, feather: float) -> None:
    """Give the lips of ``source_layer`` (in place) the mean colour of
    ``target_layer`` there, the fused mesh ``landmarks`` locating them (see the
    module doc); ``feather`` the blend mask's feather width (pixels)."""
    h, w = source_layer.shape[:2]
    soft = masks.lips_mask(landmarks, (0, 0, w, h), feather)
    # (The inner part of their soft mask: its outer quarter is the skin around them.)
    lips = np.clip(2.0 * soft - 0.5, 0.0, 1.0)
    gain = _ratio(source_layer, target_layer, lips > 0.5)
    if gain is not None:
        source_layer *= 1.0 + (gain[None, None, :] - 1.0) * lips[..., None]
