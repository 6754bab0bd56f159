"""Boundary checks for decoded images passed between modules."""

from __future__ import annotations

import numpy as np

from facefuse.errors import InvalidArgumentError


def require_rgb(image: np.ndarray) -> None:
    """Raise :class:`InvalidArgumentError` unless ``image`` is a non-empty
    (H, W, 3) uint8 array."""
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3:
        shape = getattr(image, "shape", None)
        raise InvalidArgumentError(f"expected an RGB image of shape (H, W, 3), got {shape}")
    if image.dtype != np.uint8:
        raise InvalidArgumentError(f"expected a uint8 image, got {image.dtype}")
    if image.shape[0] < 1 or image.shape[1] < 1:
        raise InvalidArgumentError("image is empty")
