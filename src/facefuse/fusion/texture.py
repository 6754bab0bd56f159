"""Tone and lighting transfer between two face layers at the same geometry.

Both layers are float32 (H, W, 3) RGB over the same region, warped onto the same
mesh, so their low frequencies describe the same surface. Multiplying the
source layer by the ratio of the target's to the source's local mean colour
(masked Gaussian, normalised convolution) gives it the target's skin tone and
shading while keeping its own detail (the identity).
"""

from __future__ import annotations

import numpy as np

from facefuse.imaging.pixels import OpenCVPixels, masked_blur

__all__ = ["masked_blur", "transfer_lighting"]


def transfer_lighting(
    source: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray,
    sigma: float,
    *,
    max_gain: float = 3.0,
) -> np.ndarray:
    """``source`` × (local mean of ``target`` / local mean of ``source``).

    Args:
        source, target: (H, W, 3) float32 RGB in 0..255 at the same geometry.
        weight: (H, W) float32 — where both layers are valid face skin.
        sigma: Gaussian sigma in pixels; larger keeps more of the source's own
            tone, smaller copies more of the target's local shading.
        max_gain: clamp on the per-pixel, per-channel gain.
    Returns:
        (H, W, 3) float32 in 0..255.
    """
    return OpenCVPixels().lighting(source, target, weight, sigma, max_gain)
