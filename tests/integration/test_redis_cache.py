"""RedisResultCache against a real redis-server: sharing, outage, recovery, purge.

No timing asserts: "quickly" is checked as "answered within a generous wait_for",
and the degraded path is checked by counting network attempts, not milliseconds.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import pytest
import redis

from facefuse.errors import CacheUnavailableError
from facefuse.serving.cache.keys import sha256_hex
from facefuse.serving.cache.results import NAMESPACE, CachedResult, RedisResultCache

if TYPE_CHECKING:
    from tests.integration.conftest import RedisServer

pytestmark = pytest.mark.anyio

LOGGER = "facefuse.serving.cache.results"
VALUE = CachedResult(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, "image/png", 0.734512)


def key(n: int) -> str:
    return sha256_hex(f"key {n}".encode())


async def test_two_instances_share_entries(redis_server: RedisServer) -> None:
    # A generous timeout: the first command of a process (connection handshake) on a
    # loaded machine can pass the production 0.1 s, and this test is about sharing.
    writer = RedisResultCache(redis_server.url, ttl_s=60, socket_timeout=1.0)
    reader = RedisResultCache(redis_server.url, ttl_s=60, socket_timeout=1.0)
    try:
        assert await reader.get(key(1)) is None
        assert await writer.put(key(1), VALUE)
        assert await reader.get(key(1)) == VALUE
        assert (reader.hits, reader.misses) == (1, 1)
        # Stored under our namespace with a TTL.
        direct = redis.Redis.from_url(redis_server.url)
        assert direct.exists(NAMESPACE + key(1)) == 1
        assert 0 < direct.ttl(NAMESPACE + key(1)) <= 60
        direct.close()
    finally:
        await writer.close()
        await reader.close()


async def test_oversized_values_are_not_stored_and_foreign_ones_are_misses(
        redis_server: RedisServer) -> None:
    cache = RedisResultCache(redis_server.url, max_item_bytes=100)
    try:
        assert not await cache.put(key(2), CachedResult(b"x" * 101, "image/png"))
        assert await cache.get(key(2)) is None
        # A value in our namespace that this version did not write reads as a miss.
        direct = redis.Redis.from_url(redis_server.url)
        for junk in (b"image/png\n\x89PNG", b'{"media_type": 3}\nx', b'{"media_type":"a","similarity":"x"}\n'):
            direct.set(NAMESPACE + key(3), junk)
            assert await cache.get(key(3)) is None
        direct.close()
        assert cache.healthy
    finally:
        await cache.close()


class FakeClock:
    """Monotonic seconds that only move when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_killed_redis_degrades_logs_once_and_recovers(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    cache = RedisResultCache(
        redis_server.url, socket_timeout=0.1, retry_interval_s=5.0, clock=clock
    )
    try:
        assert await cache.put(key(4), VALUE)
        redis_server.kill()
        caplog.set_level(logging.DEBUG, logger=LOGGER)

        results = [await asyncio.wait_for(cache.get(key(4)), timeout=5) for _ in range(20)]
        assert results == [None] * 20
        assert not cache.healthy
        assert not await asyncio.wait_for(cache.put(key(5), VALUE), timeout=5)
        warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        # Between probes the cache does not touch the network: one error for 21 calls.
        assert cache.errors == 1

        # Not yet due (the first re-probe waits 0.25 s): probe() does nothing.
        clock.now += 0.2
        assert await cache.probe() is False
        assert cache.errors == 1
        # Due, still down: one failed probe, no new warning; the next wait doubles.
        clock.now += 0.1
        assert await cache.probe() is False
        assert cache.errors == 2
        clock.now += 0.4
        assert await cache.probe() is False
        assert cache.errors == 2
        clock.now += 0.2
        assert await cache.probe() is False
        assert cache.errors == 3
        # The backoff stops growing at retry_interval_s.
        for _ in range(8):
            clock.now += 5.0
            assert await cache.probe() is False
        assert cache.errors == 11

        redis_server.start()  # same port, empty (no persistence)
        assert await cache.get(key(6)) is None  # probe not due yet: still degraded
        assert not cache.healthy
        clock.now += 5.1
        assert await cache.put(key(6), VALUE)  # the due probe runs inside put
        assert cache.healthy
        assert await cache.get(key(6)) == VALUE
        infos = [
            r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO
        ]
        assert any("reachable again" in m for m in infos)
        warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
        assert len(warnings) == 1
    finally:
        await cache.close()


async def test_unresponsive_redis_times_out_and_degrades(redis_server: RedisServer) -> None:
    cache = RedisResultCache(redis_server.url, socket_timeout=0.05, retry_interval_s=60)
    try:
        assert await cache.put(key(7), VALUE)
        redis_server.pause()
        try:
            assert await asyncio.wait_for(cache.get(key(7)), timeout=5) is None
            assert not cache.healthy
            assert cache.errors == 1
            # Degraded: answered without waiting on the stopped server again.
            assert await asyncio.wait_for(cache.get(key(7)), timeout=5) is None
            assert cache.errors == 1
        finally:
            redis_server.resume()
        assert await cache.ping()
        assert cache.healthy
        assert await cache.get(key(7)) == VALUE
    finally:
        await cache.close()


async def test_purge_deletes_only_our_namespace(redis_server: RedisServer) -> None:
    direct = redis.Redis.from_url(redis_server.url)
    cache = RedisResultCache(redis_server.url)
    try:
        direct.set("someone-else:key", b"keep me")
        direct.set("facefuse:v0:old", b"other version, not ours to delete")
        for i in range(1200):  # more than one SCAN/UNLINK batch
            assert await cache.put(key(i), VALUE)
        assert await cache.purge() == 1200
        assert await cache.get(key(0)) is None
        assert direct.get("someone-else:key") == b"keep me"
        assert direct.exists("facefuse:v0:old") == 1
        assert direct.dbsize() == 2
    finally:
        direct.close()
        await cache.close()


async def test_purge_without_redis_raises_a_typed_error(redis_server: RedisServer) -> None:
    cache = RedisResultCache(redis_server.url, socket_timeout=0.1)
    try:
        redis_server.kill()
        with pytest.raises(CacheUnavailableError) as info:
            await asyncio.wait_for(cache.purge(), timeout=5)
        assert info.value.http_status == 503
        assert not cache.healthy
    finally:
        await cache.close()
