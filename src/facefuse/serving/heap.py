"""Giving the C heap's free pages back to the system (glibc ``malloc_trim``).

glibc keeps pages freed inside its arenas resident: the transient buffers of
model loading and warm-up (protobuf graphs, optimiser copies), and under load the
per-request image and tensor buffers below the mmap threshold. ``malloc_trim(0)``
walks every arena and returns each whole free page (``MADV_DONTNEED``), so the
resident set falls back to what is live. The server calls it once, after its
models are loaded and warmed: measured, ~50 MB less idle RSS (244 → 195 MB).
Calling it periodically under load was measured too and left the peak where it
was (the peak is live buffers, not freed ones), so it is not done; but after a burst
of large images the freed buffers stay resident until the next trim, so
:func:`trim_when_idle` trims once each time the server falls idle after work.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
from collections.abc import Callable
from functools import cache

#: glibc malloc arenas the server keeps (:func:`facefuse.serving.run.limit_malloc_arenas`).
ARENAS = 2

#: Free memory at the top of a heap beyond this goes back to the system on ``free``
#: (:func:`facefuse.serving.run.pin_trim_threshold`). glibc starts at 128 KiB and
#: raises it to twice the mmap threshold as that climbs; a pinned mmap threshold stops
#: the climb, and at 128 KiB the heap gave back the buffers of nearly every request
#: as it freed them, for the next one to fault them in again: measured in the server
#: (1 client, ~2 MP portraits), ~9000 page faults and 34 ms of system CPU a request,
#: p50 110 ms; at 32 MiB ~1500 faults, 18 ms and 90 ms, and req/s at 8 clients
#: +12 %, with the same peak RSS after 32 clients (the peak is live buffers). What
#: stays free after a burst goes back when the server falls idle
#: (:func:`trim_when_idle`); the memory budget counts what may stay meanwhile
#: (:func:`free_heap_bound`).
TRIM_THRESHOLD = 32 * 1024 * 1024


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018  (musl and others have none)
    except (OSError, AttributeError):
        return None
    return libc


def free_heap_bound() -> int:
    """The most free memory the C heap may hold resident beyond its live buffers, bytes:
    its arenas (``MALLOC_ARENA_MAX``, else :data:`ARENAS`) times the trim threshold
    (``MALLOC_TRIM_THRESHOLD_``, else :data:`TRIM_THRESHOLD`); 0 but on glibc."""
    if _libc() is None:
        return 0
    try:
        arenas = int(os.environ.get("MALLOC_ARENA_MAX", ARENAS))
        threshold = int(os.environ.get("MALLOC_TRIM_THRESHOLD_", TRIM_THRESHOLD))
    except ValueError:
        arenas, threshold = ARENAS, TRIM_THRESHOLD
    return max(0, arenas) * max(0, threshold)


def release_free_heap() -> bool:
    """``malloc_trim(0)``: True when pages went back, False when none did or this
    is not glibc."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


async def trim_when_idle(busy: Callable[[], tuple[int, int]], period_s: float = 1.0) -> None:
    """Forever: every ``period_s``, when ``busy()`` says ``(in flight, answered)`` is
    ``(0, n)`` with ``n`` new since the last trim, :func:`release_free_heap` (in a
    thread). One trim per burst, never under load."""
    last = busy()[1]
    while True:
        await asyncio.sleep(period_s)
        inflight, answered = busy()
        if inflight == 0 and answered != last:
            last = answered
            await asyncio.to_thread(release_free_heap)
