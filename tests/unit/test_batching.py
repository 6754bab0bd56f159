"""MicroBatcher: batching under concurrency, bounds, deadlines, drain, error fan-out.

No timing asserts: every test checks ordering, counts and which caller got what.
Blocking is done with threading.Events inside ``run_batch`` so the queue state is
known exactly when the assertions run.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from facefuse.errors import DeadlineExceededError, OverloadedError
from facefuse.serving.batching import MicroBatcher, Owner

pytestmark = pytest.mark.anyio

ITEM_SHAPE = (3, 4, 4)


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-batch")
    yield pool
    pool.shutdown(wait=True, cancel_futures=True)


class Recorder:
    """A run_batch returning ``x * 2`` that records batch sizes, inputs and threads.

    With ``gate`` set it blocks every batch until the gate opens, and ``started``
    is set when a batch has begun.
    """

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.sizes: list[int] = []
        self.values: list[float] = []
        self.threads: set[int] = set()
        self.gate = gate
        self.started = threading.Event()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.threads.add(threading.get_ident())
        self.sizes.append(int(x.shape[0]))
        self.values.extend(float(v) for v in x.reshape(x.shape[0], -1)[:, 0])
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30), "test gate never opened"
        return x * 2


def item(value: float) -> np.ndarray:
    return np.full(ITEM_SHAPE, value, dtype=np.float32)


async def wait_until(predicate: object, what: str) -> None:
    """Yield to the loop until ``predicate()`` holds (a generous 10 s cap, not a timing test)."""
    assert callable(predicate)
    end = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < end, f"never happened: {what}"
        await asyncio.sleep(0.001)


class RecordingObserver:
    def __init__(self) -> None:
        self.batch_sizes: list[int] = []
        self.waits: list[float] = []
        self.depths: list[int] = []

    def observe_batch_size(self, model: str, size: int) -> None:
        assert model == "rec"
        self.batch_sizes.append(size)

    def observe_queue_wait(self, model: str, seconds: float) -> None:
        self.waits.append(seconds)

    def set_queue_depth(self, model: str, depth: int) -> None:
        self.depths.append(depth)


async def test_concurrent_items_are_batched_and_results_go_to_their_callers(
    executor: ThreadPoolExecutor,
) -> None:
    rec = Recorder()
    obs = RecordingObserver()
    b = MicroBatcher("rec", rec, executor=executor, max_batch_size=8, metrics=obs)
    b.start()
    outs = await asyncio.gather(*(b.submit(item(i)) for i in range(20)))
    for i, out in enumerate(outs):
        assert len(out) == 1
        assert out[0].shape == ITEM_SHAPE
        np.testing.assert_array_equal(out[0], item(2 * i))
    assert sum(rec.sizes) == 20
    assert max(rec.sizes) == 8
    assert max(rec.sizes) > 1
    assert sorted(rec.values) == [float(i) for i in range(20)]
    assert obs.batch_sizes == rec.sizes
    assert len(obs.waits) == 20
    assert min(obs.waits) >= 0
    assert obs.depths[-1] == 0
    assert max(obs.depths) > 1
    assert b.queue_depth == 0
    assert b.batches_run == len(rec.sizes)
    assert b.items_run == 20
    assert await b.drain(10)


async def test_run_batch_runs_off_the_event_loop_thread(executor: ThreadPoolExecutor) -> None:
    rec = Recorder()
    b = MicroBatcher("rec", rec, executor=executor)
    await b.submit(item(1))
    assert threading.get_ident() not in rec.threads
    assert len(rec.threads) == 1
    await b.drain(10)


async def test_lone_item_runs_after_the_queue_delay(executor: ThreadPoolExecutor) -> None:
    rec = Recorder()
    b = MicroBatcher("rec", rec, executor=executor, max_batch_size=8, max_queue_delay_ms=20)
    out = await asyncio.wait_for(b.submit(item(3)), timeout=10)
    np.testing.assert_array_equal(out[0], item(6))
    assert rec.sizes == [1]
    await b.drain(10)


async def test_multiple_outputs_are_split_per_caller(executor: ThreadPoolExecutor) -> None:
    def two_outputs(x: np.ndarray) -> list[np.ndarray]:
        return [x.sum(axis=(1, 2, 3)), x[:, 0, 0, :] + 1]

    b = MicroBatcher("two", two_outputs, executor=executor)
    outs = await asyncio.gather(*(b.submit(item(i)) for i in range(5)))
    for i, (total, row) in enumerate(outs):
        assert total.shape == ()
        assert float(total) == i * 48
        np.testing.assert_array_equal(row, np.full(4, i + 1, np.float32))
    await b.drain(10)


async def test_full_queue_raises_overloaded_at_once(executor: ThreadPoolExecutor) -> None:
    gate = threading.Event()
    rec = Recorder(gate)
    b = MicroBatcher("rec", rec, executor=executor, max_batch_size=1, max_queue_size=2)
    try:
        first = asyncio.ensure_future(b.submit(item(0)))
        await wait_until(rec.started.is_set, "first batch started")
        queued = [asyncio.ensure_future(b.submit(item(v))) for v in (1, 2)]
        await wait_until(lambda: b.queue_depth == 2, "two items queued")
        with pytest.raises(OverloadedError) as info:
            await b.submit(item(3))
        assert info.value.http_status == 503
        assert b.queue_depth == 2
    finally:
        gate.set()
    results = await asyncio.gather(first, *queued)
    assert [float(r[0].flat[0]) for r in results] == [0.0, 2.0, 4.0]
    assert 3.0 not in rec.values
    await b.drain(10)


async def test_deadline_raises_and_the_item_is_never_computed(
    executor: ThreadPoolExecutor,
) -> None:
    gate = threading.Event()
    rec = Recorder(gate)
    b = MicroBatcher("rec", rec, executor=executor, max_batch_size=1)
    try:
        first = asyncio.ensure_future(b.submit(item(0)))
        await wait_until(rec.started.is_set, "first batch started")
        with pytest.raises(DeadlineExceededError) as info:
            await b.submit(item(7), deadline=time.monotonic() + 0.05)
        assert info.value.http_status == 504
        assert b.queue_depth == 0  # dropped from the queue, not left behind
        with pytest.raises(DeadlineExceededError):
            await b.submit(item(8), deadline=time.monotonic() - 1)
    finally:
        gate.set()
    await first
    later = await b.submit(item(9), deadline=time.monotonic() + 30)
    np.testing.assert_array_equal(later[0], item(18))
    assert 7.0 not in rec.values
    assert 8.0 not in rec.values
    assert rec.values == [0.0, 9.0]
    await b.drain(10)


async def test_cancelled_caller_is_dropped_from_the_queue(executor: ThreadPoolExecutor) -> None:
    gate = threading.Event()
    rec = Recorder(gate)
    b = MicroBatcher("rec", rec, executor=executor, max_batch_size=1)
    try:
        first = asyncio.ensure_future(b.submit(item(0)))
        await wait_until(rec.started.is_set, "first batch started")
        doomed = asyncio.ensure_future(b.submit(item(5)))
        await wait_until(lambda: b.queue_depth == 1, "queued")
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        assert b.queue_depth == 0
    finally:
        gate.set()
    await first
    assert 5.0 not in rec.values
    await b.drain(10)


async def test_errors_reach_every_caller_of_the_batch(executor: ThreadPoolExecutor) -> None:
    calls: list[int] = []

    def broken(x: np.ndarray) -> np.ndarray:
        calls.append(int(x.shape[0]))
        raise ValueError("model exploded")

    b = MicroBatcher("broken", broken, executor=executor, max_batch_size=8)
    results = await asyncio.gather(*(b.submit(item(i)) for i in range(3)), return_exceptions=True)
    assert calls == [3]
    assert all(isinstance(r, ValueError) and "exploded" in str(r) for r in results)
    # The batcher survives a failed batch.
    assert b.running
    await b.drain(10)


async def test_wrong_output_batch_dimension_is_an_error(executor: ThreadPoolExecutor) -> None:
    b = MicroBatcher("bad", lambda x: x[:1], executor=executor)
    results = await asyncio.gather(*(b.submit(item(i)) for i in range(2)), return_exceptions=True)
    assert all(isinstance(r, Exception) and "leading" in str(r) for r in results)
    await b.drain(10)


async def test_disabled_batching_runs_each_item_alone(executor: ThreadPoolExecutor) -> None:
    rec = Recorder()
    b = MicroBatcher("rec", rec, executor=executor, enabled=False, max_queue_delay_ms=1000)
    outs = await asyncio.gather(*(b.submit(item(i)) for i in range(6)))
    assert rec.sizes == [1] * 6
    assert [float(o[0].flat[0]) for o in outs] == [2.0 * i for i in range(6)]
    await b.drain(10)


async def test_items_of_different_shapes_are_never_stacked(executor: ThreadPoolExecutor) -> None:
    shapes: list[tuple[int, ...]] = []

    def run(x: np.ndarray) -> np.ndarray:
        shapes.append(x.shape)
        return x + 1

    b = MicroBatcher("mixed", run, executor=executor, max_batch_size=8)
    small = [np.full((2,), i, np.float32) for i in range(3)]
    big = [np.full((5,), i, np.float32) for i in range(2)]
    outs = await asyncio.gather(*(b.submit(x) for x in small + big))
    for x, out in zip(small + big, outs, strict=True):
        np.testing.assert_array_equal(out[0], x + 1)
    assert sorted(shapes) == [(2, 5), (3, 2)]
    await b.drain(10)


async def test_drain_finishes_queued_items_and_refuses_new_ones(
    executor: ThreadPoolExecutor,
) -> None:
    gate = threading.Event()
    rec = Recorder(gate)
    # A queue delay far beyond the drain timeout: only drain's flush can finish item 4.
    b = MicroBatcher("rec", rec, executor=executor, max_batch_size=2, max_queue_delay_ms=600_000)
    try:
        pending = [asyncio.ensure_future(b.submit(item(0)))]
        await asyncio.sleep(0)
        pending.append(asyncio.ensure_future(b.submit(item(1))))
        await wait_until(rec.started.is_set, "first batch started")
        pending += [asyncio.ensure_future(b.submit(item(v))) for v in (2, 3, 4)]
        await wait_until(lambda: b.queue_depth == 3, "three queued")
        drain = asyncio.ensure_future(b.drain(30))
        await asyncio.sleep(0)
        assert not b.running
        with pytest.raises(OverloadedError):
            await b.submit(item(9))
    finally:
        gate.set()
    assert await asyncio.wait_for(drain, timeout=30)
    results = await asyncio.gather(*pending)
    assert [float(r[0].flat[0]) for r in results] == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert sorted(rec.values) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert b.queue_depth == 0


async def test_drain_timeout_fails_queued_items(executor: ThreadPoolExecutor) -> None:
    gate = threading.Event()
    rec = Recorder(gate)
    b = MicroBatcher("rec", rec, executor=executor, max_batch_size=1)
    try:
        first = asyncio.ensure_future(b.submit(item(0)))
        await wait_until(rec.started.is_set, "first batch started")
        stuck = asyncio.ensure_future(b.submit(item(1)))
        await wait_until(lambda: b.queue_depth == 1, "queued")
        assert await b.drain(0.05) is False
        with pytest.raises(OverloadedError):
            await stuck
    finally:
        gate.set()
    await first
    assert 1.0 not in rec.values


async def test_flush_when_idle_skips_the_delay_and_batches_what_queued_meanwhile(
    executor: ThreadPoolExecutor,
) -> None:
    gate = threading.Event()
    rec = Recorder(gate)
    # A queue delay no test would wait out: only the idle flush can run these batches.
    b = MicroBatcher(
        "rec",
        rec,
        executor=executor,
        max_batch_size=8,
        max_queue_delay_ms=600_000,
        flush_when_idle=True,
    )
    try:
        first = asyncio.ensure_future(b.submit(item(0)))
        await wait_until(rec.started.is_set, "lone item started without waiting for company")
        rest = [asyncio.ensure_future(b.submit(item(v))) for v in range(1, 6)]
        await wait_until(lambda: b.queue_depth == 5, "five queued behind the running batch")
    finally:
        gate.set()
    results = await asyncio.wait_for(asyncio.gather(first, *rest), timeout=30)
    assert [float(r[0].flat[0]) for r in results] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert rec.sizes == [1, 5]
    await b.drain(10)


async def test_one_callers_items_enter_together_whatever_the_queue_bound(
    executor: ThreadPoolExecutor,
) -> None:
    """Ten items of one caller (ten faces) on a two-item queue: served, not refused;
    a second caller arriving while they wait is refused (the bound counts callers)."""
    gate = threading.Event()
    rec = Recorder(gate)
    b = MicroBatcher("rec", rec, executor=executor, max_batch_size=4, max_queue_size=2)
    try:
        first = asyncio.ensure_future(b.submit(item(100)))
        await wait_until(rec.started.is_set, "first batch started")
        many = asyncio.ensure_future(b.submit_many([item(i) for i in range(10)]))
        await wait_until(lambda: b.queue_depth == 10, "ten items queued")
        with pytest.raises(OverloadedError):
            await b.submit(item(50))
    finally:
        gate.set()
    await first
    rows = await many
    assert [float(r[0].reshape(-1)[0]) for r in rows] == [2.0 * i for i in range(10)]
    await b.drain(10)


async def test_one_requests_groups_never_overflow_the_queue_for_each_other(
    executor: ThreadPoolExecutor,
) -> None:
    """Three images of one request (three groups of three items, same owner) on a
    two-item queue: all served; another request arriving meanwhile is refused."""
    gate = threading.Event()
    rec = Recorder(gate)
    b = MicroBatcher("rec", rec, executor=executor, max_batch_size=4, max_queue_size=2)
    request, other = Owner(), Owner()
    try:
        first = asyncio.ensure_future(b.submit(item(100)))
        await wait_until(rec.started.is_set, "first batch started")
        groups = [asyncio.ensure_future(
            b.submit_many([item(10 * g + i) for i in range(3)], owner=request))
            for g in range(3)]
        await wait_until(lambda: b.queue_depth == 9, "nine items of one request queued")
        with pytest.raises(OverloadedError):
            await b.submit_many([item(99)], owner=other)
    finally:
        gate.set()
    await first
    for g, group in enumerate(groups):
        rows = await group
        assert [float(r[0].reshape(-1)[0]) for r in rows] == [2.0 * (10 * g + i)
                                                             for i in range(3)]
    await b.drain(10)


async def test_a_request_let_in_once_is_never_refused_part_way(
    executor: ThreadPoolExecutor,
) -> None:
    """A request whose first items were let in (a large photo's first chunk of
    detector passes) comes back with more while other requests fill the two-item
    queue: it is served, where a new request is refused."""
    gate = threading.Event()
    rec = Recorder(gate)
    b = MicroBatcher("rec", rec, executor=executor, max_batch_size=4, max_queue_size=2)
    large, others, late = Owner(), Owner(), Owner()
    try:
        first = asyncio.ensure_future(b.submit_many([item(1)], owner=large))
        await wait_until(rec.started.is_set, "its first chunk running")
        assert large.let_in
        crowd = asyncio.ensure_future(b.submit_many([item(2), item(3)], owner=others))
        await wait_until(lambda: b.queue_depth == 2, "the queue full of another's items")
        with pytest.raises(OverloadedError):
            await b.submit_many([item(4)], owner=late)
        assert not late.let_in
        more = asyncio.ensure_future(b.submit_many([item(5), item(6)], owner=large))
        await wait_until(lambda: b.queue_depth == 4, "its next chunk queued past the bound")
    finally:
        gate.set()
    assert [float(r[0].reshape(-1)[0]) for r in await first] == [2.0]
    assert [float(r[0].reshape(-1)[0]) for r in await more] == [10.0, 12.0]
    await crowd
    await b.drain(10)


async def test_a_request_let_in_by_one_batcher_is_not_refused_by_the_next(
    executor: ThreadPoolExecutor,
) -> None:
    """Let in at the detector, a request's mesh call meets a mesh queue full of other
    requests' items: served all the same (a new request there is refused)."""
    detector = MicroBatcher("det", Recorder(), executor=executor, max_batch_size=4)
    gate = threading.Event()
    rec = Recorder(gate)
    mesh = MicroBatcher("mesh", rec, executor=executor, max_batch_size=4, max_queue_size=2)
    request, others, late = Owner(), Owner(), Owner()
    try:
        await detector.submit_many([item(1)], owner=request)
        assert request.let_in
        first = asyncio.ensure_future(mesh.submit_many([item(2)], owner=others))
        await wait_until(rec.started.is_set, "a mesh batch running")
        crowd = asyncio.ensure_future(mesh.submit_many([item(3), item(4)], owner=others))
        await wait_until(lambda: mesh.queue_depth == 2, "the mesh queue full")
        with pytest.raises(OverloadedError):
            await mesh.submit_many([item(5)], owner=late)
        mine = asyncio.ensure_future(mesh.submit_many([item(6)], owner=request))
        await wait_until(lambda: mesh.queue_depth == 3, "its mesh item queued past the bound")
    finally:
        gate.set()
    assert [float(r[0].reshape(-1)[0]) for r in await mine] == [12.0]
    await first
    await crowd
    await mesh.drain(10)
    await detector.drain(10)


async def test_a_failed_group_leaves_no_unretrieved_exception(
    executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch error reaching several waiting items of one caller, and a caller with a
    deadline cancelled while its items wait (a sibling image of its request failed):
    nothing is logged as 'never retrieved'."""
    import gc

    def boom(x: np.ndarray) -> np.ndarray:
        raise RuntimeError("model failed")

    b = MicroBatcher("rec", boom, executor=executor, max_batch_size=2, max_queue_size=8)
    with pytest.raises(RuntimeError):
        await b.submit_many([item(i) for i in range(5)])
    gate = threading.Event()
    slow = MicroBatcher("slow", Recorder(gate), executor=executor, max_batch_size=1)
    waiting = asyncio.ensure_future(slow.submit_many([item(i) for i in range(3)],
                                                     deadline=time.monotonic() + 60))
    await wait_until(lambda: slow.queue_depth == 2, "items queued behind the first")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.set()
    await b.drain(10)
    await slow.drain(10)
    gc.collect()
    await asyncio.sleep(0)
    assert "never retrieved" not in caplog.text
