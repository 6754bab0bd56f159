"""A worker's stop is bounded even when its job does not stop: a real redis-server, a
real Dramatiq worker and the worker's own shutdown, with a job whose work never
returns (a frame stuck on a starved machine, a native call that hangs).

The job is handed on by the stopping worker itself: its record goes back to
``queued`` and its Dramatiq message back on the queue's Redis list (where the next
worker, and the autoscaler, see it at once), and ``shut_down`` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from worker_harness import wait_for

from facefuse.config import Settings
from facefuse.fusion.engine import FaceFuser
from facefuse.serving.jobs import worker as worker_mod
from facefuse.serving.jobs.queue import ACTOR, NAMESPACE, QUEUE, broker, enqueue
from facefuse.serving.jobs.store import JobStore

pytestmark = pytest.mark.slow


class StuckRunner(worker_mod.JobRunner):
    """A runner whose work blocks until ``release`` (it ignores the hand-back flag,
    as a frame stuck in native code would)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.release = threading.Event()

    def _run(self, job_id: str, kind: str, raw: dict[str, Any]
             ) -> tuple[bytes, str, dict[str, Any]]:
        self.release.wait(120)
        raise worker_mod.HandBackError(job_id)


@pytest.fixture
def stuck(settings: Settings, fuser: FaceFuser, redis_server: Any
          ) -> Iterator[dict[str, Any]]:
    """A running Dramatiq worker (one thread, prefetch 1) with a stuck job on it."""
    import dramatiq
    from dramatiq import Worker

    s = settings.replace(jobs_redis_url=redis_server.url, jobs_heartbeat_s=60.0)
    q = broker(s)
    flight = worker_mod.in_flight()
    q.add_middleware(flight)
    store = JobStore(s)
    runner = StuckRunner(s, store, fuser)
    dramatiq.actor(actor_name=ACTOR, queue_name=QUEUE, broker=q, max_retries=3,
                   min_backoff=200, max_backoff=2000)(runner)
    job_id, created = store.create("k", "clip", {"clip": b"x"}, {}, 10)
    assert created
    enqueue(q, job_id)
    w = Worker(q, worker_threads=1, worker_timeout=200)
    w.queue_prefetch = 1
    w.start()
    try:
        wait_for(lambda: store.get(job_id).state == "running", 60, "the job never started")
        yield {"worker": w, "runner": runner, "flight": flight, "store": store,
               "job": job_id, "redis": redis.Redis.from_url(redis_server.url)}
    finally:
        runner.release.set()
        w.stop(timeout=5000)


def test_a_job_that_does_not_stop_is_requeued_and_the_stop_returns(
        stuck: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_mod, "HAND_BACK_S", 0.5)
    r: redis.Redis = stuck["redis"]
    assert r.llen(f"{NAMESPACE}:{QUEUE}") == 0  # the message is this worker's now
    done: list[bool] = []
    stopper = threading.Thread(target=lambda: done.append(worker_mod.shut_down(
        stuck["worker"], stuck["runner"], stuck["flight"], 0.2)), daemon=True)
    stopper.start()
    stopper.join(120)  # a bound on a hang: without the requeue this never returns
    assert done == [False], "shut_down did not return"
    assert stuck["runner"].handing_back.is_set()
    job = stuck["store"].get(stuck["job"])
    assert job.state == "queued" and job.attempts == 1
    assert r.zscore("facefuse:jobs:queued", stuck["job"]) is not None
    # The message is back on the queue for the next worker, not held by this one.
    assert r.llen(f"{NAMESPACE}:{QUEUE}") == 1
    acks = [k for k in r.scan_iter(f"{NAMESPACE}:__acks__.*") if r.scard(k)]
    assert acks == []
