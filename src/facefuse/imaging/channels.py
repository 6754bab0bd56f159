"""Per-pixel weights applied to every channel of an image, at full memory speed.

NumPy broadcasts an (H, W, 1) operand over an (H, W, 3) image with an inner loop
three elements long: ``image * weight[..., None]`` runs about 6× slower than the
same product of two (H, W, 3) arrays, and ``np.copyto(..., where=mask[..., None])``
about 7× slower than a same-shape mask (measured on a 700×600 face crop, the
render's full-resolution size at 1.5 MP: 2.3 ms against 0.4 ms with the weight
spread first; 9.6 ms against OpenCV's 1.4 ms for the masked copy). These helpers
spread the weight into every channel once (``cv2.merge``, ~0.15 ms there) and do
the arithmetic on equal shapes. The results are bit-identical to the broadcasting
forms: the same float32 operations, element by element.
"""

from __future__ import annotations

import cv2
import numpy as np

__all__ = ["copy_where", "each_channel"]


def each_channel(weight: np.ndarray, channels: int = 3) -> np.ndarray:
    """(H, W) ``weight`` repeated into (H, W, ``channels``), same dtype (a new array)."""
    w = np.ascontiguousarray(weight)
    if channels == 1:
        return w[..., None].copy()
    if w.dtype == np.bool_:
        out8: np.ndarray = cv2.merge([w.view(np.uint8)] * channels)
        return out8.view(np.bool_)
    out: np.ndarray = cv2.merge([w] * channels)
    return out


def copy_where(dst: np.ndarray, src: np.ndarray, where: np.ndarray) -> None:
    """``dst[where] = src[where]`` in place for (H, W, C) images and an (H, W)
    bool ``where`` (``np.copyto(dst, src, where=where[..., None])``; OpenCV's
    masked copy, 1.4 ms where that takes 9.6, when both images share a dtype and
    ``dst`` is laid out row by row)."""
    mask = np.ascontiguousarray(where, dtype=np.bool_)
    if (src.dtype != dst.dtype or src.shape != dst.shape or dst.ndim != 3
            or dst.strides[1:] != (dst.shape[2] * dst.itemsize, dst.itemsize)):
        np.copyto(dst, src, where=each_channel(mask, dst.shape[2]) if dst.ndim == 3 else mask)
        return
    out = cv2.copyTo(src, mask.view(np.uint8), dst)
    if not np.may_share_memory(out, dst):  # OpenCV would only reallocate on a mismatch
        np.copyto(dst, out)
