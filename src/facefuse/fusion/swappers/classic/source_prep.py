"""A memo of a renderer's source-side work, so a clip's frames share it.

In a clip the same source photo and face come with every frame, and much of what
the classic renderer does with the source depends on the source alone: its crop
at the working scale with the highlights taken out, its occluder mask, its face
outline and the fields drawn from it, the low-passed colours its side-to-side
tone is read from. :class:`SourceCache` keeps those results per source, so the
second frame reuses what the first computed (about a quarter of a 720p frame's
render).

An entry is found by

* the source pixel buffer **object** (held by a weak reference: an entry dies
  with its image, and a new image that happens to land at the same address never
  hits it, so separate requests with separate decoded sources never share one),
* a fingerprint of a sparse grid of its pixels (an image edited in place misses,
  unless the edit avoids every 8th row and column),
* the face's landmarks' bytes and the caller's own parameters (the working scale,
  quantised with :func:`quantised_scale` so a face that grows by a pixel still
  hits, and the options the work depends on).

Within an entry, :meth:`SourceEntry.get` memoises named results; what it returns
is shared, so its arrays are made read-only (writing into one raises instead of
corrupting the next frame). Bounded: the ``max_entries`` most recently used
sources, ``max_items`` results each; safe to share between threads (two threads
asking for one missing result may both compute it; the first stored is kept and
returned to both).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

import numpy as np

__all__ = ["UNCACHED", "SourceCache", "SourceEntry", "quantised_scale"]

T = TypeVar("T")

#: Steps of :func:`quantised_scale` per octave (about 2.2 % apart).
SCALE_STEPS_PER_OCTAVE = 32
#: Every this many rows and columns of the source enter its fingerprint.
FINGERPRINT_STRIDE = 8


def quantised_scale(scale: float) -> float:
    """``scale`` (> 0) rounded to a grid of :data:`SCALE_STEPS_PER_OCTAVE` steps
    per octave; 1.0 stays 1.0."""
    if scale <= 0.0 or not math.isfinite(scale):
        return scale
    steps = round(math.log2(scale) * SCALE_STEPS_PER_OCTAVE)
    return float(2.0 ** (steps / SCALE_STEPS_PER_OCTAVE))


def fingerprint(image: np.ndarray) -> int:
    """CRC-32 of every :data:`FINGERPRINT_STRIDE`-th row and column of ``image``
    (with its shape and dtype): cheap (a 1000×800 photo: about 0.05 ms)."""
    grid = np.ascontiguousarray(image[::FINGERPRINT_STRIDE, ::FINGERPRINT_STRIDE])
    head = f"{image.shape}{image.dtype.str}".encode()
    return zlib.crc32(grid.tobytes(), zlib.crc32(head))


class SourceEntry(Protocol):
    """One source's memo."""

    def get(self, name: Hashable, compute: Callable[[], T]) -> T:
        """The result stored under ``name``, computed by ``compute()`` the first time.

        ``compute`` must return arrays of its own (not the caller's, nor views of
        them): they are made read-only in place and shared by later frames."""
        ...


class _Uncached:
    """A memo that remembers nothing (caching off)."""

    def get(self, name: Hashable, compute: Callable[[], T]) -> T:
        return compute()


#: The :class:`SourceEntry` that always computes.
UNCACHED: SourceEntry = _Uncached()


def _frozen(value: T) -> T:
    """``value`` with its arrays (itself, inside tuples and lists, or as fields of a
    dataclass) marked read-only, in place."""
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
        elif isinstance(v, tuple | list):
            stack.extend(v)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            stack.extend(getattr(v, f.name) for f in dataclasses.fields(v))
    return value


class _Entry:
    """A source's memo: named results, least recently used dropped first."""

    def __init__(self, image: np.ndarray, max_items: int,
                 on_death: Callable[[weakref.ref[np.ndarray]], None] | None = None) -> None:
        self.ref = weakref.ref(image, on_death)
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._max = max_items
        self._lock = threading.Lock()

    def get(self, name: Hashable, compute: Callable[[], T]) -> T:
        with self._lock:
            if name in self._items:
                self._items.move_to_end(name)
                hit: T = self._items[name]
                return hit
        value = _frozen(compute())
        with self._lock:
            stored: T = self._items.setdefault(name, value)
            self._items.move_to_end(name)
            while len(self._items) > self._max:
                self._items.popitem(last=False)
        return stored


class SourceCache:
    """Per-source memos (see the module docstring), shared by a renderer's calls.

    ``hits`` / ``misses``: how many :meth:`entry` calls found their source's memo.
    """

    def __init__(self, max_entries: int = 4, max_items: int = 16) -> None:
        self.max_entries = max_entries
        self.max_items = max_items
        self._entries: OrderedDict[tuple[Hashable, ...], _Entry] = OrderedDict()
        self._lock = threading.RLock()  # re-entered by a weakref callback during a lookup
        self.hits = 0
        self.misses = 0

    def entry(self, image: np.ndarray, landmarks: np.ndarray, *params: Hashable) -> SourceEntry:
        """The memo of the source ``image`` (H, W, 3) with the face ``landmarks``
        (N, k) under ``params`` (hashable values the results depend on)."""
        lm = np.ascontiguousarray(landmarks)
        key = (id(image), fingerprint(image), lm.shape, lm.dtype.str, lm.tobytes(), *params)
        with self._lock:
            # Entries whose image is gone can never hit again: drop them now.
            for k in [k for k, e in self._entries.items() if e.ref() is None]:
                del self._entries[k]
            found = self._entries.get(key)
            if found is not None and found.ref() is image:
                self._entries.move_to_end(key)
                self.hits += 1
                return found
            self.misses += 1
            made = _Entry(image, self.max_items, self._forget)
            self._entries[key] = made
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return made

    def _forget(self, ref: weakref.ref[np.ndarray]) -> None:
        """Drop the entries of an image that has just been freed (weakref callback):
        what they hold goes with it, not at the next lookup."""
        with self._lock:
            for k in [k for k, e in self._entries.items() if e.ref is ref]:
                del self._entries[k]

    def __len__(self) -> int:
        with self._lock:
            return sum(e.ref() is not None for e in self._entries.values())

    def clear(self) -> None:
        """Forget every source."""
        with self._lock:
            self._entries.clear()
