"""The memory budget: how many request bytes and decoded pixels may be in flight.

The process's memory is ``baseline + caches + requests``. The baseline (models,
sessions, runtime) is measured once the models are warm; the caches are bounded
by their settings; what is left of the budget is the *request pool*, shared by

* upload bodies (their ``Content-Length``, reserved before the body is read), and
* decoded images: :data:`BYTES_PER_PIXEL` per pixel of every image a request
  decodes (read from the headers, reserved before decoding, held until the
  request's pipeline work ends — decoded arrays, analysis crops, the fused image
  and the encoded output all live inside that span).

A reservation waits (first come, first served, so a large request is not starved
by small ones) at most ``memory_wait_s`` and then fails with 503 ``overloaded`` and
``Retry-After``. A request that needs more than the whole pool could never be
served and is refused at once with 413 (``image_too_large`` / ``body_too_large``).

The budget itself is ``FACEFUSE_MEMORY_BUDGET_MB``, or 90 % of the container's
cgroup memory limit when there is one, else :data:`DEFAULT_BUDGET_MB`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path

from facefuse.config import Settings
from facefuse.errors import OverloadedError

__all__ = [
    "BYTES_PER_PIXEL",
    "DEFAULT_BUDGET_MB",
    "MemoryBudget",
    "budget_bytes",
    "cgroup_limit_bytes",
    "current_rss_bytes",
]

#: Peak bytes one decoded pixel costs a request, measured on 40-megapixel inputs
#: (Pillow's 4-byte RGBX buffer + the RGB array + its upright copy while decoding;
#: then the array, letterbox/tile/ROI crops, the fused copy and the encoder's
#: buffers). See BENCHMARKS.md, "hostile inputs".
BYTES_PER_PIXEL = 12

#: Budget when neither FACEFUSE_MEMORY_BUDGET_MB nor a cgroup limit says otherwise.
DEFAULT_BUDGET_MB = 2048

#: Share of a cgroup limit the budget takes (the rest: allocator slack, page cache).
CGROUP_SHARE = 0.9

_CGROUP_FILES = (Path("/sys/fs/cgroup/memory.max"),
                 Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def cgroup_limit_bytes() -> int | None:
    """The container's memory limit (cgroup v2 or v1), or None when unlimited."""
    for path in _CGROUP_FILES:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):  # v1 "unlimited" is ~2**63
            return int(text)
    return None


def budget_bytes(settings: Settings) -> int:
    """The whole process's memory budget, bytes (see the module docstring)."""
    if settings.memory_budget_mb > 0:
        return settings.memory_budget_mb * 1024 * 1024
    limit = cgroup_limit_bytes()
    if limit is not None:
        return int(limit * CGROUP_SHARE)
    return DEFAULT_BUDGET_MB * 1024 * 1024


def current_rss_bytes() -> int:
    """Resident set size of this process now (``VmRSS``), bytes; 0 when unknown."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class MemoryBudget:
    """A pool of bytes that requests reserve before they allocate.

    Args:
        capacity: bytes in the pool (may be changed with :meth:`set_capacity` once
            the baseline is known).
        wait_s: longest wait for a reservation before :class:`OverloadedError`.

    Reservations are granted first come, first served. All methods run on one
    event loop.
    """

    def __init__(self, capacity: int, wait_s: float) -> None:
        self.capacity = max(0, capacity)
        self.wait_s = wait_s
        self.in_use = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def set_capacity(self, capacity: int) -> None:
        self.capacity = max(0, capacity)
        self._grant()

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` could ever be granted (not more than the whole pool)."""
        return nbytes <= self.capacity

    async def acquire(self, nbytes: int, what: str) -> None:
        """Reserve ``nbytes`` (wait up to ``wait_s``).

        Raises:
            OverloadedError: not granted in time (503 + Retry-After).
            ValueError: ``nbytes`` is more than the whole pool (check :meth:`fits`).
        """
        if nbytes <= 0:
            return
        if not self.fits(nbytes):
            raise ValueError(f"{nbytes} bytes never fit a {self.capacity}-byte pool")
        if not self._waiters and self.in_use + nbytes <= self.capacity:
            self.in_use += nbytes
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (nbytes, fut)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(self.wait_s):
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self.release(nbytes)  # granted just as we gave up
            else:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._grant()
            if isinstance(exc, TimeoutError):
                raise OverloadedError(
                    f"server busy: no memory budget for {what} within {self.wait_s:g} s "
                    f"({self.in_use >> 20} of {self.capacity >> 20} MiB in use); retry later"
                ) from None
            raise

    def release(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        self.in_use = max(0, self.in_use - nbytes)
        self._grant()

    @contextlib.asynccontextmanager
    async def hold(self, nbytes: int, what: str) -> AsyncIterator[None]:
        """``acquire`` for the duration of the block."""
        await self.acquire(nbytes, what)
        try:
            yield
        finally:
            self.release(nbytes)

    def _grant(self) -> None:
        while self._waiters:
            nbytes, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if self.in_use + nbytes > self.capacity:
                return
            self._waiters.popleft()
            self.in_use += nbytes
            fut.set_result(None)
