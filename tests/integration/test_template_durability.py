"""Templates are user data, not cache: against real redis-servers on loopback, a
server whose L2 Redis evicts under memory pressure and whose template Redis restarts
loses no template; a template store that could lose them says so (/readyz, metrics,
logs), and a wiped one is detected and logged."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from server_harness import ADMIN_TOKEN, GRACEFUL_EXIT, ServerProcess, metric_values

from facefuse.config import Settings

if TYPE_CHECKING:
    from tests.integration.conftest import RedisServer

#: An L2 cache as the docs used to recommend it: a memory cap, LRU over every key.
CACHE_ARGS = ("--maxmemory", "20mb", "--maxmemory-policy", "allkeys-lru")
#: The template store's Redis as shipped: never evicts, appends every write to disk.
DURABLE_ARGS = ("--maxmemory-policy", "noeviction", "--appendonly", "yes",
                "--appendfsync", "always")


def _server(settings: Settings, tmp_path: Path, l2: RedisServer,
            templates: RedisServer) -> ServerProcess:
    return ServerProcess(settings.home, tmp_path, {
        "FACEFUSE_ADMIN_KEYS": f"ops:{ADMIN_TOKEN}",
        "FACEFUSE_REDIS_URL": l2.url, "FACEFUSE_REDIS_TIMEOUT_S": "0.5",
        "FACEFUSE_TEMPLATES_BACKEND": "redis", "FACEFUSE_TEMPLATES_REDIS_URL": templates.url,
    }, name="durable")


@pytest.fixture
def stack(settings: Settings, model_dir: Path, tmp_path: Path,
          redis_factory: Callable[..., RedisServer]
          ) -> Iterator[tuple[ServerProcess, RedisServer, RedisServer]]:
    l2, templates = redis_factory(*CACHE_ARGS), redis_factory(*DURABLE_ARGS)
    server = _server(settings, tmp_path, l2, templates).start()
    try:
        yield server, l2, templates
    finally:
        assert server.stop() in GRACEFUL_EXIT, server.log_tail()


def _register(admin: httpx.Client, sample_paths: dict[str, Path], names: list[str]) -> list[str]:
    ids = []
    for name in names:
        r = admin.post("/v1/templates", files={"image": ("t.jpg",
                                                        sample_paths[name].read_bytes())},
                       data={"name": name, "metadata": '{"campaign": "spring"}'})
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    return ids


def _fill_cache(l2: RedisServer) -> None:
    """Push the L2 Redis past its maxmemory with cache-shaped entries until it evicts."""
    import redis

    client = redis.Redis(port=l2.port)
    blob = os.urandom(512 * 1024)
    for i in range(200):
        client.set(f"facefuse:v2:{i:064x}", blob, ex=3600)
        if int(l2.info("stats")["evicted_keys"]) > 20:
            break
    client.close()
    assert int(l2.info("stats")["evicted_keys"]) > 20


def test_no_template_lost_to_cache_eviction_or_a_restart(
        stack: tuple[ServerProcess, RedisServer, RedisServer],
        sample_paths: dict[str, Path]) -> None:
    server, l2, templates = stack
    with server.client(ADMIN_TOKEN) as admin:
        ids = _register(admin, sample_paths, ["obama", "biden", "astronaut"])
        # Real fuses fill the cache too, then cache pressure evicts.
        for tid in ids[:2]:
            r = admin.post(f"/v1/templates/{tid}/fuse",
                           files={"source": ("s.jpg", sample_paths["obama2"].read_bytes())})
            assert r.status_code == 200, r.text
        _fill_cache(l2)
        templates.stop()
        templates.start()
        listing = admin.get("/v1/templates").json()
        assert sorted(t["id"] for t in listing["templates"]) == sorted(ids)
        for tid in ids:
            detail = admin.get(f"/v1/templates/{tid}")
            assert detail.status_code == 200, detail.text
            assert detail.json()["metadata"] == {"campaign": "spring"}
        r = admin.post(f"/v1/templates/{ids[2]}/fuse",
                       files={"source": ("s.jpg", sample_paths["obama2"].read_bytes())})
        assert r.status_code == 200, r.text
        ready = admin.get("/readyz").json()
        assert ready["status"] == "ready", ready
        assert ready["checks"]["templates_durable"] is True
        metrics = admin.get("/metrics").text
    assert metric_values(metrics, "facefuse_template_store_durable") == {"": 1.0}
    assert metric_values(metrics, "facefuse_template_store_incidents_total") == {
        '{kind="lost"}': 0.0, '{kind="damaged"}': 0.0}


def test_a_store_that_can_lose_templates_says_so_and_a_wipe_is_logged(
        settings: Settings, model_dir: Path, tmp_path: Path,
        redis_factory: Callable[..., RedisServer], sample_paths: dict[str, Path]) -> None:
    l2, volatile = redis_factory(*CACHE_ARGS), redis_factory(*CACHE_ARGS)
    server = _server(settings, tmp_path, l2, volatile).start()
    try:
        with server.client(ADMIN_TOKEN) as admin:
            ready = admin.get("/readyz").json()
            assert ready["status"] == "degraded", ready
            assert ready["checks"]["templates_durable"] is False
            assert "noeviction" in ready["checks"]["templates_warning"]
            assert "appendonly" in ready["checks"]["templates_warning"]
            _register(admin, sample_paths, ["obama"])
            volatile.kill()
            volatile.start()  # no persistence: empty
            assert admin.get("/readyz").json()["checks"]["templates_reachable"] is True
            assert admin.get("/v1/templates").json()["count"] == 0
            metrics = admin.get("/metrics").text
    finally:
        assert server.stop() in GRACEFUL_EXIT, server.log_tail()
    assert metric_values(metrics, "facefuse_template_store_durable") == {"": 0.0}
    assert metric_values(metrics, "facefuse_template_store_incidents_total")[
        '{kind="lost"}'] == 1.0
    log = server.log_tail(60000)
    assert "template store is not durable" in log
    assert "template store in Redis was wiped" in log


def test_the_template_store_may_not_be_the_cache(settings: Settings) -> None:
    from facefuse.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="needs templates_redis_url"):
        Settings(templates_backend="redis", redis_url="redis://127.0.0.1:6379/0")
    with pytest.raises(InvalidArgumentError, match="must not be the L2"):
        Settings(templates_backend="redis", redis_url="redis://:pw@cache:6379/0",
                 templates_redis_url="redis://cache:6379")
    Settings(templates_backend="redis", redis_url="redis://cache:6379/0",
             templates_redis_url="redis://templates:6379/0")
