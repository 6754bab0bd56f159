"""Tone and lighting transfer between two face layers at the same geometry.

Both layers are float32 (H, W, 3) RGB over the same region, warped onto the same
mesh, so their low frequencies describe the same surface. Multiplying the
source layer by the ratio of the target's to the source's local mean colour
(masked Gaussian, normalised convolution) gives it the target's skin tone and
shading while keeping its own detail (the identity).
"""

from __future__ import annotations

import cv2
import numpy as np


def masked_blur(image: np.ndarray, weight: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian local mean of ``image`` (H, W, C) counting only pixels with
    ``weight`` (H, W) > 0 (normalised convolution); (H, W, C) float32."""
    w: np.ndarray = weight.astype(np.float32)
    h, wd = w.shape
    # A low-pass this wide survives decimation: blur at 1/k size (σ/k ≥ 2 px) and
    # upsample, so the cost stays flat as faces get larger.
    k = max(1, int(sigma // 2.0))
    num_in: np.ndarray = image * w[..., None]
    if k > 1:
        small = (max(1, wd // k), max(1, h // k))
        num_in = cv2.resize(num_in, small, interpolation=cv2.INTER_AREA)
        w = cv2.resize(w, small, interpolation=cv2.INTER_AREA)
    s = sigma * w.shape[1] / wd
    num = cv2.GaussianBlur(num_in, (0, 0), s, borderType=cv2.BORDER_REFLECT)
    den = cv2.GaussianBlur(w, (0, 0), s, borderType=cv2.BORDER_REFLECT)
    out: np.ndarray = num / np.maximum(den, 1e-4)[..., None]
    if k > 1:
        out = cv2.resize(out, (wd, h), interpolation=cv2.INTER_LINEAR)
    return out


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
    mu_t = masked_blur(target, weight, sigma)
    mu_s = masked_blur(source, weight, sigma)
    gain = np.clip((mu_t + 1.0) / (mu_s + 1.0), 1.0 / max_gain, max_gain)
    out: np.ndarray = np.clip(source * gain, 0.0, 255.0)
    return out.astype(np.float32)
