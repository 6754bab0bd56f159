"""L2: encoded fused results, in process or in Redis.

A :class:`ResultCache` is :class:`InProcessResultCache` (the embedded default) or
:class:`RedisResultCache` (``FACEFUSE_REDIS_URL``), keyed by
:func:`~facefuse.serving.cache.keys.result_key`. Its value is a
:class:`CachedResult`: the encoded body, its media type and the identity similarity.

The Redis cache never fails a request: when Redis is down or slow it degrades to a
miss / skipped write, logs the outage once, reports ``healthy = False`` (the server's
/readyz says "degraded") and probes Redis again with a backoff (0.25 s, doubling up to
``retry_interval_s``) until it answers. One outage is one state change each way: at
the first failure every pooled connection is dropped (they all point at the Redis
that went away), so once a probe succeeds no stale connection fails a command and
flips the state back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from facefuse.errors import CacheUnavailableError
from facefuse.serving.cache.lru import ByteLRU, CacheStats

__all__ = ["NAMESPACE", "CachedResult", "InProcessResultCache", "RedisResultCache",
           "ResultCache"]

log = logging.getLogger(__name__)

#: Prefix of every Redis key facefuse writes; bump the version when the value format
#: or the key recipe changes, so old entries are simply never read again.
NAMESPACE = "facefuse:v2:"

@dataclass(frozen=True)
class CachedResult:
    """An encoded output and what its response reports about it.

    Attributes:
        body: the encoded image.
        media_type: its MIME type (``image/jpeg``, ``image/png``, ``image/webp``).
        similarity: cosine similarity of the output face's identity to the source's;
            None when not computed.
        skipped: the chosen faces not fused, as the compact JSON list the
            ``X-Facefuse-Skipped-Faces`` header carries; empty when none was skipped.
    """

    body: bytes
    media_type: str
    similarity: float | None = None
    skipped: str = ""


#: First wait before re-probing a Redis that failed, seconds (doubles per failed probe).
FIRST_BACKOFF_S = 0.25

#: Bytes charged per in-process entry besides the body (key, tuple, dict slot).
ENTRY_OVERHEAD = 256


@runtime_checkable
class ResultCache(Protocol):
    """The L2 cache of encoded results; every method is safe to call when degraded."""

    @property
    def kind(self) -> str:
        """``memory`` or ``redis`` (for logs and /readyz)."""

    @property
    def healthy(self) -> bool:
        """False while the backing store is unreachable (the cache then acts empty)."""

    async def ping(self) -> bool:
        """Check the backend now, whatever the retry schedule (start-up); updates
        ``healthy`` and returns it."""

    async def get(self, key: str) -> CachedResult | None:
        """The cached result or None (miss, or backend unavailable)."""

    async def put(self, key: str, value: CachedResult) -> bool:
        """Store; False when skipped (too large, or backend unavailable)."""

    async def purge(self) -> int:
        """Delete every facefuse entry; returns how many were deleted."""

    async def probe(self) -> bool:
        """Check the backend now if a retry is due; returns ``healthy``."""

    def stats(self) -> CacheStats:
        """Counters snapshot for the metrics collector."""

    async def close(self) -> None:
        """Release connections."""


class InProcessResultCache:
    """L2 in this process: a :class:`ByteLRU` of :class:`CachedResult` (embedded default).

    Args:
        max_bytes: bound on the summed body sizes (plus a small per-entry overhead).
        max_item_bytes: larger results are not cached (default: ``max_bytes // 8``,
            so one huge output cannot flush everything else).
    """

    def __init__(self, max_bytes: int, *, max_item_bytes: int | None = None) -> None:
        self.max_item_bytes = max_item_bytes if max_item_bytes is not None else max_bytes // 8
        self._lru: ByteLRU[str, CachedResult] = ByteLRU(max_bytes, _result_size)

    kind = "memory"

    @property
    def healthy(self) -> bool:
        """Always True: nothing to lose contact with."""
        return True

    async def ping(self) -> bool:
        return True

    async def get(self, key: str) -> CachedResult | None:
        return self._lru.get(key)

    async def put(self, key: str, value: CachedResult) -> bool:
        if len(value.body) > self.max_item_bytes:
            return False
        return self._lru.put(key, value)

    async def purge(self) -> int:
        return self._lru.clear()

    async def probe(self) -> bool:
        return True

    def stats(self) -> CacheStats:
        return self._lru.stats()

    async def close(self) -> None:
        self._lru.clear()


def _result_size(value: CachedResult) -> int:
    return len(value.body) + len(value.media_type) + len(value.skipped) + ENTRY_OVERHEAD


class RedisResultCache:
    """L2 in Redis, shared by every server process; degrades instead of failing.

    Values are stored as ``<JSON head> "\\n" <body>`` under ``facefuse:v2:<key>``, the
    head ``{"media_type": ..., "similarity": ..., "skipped": ...}``,
    with a TTL (one ``SET ... EX`` round trip). Each command is bounded by
    ``socket_timeout`` and never retried: a cache that is slower than computing is
    worse than no cache.

    Args:
        url: ``redis://host:port/db`` (``rediss://`` for TLS).
        ttl_s: time to live of each entry, seconds.
        max_item_bytes: larger bodies are not cached.
        socket_timeout: connect and command timeout, seconds (keep it at 0.05-0.1).
        retry_interval_s: while unhealthy, Redis is probed at most this often; in
            between, every call returns at once without touching the network.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        url: str,
        *,
        ttl_s: int = 3600,
        max_item_bytes: int = 8 * 1024 * 1024,
        socket_timeout: float = 0.1,
        retry_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Imported here: redis is a serving-only dependency.
        import redis.asyncio as aredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        if ttl_s <= 0:
            raise ValueError("ttl_s must be > 0")
        self.url = url
        self.ttl_s = ttl_s
        self.max_item_bytes = max_item_bytes
        self.socket_timeout = socket_timeout
        self.retry_interval_s = retry_interval_s
        self._clock = clock
        self._client: Any = aredis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            max_connections=64,
        )
        self.kind = "redis"
        self._healthy = True
        self._next_probe = 0.0
        self._backoff = min(FIRST_BACKOFF_S, retry_interval_s)
        self._probe_lock = asyncio.Lock()
        self.hits = 0
        self.misses = 0
        self.errors = 0
        self.skipped = 0

    # --- health --------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """False from the first failed command until a probe succeeds."""
        return self._healthy

    async def _failed(self, op: str, exc: BaseException) -> None:
        self.errors += 1
        if not self._healthy:
            return  # a command that raced the first failure: the same outage
        self._healthy = False
        self._backoff = min(FIRST_BACKOFF_S, self.retry_interval_s)
        self._next_probe = self._clock() + self._backoff
        # Once per outage; the URL may hold a password, so only the op and error.
        log.warning(
            "redis cache unavailable (%s failed: %s: %s); serving without L2, "
            "retrying with backoff up to %.1fs",
            op,
            type(exc).__name__,
            exc,
            self.retry_interval_s,
        )
        # Every pooled connection points at the Redis that failed: drop them all, so
        # none fails a command after a probe found Redis back.
        with contextlib.suppress(Exception):
            await self._client.connection_pool.disconnect(inuse_connections=True)

    async def _usable(self) -> bool:
        """True when commands may be sent: healthy, or a due probe just succeeded."""
        if self._healthy:
            return True
        if self._clock() < self._next_probe:
            return False
        return await self.probe()

    async def probe(self) -> bool:
        """PING Redis if healthy status is unknown and a retry is due; returns ``healthy``.

        Only one probe runs at a time; concurrent callers wait for its answer.
        """
        if self._healthy:
            return True
        async with self._probe_lock:
            if self._healthy or self._clock() < self._next_probe:
                return self._healthy
            try:
                await self._bounded(self._client.ping())
            except Exception as exc:
                self.errors += 1
                self._backoff = min(self._backoff * 2, self.retry_interval_s)
                self._next_probe = self._clock() + self._backoff
                log.debug("redis probe failed: %r", exc)
                return False
            self._recovered()
            return True

    def _recovered(self) -> None:
        self._healthy = True
        log.info("redis cache reachable again; L2 re-enabled")

    async def ping(self) -> bool:
        """PING now regardless of the retry schedule (start-up, /readyz); updates health."""
        async with self._probe_lock:
            try:
                await self._bounded(self._client.ping())
            except Exception as exc:
                await self._failed("ping", exc)
                return False
            if not self._healthy:
                self._recovered()
            return True

    async def _bounded(self, coro: Any) -> Any:
        # socket_timeout bounds each socket op; this caps the whole command (DNS,
        # connect and read together) in case one of them does not honour it.
        return await asyncio.wait_for(coro, timeout=self.socket_timeout * 3)

    # --- the cache -----------------------------------------------------------------

    async def get(self, key: str) -> CachedResult | None:
        if not await self._usable():
            self.misses += 1
            return None
        try:
            raw = await self._bounded(self._client.get(NAMESPACE + key))
        except Exception as exc:
            await self._failed("GET", exc)
            self.misses += 1
            return None
        value = _decode_value(raw) if raw is not None else None
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        return value

    async def put(self, key: str, value: CachedResult) -> bool:
        if len(value.body) > self.max_item_bytes or not await self._usable():
            self.skipped += 1
            return False
        payload = _encode_value(value)
        try:
            await self._bounded(self._client.set(NAMESPACE + key, payload, ex=self.ttl_s))
        except Exception as exc:
            await self._failed("SET", exc)
            self.skipped += 1
            return False
        return True

    async def purge(self) -> int:
        """SCAN + UNLINK every ``facefuse:v2:*`` key (never FLUSHALL: Redis may be shared).

        Raises:
            CacheUnavailableError: Redis is unreachable (HTTP 503) — an admin purge
                that silently did nothing would lie.
        """
        deleted = 0
        batch: list[bytes] = []
        try:
            async for k in self._client.scan_iter(match=NAMESPACE + "*", count=500):
                batch.append(k)
                if len(batch) >= 500:
                    deleted += int(await self._client.unlink(*batch))
                    batch.clear()
            if batch:
                deleted += int(await self._client.unlink(*batch))
        except Exception as exc:
            await self._failed("purge", exc)
            raise CacheUnavailableError(
                f"redis cache unreachable ({type(exc).__name__}); nothing purged "
                f"after {deleted} deletions"
            ) from exc
        return deleted

    def stats(self) -> CacheStats:
        """Hits and misses seen by this process; bytes/items/evictions live in Redis (0)."""
        return CacheStats(self.hits, self.misses, 0, 0, 0, 0)

    async def close(self) -> None:
        await self._client.aclose()


def _encode_value(value: CachedResult) -> bytes:
    head = json.dumps({"media_type": value.media_type, "similarity": value.similarity,
                       "skipped": value.skipped}, separators=(",", ":"), ensure_ascii=True)
    return head.encode("ascii") + b"\n" + value.body


def _decode_value(raw: bytes) -> CachedResult | None:
    """The record of a stored value; None for anything not written by
    :func:`_encode_value` (treated as a miss)."""
    head, sep, body = raw.partition(b"\n")
    try:
        meta = json.loads(head) if sep else None
    except ValueError:
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("media_type"), str):
        return None
    sim = meta.get("similarity")
    if sim is not None and not isinstance(sim, int | float):
        return None
    skipped = meta.get("skipped", "")
    if not isinstance(skipped, str):
        return None
    return CachedResult(body, meta["media_type"], None if sim is None else float(sim), skipped)
