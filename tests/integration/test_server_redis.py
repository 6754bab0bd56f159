"""Two server processes sharing a real redis-server as their L2 result cache.

A result computed by one process is a cache hit in the other. When Redis dies, both
keep answering (computing, without L2) and report ``degraded`` in /readyz; after
Redis comes back they report ``ready`` again and share results again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from server_harness import GRACEFUL_EXIT, ServerProcess, photo_variants

from facefuse.config import Settings


@pytest.fixture
def pair(
    settings: Settings, model_dir: Path, redis_server: Any, tmp_path: Path
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    env = {"FACEFUSE_REDIS_URL": redis_server.url, "FACEFUSE_REDIS_TIMEOUT_S": "0.2"}
    a = ServerProcess(settings.home, tmp_path, env, name="redis-a")
    b = ServerProcess(settings.home, tmp_path, env, name="redis-b")
    with ExitStack() as stack:
        for proc in (a, b):
            proc.start()
            stack.callback(proc.kill)
        yield a, b
        for proc in (a, b):
            assert proc.stop() in GRACEFUL_EXIT, proc.log_tail()


def fuse(c: httpx.Client, source: bytes, target: bytes, degree: int = 70) -> httpx.Response:
    r = c.post("/v1/fuse", files={"source": ("s.jpg", source), "target": ("t.jpg", target)},
               data={"degree": str(degree)})
    assert r.status_code == 200, r.text
    return r


def test_l2_is_shared_across_processes_and_survives_a_redis_outage(
    pair: tuple[ServerProcess, ServerProcess], redis_server: Any,
    sample_images: dict[str, np.ndarray],
) -> None:
    a, b = pair
    src, tgt, src2, tgt2 = photo_variants(sample_images, 4, seed=7)
    with a.client() as ca, b.client() as cb:
        for c in (ca, cb):
            ready = c.get("/readyz").json()
            assert (ready["status"], ready["checks"]["l2"]) == ("ready", "redis")

        # Computed by A, served from Redis by B (which never saw these images).
        first = fuse(ca, src, tgt)
        assert first.headers["x-facefuse-cache"] == "miss"
        second = fuse(cb, src, tgt)
        assert second.headers["x-facefuse-cache"] == "hit"
        assert second.content == first.content

        # Redis dies: requests still succeed (computed), readiness says degraded.
        redis_server.kill()
        during = fuse(cb, src, tgt)
        assert during.headers["x-facefuse-cache"] == "miss"
        assert during.content == first.content  # deterministic pipeline
        assert fuse(ca, src2, tgt2).headers["x-facefuse-cache"] == "miss"
        for c in (ca, cb):
            ready = c.get("/readyz")
            assert ready.status_code == 200
            assert ready.json()["status"] == "degraded"
            assert ready.json()["checks"]["l2_healthy"] is False

        # Redis is back (empty): ready again, and results are shared again.
        redis_server.start()
        for c in (ca, cb):
            ready = c.get("/readyz").json()
            assert (ready["status"], ready["checks"]["l2"]) == ("ready", "redis")
        again = fuse(cb, src2, tgt2, degree=55)
        assert again.headers["x-facefuse-cache"] == "miss"
        shared = fuse(ca, src2, tgt2, degree=55)
        assert shared.headers["x-facefuse-cache"] == "hit"
        assert shared.content == again.content

        metrics = ca.get("/metrics").text
        assert 'facefuse_cache_healthy{level="l2"} 1.0' in metrics


def test_one_state_change_per_outage_and_templates_back_at_once(
    settings: Settings, model_dir: Path, redis_factory: Any, tmp_path: Path,
    sample_images: dict[str, np.ndarray], sample_paths: dict[str, Path],
) -> None:
    """Many pooled connections when Redis dies: after it is back, L2 goes from
    unavailable to reachable exactly once (no flapping), and the template routes on
    their own Redis answer at once."""
    from concurrent.futures import ThreadPoolExecutor

    from server_harness import ADMIN_TOKEN

    l2, templates = redis_factory(), redis_factory("--appendonly", "yes",
                                                   "--maxmemory-policy", "noeviction")
    server = ServerProcess(settings.home, tmp_path, {
        "FACEFUSE_REDIS_URL": l2.url, "FACEFUSE_REDIS_TIMEOUT_S": "0.2",
        "FACEFUSE_ADMIN_KEYS": f"ops:{ADMIN_TOKEN}", "FACEFUSE_TEMPLATES_BACKEND": "redis",
        "FACEFUSE_TEMPLATES_REDIS_URL": templates.url}, name="flap").start()
    photos = photo_variants(sample_images, 6, seed=21)

    def burst(c: httpx.Client, degree: int) -> list[int]:
        with ThreadPoolExecutor(6) as pool:
            return list(pool.map(lambda p: c.post("/v1/fuse", files={
                "source": ("s.jpg", p), "target": ("t.jpg", photos[0])},
                data={"degree": str(degree)}).status_code, photos))

    try:
        with server.client(ADMIN_TOKEN) as c:
            tid = c.post("/v1/templates", files={"image": (
                "t.jpg", sample_paths["obama"].read_bytes())}).json()["id"]
            assert burst(c, 60) == [200] * 6
            l2.kill()
            templates.stop()
            assert burst(c, 61) == [200] * 6
            l2.start()
            templates.start()
            assert c.get(f"/v1/templates/{tid}").status_code == 200
            for degree in range(62, 66):
                assert burst(c, degree) == [200] * 6
                assert c.get("/readyz").json()["status"] == "ready"
    finally:
        assert server.stop() in GRACEFUL_EXIT, server.log_tail()
    log = server.log_tail(400_000)
    assert log.count("redis cache unavailable") == 1, log[-4000:]
    assert log.count("redis cache reachable again") == 1, log[-4000:]
