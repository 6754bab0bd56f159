"""The two cache levels and their keys.

* **L1** (in process): analysed faces keyed by :func:`analysis_key` — the SHA-256 of
  the decoded pixels (:func:`pixels_sha256`) plus the model versions — stored in a
  :class:`ByteLRU` bounded in bytes.
* **L2** (results): encoded fused outputs keyed by :func:`result_key` — the SHA-256 of
  the uploaded source and target *bytes* (a hit needs no decoding) plus the options
  and the model versions — in a :class:`ResultCache`: :class:`InProcessResultCache`
  (the embedded default) or :class:`RedisResultCache` (``FACEFUSE_REDIS_URL``).

The Redis cache never fails a request: when Redis is down or slow it degrades to a
miss / skipped write, logs the outage once, reports ``healthy = False`` (the server's
/readyz says "degraded") and probes Redis again at most every ``retry_interval_s``
seconds until it answers.

Every cache exposes :meth:`stats` (hits, misses, evictions, bytes, items), which the
metrics collector reads at scrape time; nothing is counted twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, runtime_checkable

import cv2
import numpy as np

from facefuse.errors import CacheUnavailableError

__all__ = [
    "NAMESPACE",
    "ByteLRU",
    "CacheStats",
    "CachedResult",
    "InProcessResultCache",
    "RedisResultCache",
    "ResultCache",
    "analysis_key",
    "hamming",
    "phash",
    "pixels_sha256",
    "result_key",
    "sha256_hex",
]

log = logging.getLogger(__name__)

#: Prefix of every Redis key facefuse writes; bump the version when the value format
#: or the key recipe changes, so old entries are simply never read again.
NAMESPACE = "facefuse:v1:"

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of one cache's counters (monotonic totals since it was built)."""

    hits: int
    misses: int
    evictions: int
    bytes: int
    items: int
    max_bytes: int

    @property
    def hit_ratio(self) -> float:
        """hits / (hits + misses); 0.0 before the first lookup."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


# --- L1: an LRU bounded in bytes ----------------------------------------------------------


class ByteLRU(Generic[K, V]):
    """A thread-safe least-recently-used map bounded by the summed size of its values.

    Args:
        max_bytes: the bound; ``size_of`` of all held values never exceeds it.
        size_of: the size in bytes charged for one value (e.g. ``len`` for bytes,
            ``arr.nbytes`` plus overhead for arrays). Must be >= 0 and stable.

    A value larger than ``max_bytes`` is not stored (``put`` returns False).
    """

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key: K) -> V | None:
        """The value (now most recently used) or None; counts a hit or a miss."""
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return entry[0]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    def put(self, key: K, value: V) -> bool:
        """Store ``value``, evicting least recently used entries to make room.

        Returns False (and stores nothing, dropping any old value of ``key``) when
        the value alone is larger than ``max_bytes``.
        """
        size = int(self._size_of(value))
        if size < 0:
            raise ValueError("size_of returned a negative size")
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return False
            while self._data and self._bytes + size > self.max_bytes:
                _, (_, evicted_size) = self._data.popitem(last=False)
                self._bytes -= evicted_size
                self.evictions += 1
            self._data[key] = (value, size)
            self._bytes += size
            return True

    def delete(self, key: K) -> bool:
        """Remove ``key``; True when it was there."""
        with self._lock:
            entry = self._data.pop(key, None)
            if entry is None:
                return False
            self._bytes -= entry[1]
            return True

    def clear(self) -> int:
        """Remove everything (not counted as evictions); returns how many were held."""
        with self._lock:
            n = len(self._data)
            self._data.clear()
            self._bytes = 0
            return n

    @property
    def size_bytes(self) -> int:
        """Bytes currently charged."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._data)

    def stats(self) -> CacheStats:
        """Counters snapshot for the metrics collector."""
        with self._lock:
            return CacheStats(
                self.hits,
                self.misses,
                self.evictions,
                self._bytes,
                len(self._data),
                self.max_bytes,
            )


# --- L2: results ---------------------------------------------------------------------------


class CachedResult(NamedTuple):
    """An encoded output as the HTTP response sends it."""

    content_type: str
    body: bytes


#: Bytes charged per in-process entry besides the body (key, tuple, dict slot).
ENTRY_OVERHEAD = 256


@runtime_checkable
class ResultCache(Protocol):
    """The L2 cache of encoded results; every method is safe to call when degraded."""

    @property
    def healthy(self) -> bool:
        """False while the backing store is unreachable (the cache then acts empty)."""

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

    @property
    def healthy(self) -> bool:
        """Always True: nothing to lose contact with."""
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
    return len(value.body) + len(value.content_type) + ENTRY_OVERHEAD


class RedisResultCache:
    """L2 in Redis, shared by every server process; degrades instead of failing.

    Values are stored as ``<content_type> "\\n" <body>`` under ``facefuse:v1:<key>``
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
        self._healthy = True
        self._next_probe = 0.0
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

    def _failed(self, op: str, exc: BaseException) -> None:
        self.errors += 1
        self._next_probe = self._clock() + self.retry_interval_s
        if self._healthy:
            self._healthy = False
            # Once per outage; the URL may hold a password, so only the op and error.
            log.warning(
                "redis cache unavailable (%s failed: %s: %s); serving without L2, "
                "retrying every %.1fs",
                op,
                type(exc).__name__,
                exc,
                self.retry_interval_s,
            )

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
            self._next_probe = self._clock() + self.retry_interval_s
            try:
                await self._bounded(self._client.ping())
            except Exception as exc:
                self.errors += 1
                log.debug("redis probe failed: %r", exc)
                return False
            self._healthy = True
            log.info("redis cache reachable again; L2 re-enabled")
            return True

    async def ping(self) -> bool:
        """PING now regardless of the retry interval (for startup checks); updates health."""
        try:
            await self._bounded(self._client.ping())
        except Exception as exc:
            self._failed("ping", exc)
            return False
        if not self._healthy:
            self._healthy = True
            log.info("redis cache reachable again; L2 re-enabled")
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
            self._failed("GET", exc)
            self.misses += 1
            return None
        value = _decode_value(raw) if raw is not None else None
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        return value

    async def put(self, key: str, value: CachedResult) -> bool:
        ct = value.content_type
        if len(value.body) > self.max_item_bytes or "\n" in ct or not ct.isascii():
            self.skipped += 1
            return False
        if not await self._usable():
            self.skipped += 1
            return False
        payload = ct.encode("ascii") + b"\n" + value.body
        try:
            await self._bounded(self._client.set(NAMESPACE + key, payload, ex=self.ttl_s))
        except Exception as exc:
            self._failed("SET", exc)
            self.skipped += 1
            return False
        return True

    async def purge(self) -> int:
        """SCAN + UNLINK every ``facefuse:v1:*`` key (never FLUSHALL: Redis may be shared).

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
            self._failed("purge", exc)
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


def _decode_value(raw: bytes) -> CachedResult | None:
    head, sep, body = raw.partition(b"\n")
    if not sep or not head:
        return None
    try:
        content_type = head.decode("ascii")
    except UnicodeDecodeError:
        return None
    return CachedResult(content_type, body)


# --- keys ----------------------------------------------------------------------------------


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
