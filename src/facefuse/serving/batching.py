"""Dynamic micro-batching of single model inputs from concurrent requests.

A :class:`MicroBatcher` sits in front of one model. Request handlers ``await
batcher.submit(x)`` with ONE model input (e.g. a ``(3, 150, 150)`` float32 face
chip); the batcher gathers inputs from concurrent requests and runs them as one
``(B, 3, 150, 150)`` call when either

* ``max_batch_size`` compatible items are queued, or
* ``max_queue_delay_ms`` has passed since the oldest queued item arrived

(the Triton knobs of the same names). The model call runs in the given thread
pool, never on the event loop; its outputs (each with leading dimension ``B``) are
split back row by row to the callers.

Bounded everything:

* the queue is bounded per *request*: :meth:`MicroBatcher.submit_many` puts all the
  items of one caller in at once (one per face of a photo) and is refused with
  :class:`~facefuse.errors.OverloadedError` (HTTP 503) only when ``max_queue_size``
  items *of other callers* are already waiting. A group is never refused for its
  own size, nor for the items its own request (``owner``: all the images of one
  request) queued before it, so a request admitted on an idle server is never
  refused by its own images. A request is refused only before its first items are
  let in, by any batcher (its :class:`Owner` carries that across batchers): one
  part-way through (a large photo's detector passes come a chunk at a time, its
  faces' mesh calls after them) is finished, not turned away with its work half
  done. So a queue can exceed the bound by the items of the requests already let in
  (the server keeps at most ``FACEFUSE_MAX_ACTIVE`` requests in its pipeline);
* a per-request ``deadline`` (``time.monotonic()`` seconds) raises
  :class:`~facefuse.errors.DeadlineExceededError` (HTTP 504); an item whose
  deadline passed before its batch started is dropped, not computed;
* at most ``max_concurrent_batches`` batches run at the same time (default 1: while
  one batch runs, the next one fills up — that is where batching pays).

``flush_when_idle=True`` (opt-in) starts a batch at once when no batch is running,
without waiting for the queue delay; items that arrive while a batch runs form the
next one. Lone requests then pay no delay, and under load batches still fill up
(with ``max_concurrent_batches=1``). The default keeps the Triton semantics above.

``enabled=False`` runs every item alone (batch of one, no queue delay) with the same
queue bound, deadlines and thread pool: batching switched off for a route is one
more batcher over the same model built with ``enabled=False``.

Everything here runs on one event loop; only ``run_batch`` runs in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from facefuse.errors import DeadlineExceededError, ModelError, OverloadedError

__all__ = ["BatchFn", "BatchObserver", "MicroBatcher"]

log = logging.getLogger(__name__)

#: ``run_batch(stacked)``: ``stacked`` is ``(B, *item_shape)``; returns one array or a
#: sequence of arrays (one per model output), each with leading dimension ``B``.
BatchFn = Callable[[np.ndarray], np.ndarray | Sequence[np.ndarray]]


class BatchObserver(Protocol):
    """Metric hooks a batcher calls (``facefuse.serving.metrics.Metrics`` has them).

    All are called on the event loop thread and must be cheap and non-blocking.
    """

    def observe_batch_size(self, model: str, size: int) -> None:
        """One batch of ``size`` items started."""

    def observe_queue_wait(self, model: str, seconds: float) -> None:
        """One item waited ``seconds`` between ``submit`` and the start of its batch."""

    def set_queue_depth(self, model: str, depth: int) -> None:
        """Items now queued (not yet started) for ``model``."""


class Owner:
    """The request some queued items belong to (compared by identity).

    ``let_in``: some of its items were let into a batcher's queue (any batcher's);
    from then on none of its items meets a queue's bound (see the module doc).
    """

    let_in: bool = False


@dataclass(eq=False)
class _Item:
    """One queued input; identity equality so ``deque.remove`` never compares arrays."""

    x: np.ndarray
    future: asyncio.Future[list[np.ndarray]]
    enqueued: float
    deadline: float | None
    owner: Owner | None = None
    key: tuple[tuple[int, ...], np.dtype[np.generic]] = field(init=False)

    def __post_init__(self) -> None:
        self.key = (tuple(self.x.shape), self.x.dtype)


class MicroBatcher:
    """Gathers single inputs into batches for one model (see the module docstring).

    Args:
        name: the model name; the ``model`` label of the metrics.
        run_batch: called in a worker thread with the stacked ``(B, ...)`` input.
            Look the model up inside it (``registry.get(name).run``) so a hot reload
            takes effect at the next batch while running batches finish on the old one.
        max_batch_size: most items in one call (>= 1).
        max_queue_delay_ms: longest time the oldest queued item waits for company.
        max_queue_size: most items waiting (not yet started); beyond it, overload.
        executor: the thread pool that runs ``run_batch``.
        enabled: ``False`` runs every item alone, without queue delay.
        max_concurrent_batches: batches allowed to run at the same time.
        flush_when_idle: start a batch without queue delay when none is running.
        metrics: optional :class:`BatchObserver`.
    """

    def __init__(
        self,
        name: str,
        run_batch: BatchFn,
        *,
        executor: Executor,
        max_batch_size: int = 8,
        max_queue_delay_ms: float = 5.0,
        max_queue_size: int = 64,
        enabled: bool = True,
        max_concurrent_batches: int = 1,
        flush_when_idle: bool = False,
        metrics: BatchObserver | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if max_queue_delay_ms < 0:
            raise ValueError("max_queue_delay_ms must be >= 0")
        if max_queue_size < 1:
            raise ValueError("max_queue_size must be >= 1")
        if max_concurrent_batches < 1:
            raise ValueError("max_concurrent_batches must be >= 1")
        self.name = name
        self._run_batch = run_batch
        self._executor = executor
        self.max_batch_size = max_batch_size
        self.max_queue_delay_s = max_queue_delay_ms / 1000.0
        self.max_queue_size = max_queue_size
        self.enabled = enabled
        self.max_concurrent_batches = max_concurrent_batches
        self.flush_when_idle = flush_when_idle
        self._active = 0  # batches handed to the executor and not yet finished
        self._metrics = metrics
        self._queue: deque[_Item] = deque()
        self._wakeup: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._closing = False
        #: Batches run and items computed since start (for tests and /readyz detail).
        self.batches_run = 0
        self.items_run = 0

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the batching loop on the running event loop (idempotent)."""
        if self._task is not None:
            return
        if self._closing:
            raise RuntimeError(f"batcher {self.name!r} was drained; build a new one")
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(self.max_concurrent_batches)
        self._task = asyncio.get_running_loop().create_task(
            self._loop(), name=f"batcher:{self.name}"
        )

    @property
    def running(self) -> bool:
        """True between :meth:`start` and the end of :meth:`drain` (for /readyz)."""
        return self._task is not None and not self._task.done() and not self._closing

    @property
    def queue_depth(self) -> int:
        """Items queued and not yet started."""
        return len(self._queue)

    async def drain(self, timeout: float) -> bool:
        """Stop taking items, finish the queued and running ones, stop the loop.

        Queued items are flushed at once (no queue delay). Returns True when all
        finished within ``timeout`` seconds; otherwise the items still queued fail
        with :class:`OverloadedError`, running batches are left to finish in their
        threads (their callers are not waited for), and False is returned.
        """
        self._closing = True
        if self._task is None:
            self._fail_queued(OverloadedError(f"{self.name}: shutting down"))
            return True
        assert self._wakeup is not None
        self._wakeup.set()
        deadline = time.monotonic() + max(0.0, timeout)
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=max(0.0, timeout))
            pending = set(self._running)
            if pending:
                _, not_done = await asyncio.wait(
                    pending, timeout=max(0.0, deadline - time.monotonic())
                )
                if not_done:
                    return False
            return True
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._fail_queued(OverloadedError(f"{self.name}: shutting down"))
            return False

    # --- the caller side ---------------------------------------------------------------

    async def submit(self, x: np.ndarray, *, deadline: float | None = None) -> list[np.ndarray]:
        """Queue one model input and wait for its outputs (:meth:`submit_many` of one)."""
        return (await self.submit_many([x], deadline=deadline))[0]

    async def submit_many(
        self, xs: Sequence[np.ndarray], *, deadline: float | None = None,
        owner: Owner | None = None,
    ) -> list[list[np.ndarray]]:
        """Queue the model inputs of one caller together and wait for all their outputs.

        Args:
            xs: inputs, each WITHOUT the batch dimension (e.g. ``(3, 150, 150)``
                float32). Items of different shape or dtype are never stacked together.
            deadline: ``time.monotonic()`` seconds after which the caller gives up.
            owner: the request these items belong to (compared by identity): its
                own queued items never count against the bound, and once it was let
                into any queue (:attr:`Owner.let_in`) it is never refused for it.

        Returns:
            Per input, one array per model output: row ``i`` of each output of its
            batch (a copy, so it does not pin the batch's memory).

        Raises:
            OverloadedError: ``max_queue_size`` items of other owners are already
                waiting (and ``owner`` was never let in), or the batcher is draining.
            DeadlineExceededError: ``deadline`` passed first.
            Exception: whatever ``run_batch`` raised, for every caller of that batch.
        """
        if self._closing:
            raise OverloadedError(f"{self.name}: shutting down")
        if not xs:
            return []
        if self._task is None:
            self.start()
        assert self._wakeup is not None
        now = time.monotonic()
        if deadline is not None and deadline <= now:
            raise DeadlineExceededError(f"{self.name}: deadline passed before queueing")
        if owner is None or not owner.let_in:
            others = len(self._queue) if owner is None else sum(
                1 for queued in self._queue if queued.owner is not owner)
            if others >= self.max_queue_size:
                raise OverloadedError(
                    f"{self.name}: queue full ({self.max_queue_size} items); retry later"
                )
            if owner is not None:
                owner.let_in = True
        loop = asyncio.get_running_loop()
        items = [_Item(x=x, future=loop.create_future(), enqueued=now, deadline=deadline,
                       owner=owner) for x in xs]
        self._queue.extend(items)
        self._depth_changed()
        self._wakeup.set()
        try:
            # Each future awaited in turn (no gather: no aggregate future whose
            # exception could go unretrieved when the caller leaves first).
            async with asyncio.timeout(None if deadline is None else deadline - now):
                return [await item.future for item in items]
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                # the deadline passed, not a TimeoutError from run_batch
                raise DeadlineExceededError(f"{self.name}: deadline exceeded") from None
            raise
        finally:
            # Timed out, failed or the caller was cancelled (client went away): unqueue
            # what has not started (cancelled futures are skipped by the loop).
            for item in items:
                if not item.future.done():
                    item.future.cancel()
                if item.future.cancelled():
                    self._unqueue(item)
                else:
                    item.future.exception()  # retrieved: a shared batch error is raised once

    # --- the batching loop -------------------------------------------------------------

    async def _loop(self) -> None:
        assert self._slots is not None
        while True:
            await self._slots.acquire()
            try:
                batch = await self._collect()
            except BaseException:
                self._slots.release()
                raise
            if batch is None:
                self._slots.release()
                return
            self._active += 1
            task = asyncio.get_running_loop().create_task(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _collect(self) -> list[_Item] | None:
        """Wait for the next batch; None when draining and the queue is empty."""
        assert self._wakeup is not None
        max_size = self.max_batch_size if self.enabled else 1
        delay = self.max_queue_delay_s if self.enabled else 0.0
        while True:
            self._prune()
            if not self._queue:
                if self._closing:
                    return None
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._closing or self._compatible_count(max_size) >= max_size:
                break
            if self.flush_when_idle and self._active == 0:
                break
            remaining = self._queue[0].enqueued + delay - time.monotonic()
            if remaining <= 0:
                break
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=remaining)
        return self._take(max_size)

    def _compatible_count(self, limit: int) -> int:
        key = self._queue[0].key
        n = 0
        for item in self._queue:
            if item.key == key:
                n += 1
                if n >= limit:
                    break
        return n

    def _take(self, max_size: int) -> list[_Item]:
        """Remove and return up to ``max_size`` items stackable with the oldest one."""
        key = self._queue[0].key
        taken: list[_Item] = []
        kept: deque[_Item] = deque()
        while self._queue:
            item = self._queue.popleft()
            if len(taken) < max_size and item.key == key:
                taken.append(item)
            else:
                kept.append(item)
        self._queue = kept
        self._depth_changed()
        return taken

    def _prune(self) -> None:
        """Drop items whose caller left or whose deadline passed (never computed)."""
        now = time.monotonic()
        before = len(self._queue)
        alive: deque[_Item] = deque()
        for item in self._queue:
            if item.future.done():
                continue
            if item.deadline is not None and item.deadline <= now:
                item.future.set_exception(
                    DeadlineExceededError(f"{self.name}: deadline exceeded in queue")
                )
                continue
            alive.append(item)
        if len(alive) != before:
            self._queue = alive
            self._depth_changed()

    async def _run(self, items: list[_Item]) -> None:
        """Run one batch in the executor and hand each caller its rows."""
        assert self._slots is not None
        try:
            start = time.monotonic()
            if self._metrics is not None:
                self._metrics.observe_batch_size(self.name, len(items))
                for item in items:
                    self._metrics.observe_queue_wait(self.name, start - item.enqueued)
            xs = [item.x for item in items]
            loop = asyncio.get_running_loop()
            try:
                rows = await loop.run_in_executor(self._executor, self._execute, xs)
            except Exception as exc:
                log.debug("batch of %d for %s failed: %r", len(items), self.name, exc)
                for item in items:
                    if not item.future.done():
                        item.future.set_exception(exc)
                return
            self.batches_run += 1
            self.items_run += len(items)
            for item, row in zip(items, rows, strict=True):
                if not item.future.done():
                    item.future.set_result(row)
        finally:
            self._active -= 1
            self._slots.release()
            if self._queue and self._wakeup is not None:
                self._wakeup.set()  # a waiting collect may flush now that we are idle

    def _execute(self, xs: list[np.ndarray]) -> list[list[np.ndarray]]:
        """Worker thread: stack, run, split. Returns ``rows[i][output]``."""
        stacked = np.stack(xs)
        out = self._run_batch(stacked)
        outputs = [out] if isinstance(out, np.ndarray) else list(out)
        n = len(xs)
        for k, o in enumerate(outputs):
            if o.ndim == 0 or o.shape[0] != n:
                raise ModelError(
                    f"{self.name}: output {k} has shape {o.shape}, expected leading {n}"
                )
        return [[np.array(o[i], copy=True) for o in outputs] for i in range(n)]

    # --- helpers -----------------------------------------------------------------------

    def _unqueue(self, item: _Item) -> None:
        try:
            self._queue.remove(item)
        except ValueError:
            return
        self._depth_changed()

    def _fail_queued(self, exc: Exception) -> None:
        while self._queue:
            item = self._queue.popleft()
            if not item.future.done():
                item.future.set_exception(exc)
        self._depth_changed()

    def _depth_changed(self) -> None:
        if self._metrics is not None:
            self._metrics.set_queue_depth(self.name, len(self._queue))
