"""Caches scoped per tenant, against a real server with two API keys: key B sending
key A's exact bytes is computed for B (no hit header, detection in Server-Timing),
while A's own repeat is a hit; ``FACEFUSE_CACHE_SCOPE=shared`` shares them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from server_harness import GRACEFUL_EXIT, ServerProcess, photo_variants

from facefuse.config import Settings

A, B = "tenant-a-0123456789abcdef", "tenant-b-0123456789abcdef"


def _fuse(server: ServerProcess, token: str, source: bytes, target: bytes) -> tuple[str, str]:
    with server.client(token) as c:
        r = c.post("/v1/fuse", files={"source": ("s.jpg", source), "target": ("t.jpg", target)})
    assert r.status_code == 200, r.text
    return r.headers["x-facefuse-cache"], r.headers["server-timing"]


@pytest.mark.parametrize("scope", ["tenant", "shared"])
def test_one_tenant_never_sees_another_tenants_cache(
        scope: str, settings: Settings, model_dir: Path, tmp_path: Path,
        sample_images: dict[str, np.ndarray]) -> None:
    server = ServerProcess(settings.home, tmp_path, {
        "FACEFUSE_API_KEYS": f"alpha:{A} beta:{B}", "FACEFUSE_CACHE_SCOPE": scope},
        name=f"tenancy-{scope}").start()
    try:
        source, target = photo_variants(sample_images, 2, seed=11)
        cache, timing = _fuse(server, A, source, target)
        assert cache == "miss" and "detect" in timing
        cache, timing = _fuse(server, B, source, target)
        if scope == "tenant":
            assert cache == "miss", "key B was told what key A uploaded"
            assert "detect" in timing  # computed for B, not read from A's analyses
        else:
            assert cache == "hit"
        assert _fuse(server, A, source, target)[0] == "hit"
    finally:
        assert server.stop() in GRACEFUL_EXIT, server.log_tail()
