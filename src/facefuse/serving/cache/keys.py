"""Cache keys: what makes two requests the same.

* L1 (analyses): :func:`analysis_key` — the SHA-256 of the decoded pixels
  (:func:`pixels_sha256`, or an opt-in perceptual hash :func:`phash`) plus the model
  versions and the analysis settings;
* L2 (results): :func:`result_key` — the SHA-256 of the uploaded source and target
  *bytes* (a hit needs no decoding) plus the options and the model versions.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import cv2
import numpy as np

__all__ = ["analysis_key", "hamming", "phash", "pixels_sha256", "result_key", "sha256_hex"]


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    """Hex SHA-256 of raw bytes (e.g. an uploaded file, before any decoding)."""
    return hashlib.sha256(data).hexdigest()


def pixels_sha256(image: np.ndarray) -> str:
    """Hex SHA-256 of decoded pixels, including shape and dtype.

    Two files that decode to the same pixels (a re-saved PNG, stripped metadata)
    share the key; any pixel difference changes it.
    """
    h = hashlib.sha256()
    h.update(f"{image.dtype.str}|{image.shape}|".encode())
    h.update(np.ascontiguousarray(image).data)
    return h.hexdigest()


def _canonical(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _check_digest(name: str, value: str) -> None:
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError(f"{name} must be a lowercase hex SHA-256, got {value!r:.80}")


def result_key(
    source_sha256: str,
    target_sha256: str,
    options: Mapping[str, Any],
    model_versions: Mapping[str, str],
) -> str:
    """The L2 key of a fused result (hex SHA-256, without the namespace).

    Args:
        source_sha256, target_sha256: :func:`sha256_hex` of the uploaded bytes.
        options: everything that changes the output (degree, face selection, format,
            quality...), JSON-serialisable. Normalise types first: ``1`` and ``1.0``
            are different JSON and give different keys (a miss, never a wrong hit).
        model_versions: model name -> version or sha256 of every model involved, so a
            model update never serves a result of the old one.
    """
    _check_digest("source_sha256", source_sha256)
    _check_digest("target_sha256", target_sha256)
    doc = {
        "kind": "fuse",
        "source": source_sha256,
        "target": target_sha256,
        "options": dict(options),
        "models": dict(model_versions),
    }
    return hashlib.sha256(_canonical(doc)).hexdigest()


def analysis_key(
    image_digest: str,
    model_versions: Mapping[str, str],
    options: Mapping[str, Any] | None = None,
) -> str:
    """The L1 key of one image's analysis (faces, meshes, embeddings).

    ``image_digest`` is :func:`pixels_sha256` of the decoded image, or — only with
    near-duplicate matching switched on — ``f"phash:{phash(image):016x}"``.
    ``options`` holds analysis settings that change the faces (detector, thresholds).
    """
    doc = {
        "kind": "analysis",
        "image": image_digest,
        "models": dict(model_versions),
        "options": dict(options or {}),
    }
    return hashlib.sha256(_canonical(doc)).hexdigest()


def phash(image: np.ndarray) -> int:
    """64-bit DCT perceptual hash of an image (near-duplicates differ in few bits).

    Args:
        image: ``(H, W)`` gray or ``(H, W, 3)`` RGB, uint8 (any size >= 1x1).

    Returns:
        An int in ``[0, 2**64)``: bit ``i`` (row-major over the 8x8 lowest DCT
        frequencies of the 32x32 grey thumbnail) is set when that coefficient is
        above the median of the 63 non-DC ones.

    WARNING — what a pHash may key: ONLY the analysis of ONE image (its faces,
    meshes and embeddings, in L1, opt-in). Never a fused result, never anything that
    is returned to a client as-is: two different photos can share a pHash (that is
    its purpose — re-encoded or resized copies match), and a fused output served from
    a pHash collision would hand one person a picture carrying another person's face.
    Results are keyed by the exact SHA-256 of the uploaded bytes (:func:`result_key`).
    """
    if image.ndim == 3 and image.shape[2] == 3:
        gray = cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
    elif image.ndim == 2:
        gray = image
    else:
        raise ValueError(f"phash expects (H, W) or (H, W, 3), got {image.shape}")
    small = cv2.resize(gray.astype(np.float32), (32, 32), interpolation=cv2.INTER_AREA)
    low = cv2.dct(small)[:8, :8].reshape(-1)
    median = float(np.median(low[1:]))
    bits = low > median
    bits[0] = False  # the DC term (mean brightness) carries no structure
    value = 0
    for bit in bits:
        value = (value << 1) | int(bit)
    return value


def hamming(a: int, b: int) -> int:
    """Number of differing bits between two hashes (0..64 for :func:`phash`)."""
    return (a ^ b).bit_count()
