"""The job worker's own limits: the clip's clock, which does not count the waits for
an absent Redis, and the soft memory limit it retires above."""

from __future__ import annotations

import sys
import threading

import pytest
import redis

from facefuse.config import Settings
from facefuse.errors import DeadlineExceededError
from facefuse.serving.jobs.worker import JobRunner, WorkClock, tree_pss_mb


class FakeTime:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_time_spent_failing_to_reach_redis_is_not_the_jobs() -> None:
    now = FakeTime()
    clock = WorkClock(60.0, now=now)

    def away() -> str:
        now.t += 300.0  # a Redis that hangs for five minutes, then fails
        raise redis.ConnectionError("gone")

    assert clock.call(away, default="skipped") == "skipped"
    now.t += 50.0
    clock.check()  # 50 s of work, 300 s away
    assert clock.worked_s() == pytest.approx(50.0)
    assert clock.call(lambda: "answered", default="skipped") == "answered"
    now.t += 11.0
    with pytest.raises(DeadlineExceededError) as err:
        clock.check()
    assert err.value.code == "deadline_exceeded"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_process_tree_has_a_size() -> None:
    assert tree_pss_mb() > 1.0


def _runner(limit_mb: int) -> tuple[JobRunner, list[float]]:
    """A runner whose job does nothing (no store, no models)."""
    runner = JobRunner.__new__(JobRunner)
    runner.settings = Settings(jobs_soft_memory_mb=limit_mb)
    runner.name = "test"
    runner.current = None
    runner.retired = threading.Event()
    seen: list[float] = []
    runner.on_retire = seen.append
    runner._attempt = lambda job_id: None  # type: ignore[method-assign]
    return runner, seen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
@pytest.mark.parametrize(("limit_mb", "retires"), [(0, False), (1, True), (10**6, False)])
def test_a_worker_retires_after_a_job_only_above_its_soft_limit(limit_mb: int,
                                                                 retires: bool) -> None:
    runner, seen = _runner(limit_mb)
    runner("job-1")
    runner("job-2")
    assert runner.retired.is_set() is retires
    assert len(seen) == int(retires)  # once, however many jobs follow
    if retires:
        assert seen[0] > limit_mb


def test_the_soft_limit_is_checked() -> None:
    from facefuse.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="jobs_soft_memory_mb"):
        Settings(jobs_soft_memory_mb=-1).validate()
