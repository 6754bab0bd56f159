"""Cache keys: what makes two requests the same.

* L1 (analyses): :func:`analysis_key` — the SHA-256 of the uploaded image's bytes
  (:func:`sha256_hex`; the same bytes always decode to the same pixels, and hashing
  them is ~20× cheaper than hashing the decoded pixels) plus the model versions and
  the analysis settings. Only exact content: an analysis holds identity embeddings,
  and two different images however alike (a fused photo and its original) must never
  share them;
* L2 (results): :func:`result_key` — the SHA-256 of the uploaded source and target
  *bytes* (a hit needs no decoding) plus the options and the model versions.

Both are scoped per tenant (the API key's label) unless ``FACEFUSE_CACHE_SCOPE=shared``:
a hit — its header, its timing — would tell one tenant what another uploaded.
:func:`tenant_key` scopes a result key; the analysis key takes the tenant among its
options.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["analysis_key", "result_key", "sha256_hex", "tenant_key"]


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    """Hex SHA-256 of raw bytes (e.g. an uploaded file, before any decoding)."""
    return hashlib.sha256(data).hexdigest()


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

    ``image_digest`` is :func:`sha256_hex` of the encoded image.
    ``options`` holds analysis settings that change the faces (detector, thresholds).
    """
    doc = {
        "kind": "analysis",
        "image": image_digest,
        "models": dict(model_versions),
        "options": dict(options or {}),
    }
    return hashlib.sha256(_canonical(doc)).hexdigest()


def tenant_key(key: str, tenant: str) -> str:
    """``key`` seen by ``tenant`` only (unchanged for the shared scope, ``tenant=""``)."""
    if not tenant:
        return key
    return hashlib.sha256(_canonical({"kind": "tenant", "tenant": tenant, "key": key})
                          ).hexdigest()
