"""L1: an LRU bounded in bytes, and the counters every cache reports.

:class:`ByteLRU` holds values of a known size (an analysis, an encoded result) and
evicts the least recently used until the total fits ``max_bytes``. Thread-safe.
Every cache exposes :meth:`stats` (hits, misses, evictions, bytes, items), which the
metrics collector reads at scrape time; nothing is counted twice.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["ByteLRU", "CacheStats"]

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
