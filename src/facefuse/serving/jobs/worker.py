"""``facefuse worker``: the process that runs fusion jobs from the queue.

One Dramatiq worker thread per process (a fusion uses the cores through ONNX
Runtime and the decode/fuse/encode threads of :mod:`facefuse.video.engine`; a
clip's frames render in two child processes it forks for the clip, which die
with it: :mod:`facefuse.video.processes`), and
it takes one message at a time (prefetch 1), so a queued job waits on the queue,
where another worker (a new replica) can take it. Models load once, at start.

Signals:

* SIGTERM / SIGINT: stop taking jobs; the running job has ``shutdown_grace_s``
  to finish, then it is handed back to the queue (state ``queued`` again) at its
  next frame and the process exits. The whole shutdown is bounded: a job that has
  not stopped :data:`HAND_BACK_S` after the grace (one frame stuck on a starved
  machine) is put back on the queue by the main thread (its record and its
  Dramatiq message) and the process ends anyway, so the stop takes at most
  ``shutdown_grace_s + SHUTDOWN_MARGIN_S``. The process ends with ``os._exit``
  once the job is handed on: the interpreter's own teardown (a final garbage
  collection over the loaded models, the ONNX Runtime sessions freed one by one)
  does nothing a stopped worker needs and took tens of seconds on a loaded
  machine. A second signal hands the job back at once. No job is dropped.
* Redis restarting, failing over or away for any length of time mid-job: progress
  writes and cancel checks are skipped while it is away; the job's bookkeeping
  (claim, result, errors, hand-back) waits for it to come back, however long, so
  the job's record and its message stay together: the message is acknowledged
  only once the job's end is written. A worker stopped meanwhile exits with its
  job's message unacknowledged, and the broker gives it to another worker once
  its heartbeats stop (the record, still ``running``, is claimed again).
* SIGKILL (or a lost node): the broker stops seeing this worker's heartbeats;
  after ``jobs_heartbeat_s`` its unacknowledged message goes back on the queue
  and another worker runs the job from the start (attempt 2). A job that has
  killed ``jobs_max_tries`` workers fails with ``job_failed_repeatedly``.
* SIGUSR1: every thread's Python stack is written to stderr (``faulthandler``),
  the job running on: for a worker that seems stuck.

Memory: after every job the worker collects garbage and gives the C heap's free
pages back (:func:`facefuse.serving.heap.release_free_heap`), so a clip that failed
half-way leaves the worker where it was before it. A worker whose memory is still
above ``jobs_soft_memory_mb`` then (its PSS with any child process, from
``/proc``: what its container is charged) retires: the job is already written and
its message acknowledged, the worker takes no other (its Dramatiq thread stops
after this message; one the consumer had prefetched goes back on the queue) and
the process exits 0 as after a SIGTERM, for its supervisor (Kubernetes,
compose's ``restart``) to start a fresh one.

Time: a clip job may work ``jobs_timeout_s`` on its frames, then it fails typed
``deadline_exceeded``. That clock runs only while the job works: the waits for an
absent Redis (before the first frame, at the end, and the progress writes that
failed meanwhile) are not counted, so an outage of any length cannot run a job out
of time while its bookkeeping waits. Dramatiq's own time limit, which raises into
the job's thread wherever it is (a wait for Redis included, whose message would
then be acknowledged with its job unfinished), is off for the actor.

Temporary files: a clip job works in a temporary directory named after the
worker's pid (``facefuse-job-<pid>-…``, the user's clip and the output being
written), removed when the job ends. One left by a worker that was killed is
removed when a worker starts on the same temporary directory (its pid is gone),
and every minute any older than ``jobs_timeout_s`` plus the shutdown margin
(no job runs that long): :func:`sweep_temporaries`.

Metrics (Prometheus, ``--metrics-port``): ``facefuse_jobs_total{kind,outcome}``,
``facefuse_job_duration_seconds{kind}``, ``facefuse_job_fps``,
``facefuse_jobs_queued`` and ``facefuse_jobs_oldest_queued_seconds``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from facefuse.config import Settings
from facefuse.errors import CancelledError, DeadlineExceededError, FacefuseError
from facefuse.fusion.engine import FaceFuser
from facefuse.imaging.encode import content_type
from facefuse.imaging.output import OutputPolicy
from facefuse.serving.heap import release_free_heap
from facefuse.serving.jobs.queue import ACTOR, QUEUE, broker
from facefuse.serving.jobs.store import JobStore, job_options
from facefuse.video.engine import frame_threads_only
from facefuse.video.fuser import VideoFuser

__all__ = ["JobRunner", "WorkClock", "run_worker", "tree_pss_mb"]

log = logging.getLogger("facefuse.worker")

#: Seconds between progress writes and cancellation checks of a running job.
PROGRESS_EVERY_S = 0.5
_CLIP_TYPES = {"mp4": "video/mp4", "webm": "video/webm", "mkv": "video/x-matroska",
               "mov": "video/quicktime"}


#: Seconds a running job has, after the shutdown grace, to stop at a frame and hand
#: itself back before the main thread requeues it and the process exits anyway.
HAND_BACK_S = 10.0
#: What a stop takes at most beyond ``shutdown_grace_s``, seconds: the hand-back,
#: the requeue of a stuck job and the exit. Deployments give a worker
#: ``shutdown_grace_s + SHUTDOWN_MARGIN_S`` before they SIGKILL it.
SHUTDOWN_MARGIN_S = 30.0

#: How long a stopping worker waits for Redis to take its job back, seconds (a job's
#: own bookkeeping waits for Redis however long it is away).
REDIS_PATIENCE_S = 5.0

T = TypeVar("T")


def tree_pss_mb(pid: int | str = "self") -> float:
    """PSS of process ``pid`` and its live children, MB (``Pss`` of
    ``/proc/<pid>/smaps_rollup``: pages shared with a child counted once); its
    ``VmRSS`` where smaps_rollup cannot be read; 0.0 off Linux."""
    proc = Path("/proc") / str(pid)
    pids = [str(pid)]
    with contextlib.suppress(OSError):
        for task in (proc / "task").iterdir():
            with contextlib.suppress(OSError):
                pids += (task / "children").read_text().split()
    total = 0.0
    for p in pids:
        field = None
        with contextlib.suppress(OSError):
            for line in (Path("/proc") / p / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    field = int(line.split()[1])
                    break
        if field is None and p == str(pid):
            with contextlib.suppress(OSError):
                for line in (proc / "status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        field = int(line.split()[1])
                        break
        total += (field or 0) / 1024
    return total


def patient(fn: Callable[..., T], *args: Any, seconds: float | None = None) -> T:
    """``fn(*args)``, retried with back-off while Redis is unreachable (connection
    errors and timeouts only), up to ``seconds`` (None: until it answers)."""
    import redis

    end = None if seconds is None else time.monotonic() + seconds
    delay = 0.2
    while True:
        try:
            return fn(*args)
        except (redis.ConnectionError, redis.TimeoutError):
            if end is not None and time.monotonic() + delay > end:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def best_effort(fn: Callable[..., T], *args: Any, default: T) -> T:
    """``fn(*args)``, or ``default`` while Redis is unreachable (progress, cancel checks:
    the job goes on)."""
    import redis

    try:
        return fn(*args)
    except redis.RedisError:
        return default


class HandBackError(Exception):
    """Raised inside a job when its worker shuts down: the job goes back on the queue."""


class JobRunner:
    """Runs one job by id: claim, fuse, store the result or the typed error."""

    def __init__(self, settings: Settings, store: JobStore, fuser: FaceFuser,
                 metrics: WorkerMetrics | None = None) -> None:
        self.settings = settings
        self.store = store
        self.fuser = fuser
        self.video = VideoFuser(fuser)
        self.metrics = metrics
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        #: Set when the process is shutting down and the grace period is over.
        self.handing_back = threading.Event()
        #: The id of the job running now, None between jobs.
        self.current: str | None = None
        #: Called once when the worker is above its soft memory limit after a job.
        self.on_retire: Callable[[float], object] | None = None
        #: Set once the worker retires: it takes no other job.
        self.retired = threading.Event()

    def __call__(self, job_id: str) -> None:
        self.current = job_id
        try:
            self._attempt(job_id)
        finally:
            self.current = None
            gc.collect()
            release_free_heap()
            self._check_memory()

    def _check_memory(self) -> None:
        """Retire (see the module docstring) when above ``jobs_soft_memory_mb``."""
        limit = self.settings.jobs_soft_memory_mb
        if not limit or self.retired.is_set():
            return
        used = tree_pss_mb()
        if used <= limit:
            return
        self.retired.set()
        log.warning("worker memory %.0f MB is above its soft limit (%d MB) after a job; "
                    "restarting", used, limit,
                    extra={"fields": {"worker": self.name, "pss_mb": round(used)}})
        with contextlib.suppress(ImportError):
            from dramatiq.worker import WorkerThread

            thread = threading.current_thread()
            if isinstance(thread, WorkerThread):
                thread.stop()  # after this message's acknowledgement: no other job
        if self.on_retire is not None:
            self.on_retire(used)

    def _attempt(self, job_id: str) -> None:
        attempt = patient(self.store.claim, job_id, self.name)
        if attempt is None:
            log.info("job %s is gone or over; skipped", job_id)
            return
        job = patient(self.store.get, job_id)
        if attempt > self.settings.jobs_max_tries:
            patient(self.store.fail, job_id, "job_failed_repeatedly",
                            f"the job stopped its worker {attempt - 1} times")
            self._count(job.kind, "failed")
            return
        t0 = time.monotonic()
        try:
            data, ctype, report = self._run(job_id, job.kind, job.options)
        except HandBackError:
            patient(self.store.requeue, job_id)
            self._count(job.kind, "requeued")
            raise  # Dramatiq's retry puts the message back on the queue
        except CancelledError:
            self._count(job.kind, "cancelled")
            return
        except FacefuseError as exc:  # bad input: retrying would fail the same way
            patient(self.store.fail, job_id, exc.code, exc.message)
            self._count(job.kind, "failed")
            return
        except Exception as exc:
            log.exception("job %s failed", job_id)
            if attempt >= self.settings.jobs_max_tries:
                patient(self.store.fail, job_id, "internal_error", f"{type(exc).__name__}")
                self._count(job.kind, "failed")
                return
            patient(self.store.requeue, job_id)
            raise
        won = patient(self.store.finish, job_id, data, ctype, report)
        self._count(job.kind, "succeeded" if won else "duplicate")
        if self.metrics is not None and won:
            self.metrics.duration.labels(job.kind).observe(time.monotonic() - t0)
            if report.get("fps"):
                self.metrics.fps.set(float(report["fps"]))

    def _count(self, kind: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.jobs.labels(kind, outcome).inc()

    def _run(self, job_id: str, kind: str, raw: dict[str, Any]
             ) -> tuple[bytes, str, dict[str, Any]]:
        files = patient(self.store.files, job_id)
        video_opts, mapping, out_format, quality = job_options(raw, kind)
        # "source", "source_1", ... (at most six: the names sort in index order).
        sources = [files[k] for k in sorted(files) if k == "source" or k.startswith("source_")]
        reference = files.get("reference")
        if kind == "image":
            result = self.fuser.fuse(sources, files["target"], video_opts.fuse,
                                     mapping=mapping, reference=reference)
            data = OutputPolicy.from_settings(self.settings).encode(result.image, out_format,
                                                                    quality)
            return data, content_type(out_format), result.report()
        last = [0.0]
        clock = WorkClock(self.settings.jobs_timeout_s)

        def progress(done: int, total: int, fps: float) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_EVERY_S or done == total:
                last[0] = now
                clock.call(self.store.progress, job_id, done, total, fps, default=None)

        checked = [0.0, False]

        def cancelled() -> bool:
            if self.handing_back.is_set():
                raise HandBackError(job_id)
            clock.check()
            now = time.monotonic()
            if now - float(checked[0]) >= PROGRESS_EVERY_S:
                checked[0] = now
                checked[1] = clock.call(self.store.cancel_requested, job_id, default=False)
            return bool(checked[1])

        with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-") as tmp:
            clip = Path(tmp) / "clip"
            clip.write_bytes(files["clip"])
            out = Path(tmp) / f"out.{out_format}"
            report = self.video.fuse_video(sources, clip, out, video_opts, mapping=mapping,
                                           reference=reference, progress=progress,
                                           cancelled=cancelled)
            return out.read_bytes(), _CLIP_TYPES[out_format], report.to_dict()


class WorkClock:
    """A clip job's run time against ``limit_s``, less the time its Redis calls spent
    failing (an outage is not the job's work)."""

    def __init__(self, limit_s: float, now: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = limit_s
        self.now = now
        self.start = now()
        self.away_s = 0.0

    def call(self, fn: Callable[..., T], *args: Any, default: T) -> T:
        """:func:`best_effort`, the time of a failed call not counted."""
        import redis

        t0 = self.now()
        try:
            return fn(*args)
        except redis.RedisError:
            self.away_s += self.now() - t0
            return default

    def worked_s(self) -> float:
        return self.now() - self.start - self.away_s

    def check(self) -> None:
        """Raises DeadlineExceededError once the job has worked ``limit_s``."""
        if self.worked_s() > self.limit_s:
            raise DeadlineExceededError(
                f"the clip was still running after {self.limit_s:.0f} s "
                f"(FACEFUSE_JOBS_TIMEOUT_S)")


#: The name of a job's temporary directory starts with this and the worker's pid.
TMP_PREFIX = "facefuse-job-"
#: Seconds between two sweeps of old job directories by a running worker.
SWEEP_EVERY_S = 60.0


def sweep_temporaries(max_age_s: float, root: Path | None = None) -> int:
    """Remove the job directories under ``root`` (the temporary directory) that no
    running job owns: those of a process that is gone (a worker that was killed),
    and any older than ``max_age_s``. Returns how many were removed."""
    root = Path(root or tempfile.gettempdir())
    removed = 0
    now = time.time()
    for path in root.glob(f"{TMP_PREFIX}*"):
        pid_text = path.name[len(TMP_PREFIX):].split("-", 1)[0]
        try:
            old = now - path.lstat().st_mtime > max_age_s
        except OSError:
            continue
        if old or (pid_text.isdigit() and not _alive(int(pid_text))):
            shutil.rmtree(path, ignore_errors=True)
            removed += not path.exists()
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def in_flight() -> Any:
    """A Dramatiq middleware whose ``message`` is the message being processed (None
    between messages), so that a shutdown can put it back on its queue when its job
    does not stop in time."""
    from dramatiq import Middleware

    class InFlight(Middleware):
        message: Any = None

        def before_process_message(self, broker: Any, message: Any) -> None:
            self.message = message

        def after_process_message(self, broker: Any, message: Any, *, result: Any = None,
                                  exception: BaseException | None = None) -> None:
            self.message = None

        def after_skip_message(self, broker: Any, message: Any) -> None:
            self.message = None

    return InFlight()


class WorkerMetrics:
    """The worker's Prometheus metrics (see the module docstring)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.jobs = Counter("facefuse_jobs_total", "Jobs ended, by kind and outcome",
                            ["kind", "outcome"], registry=self.registry)
        self.duration = Histogram("facefuse_job_duration_seconds", "Run time of a job",
                                  ["kind"], registry=self.registry,
                                  buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800))
        self.fps = Gauge("facefuse_job_fps", "Frames per second of the last clip job",
                         registry=self.registry)
        self.queued = Gauge("facefuse_jobs_queued", "Jobs waiting in the queue",
                            registry=self.registry)
        self.oldest = Gauge("facefuse_jobs_oldest_queued_seconds",
                            "Age of the oldest queued job", registry=self.registry)

    def poll(self, store: JobStore, stop: threading.Event,
             sweep: Callable[[], object] | None = None) -> None:
        """Refresh the queue gauges every few seconds, and call ``sweep`` every
        :data:`SWEEP_EVERY_S`, until ``stop``."""
        swept = time.monotonic()
        while not stop.wait(5.0):
            if sweep is not None and time.monotonic() - swept >= SWEEP_EVERY_S:
                swept = time.monotonic()
                sweep()
            try:
                n, age = store.queue_stats()
            except Exception:  # Redis away: the gauges keep their last values
                continue
            self.queued.set(n)
            self.oldest.set(age)


def run_worker(settings: Settings, *, metrics_port: int = 0) -> NoReturn:
    """Run a worker until SIGTERM/SIGINT, hand its job on and end the process with
    status 0 (see the module docstring: the stop is bounded, the exit skips the
    interpreter's teardown)."""
    from dramatiq import Worker

    frame_threads_only()  # before any thread: its work is mostly clips
    max_age = settings.jobs_timeout_s + SHUTDOWN_MARGIN_S

    def sweep() -> object:
        return sweep_temporaries(max_age)

    if n := sweep_temporaries(max_age):
        log.warning("removed %d job directories left by stopped workers", n)
    q = broker(settings)
    flight = in_flight()
    q.add_middleware(flight)
    store = JobStore(settings)
    fuser = FaceFuser(settings)
    metrics = WorkerMetrics()
    runner = JobRunner(settings, store, fuser, metrics)
    _register(q, settings, runner)
    stop = threading.Event()
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, registry=metrics.registry)
    threading.Thread(target=metrics.poll, args=(store, stop, sweep), daemon=True,
                     name="queue-gauges").start()

    _stop_on_signals(stop, runner)
    worker = Worker(q, worker_threads=1, worker_timeout=1000)
    worker.queue_prefetch = 1  # one job at a time: the rest wait where others can take them
    worker.start()
    log.warning("facefuse worker ready", extra={"fields": {"worker": runner.name}})
    print(f"facefuse worker {runner.name} ready", flush=True)
    wait_for_stop(stop)
    shut_down(worker, runner, flight, settings.shutdown_grace_s)
    why = " (above its soft memory limit)" if runner.retired.is_set() else ""
    print(f"facefuse worker {runner.name} stopped{why}", flush=True)
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(0)


def _register(q: Any, settings: Settings, runner: JobRunner) -> None:
    """Make ``runner`` the broker's :data:`ACTOR` on the :data:`QUEUE`."""
    import dramatiq

    dramatiq.actor(actor_name=ACTOR, queue_name=QUEUE, broker=q,
                   max_retries=settings.jobs_max_tries, min_backoff=200, max_backoff=2000,
                   # Never: the job keeps its own clock (WorkClock), which does not
                   # count the waits for Redis that Dramatiq's would interrupt.
                   time_limit=float("inf"),
                   # Typed errors end the job themselves; only crashes and hand-backs retry.
                   throws=(FacefuseError,))(runner)


def _stop_on_signals(stop: threading.Event, runner: JobRunner) -> None:
    """SIGTERM / SIGINT set ``stop`` (a second one: hand the job back at once), as does
    the runner retiring above its memory limit; SIGUSR1 dumps every thread's stack."""

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():  # a second signal: no more grace
            runner.handing_back.set()
        stop.set()

    runner.on_retire = lambda _mb: stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


#: Seconds between two looks at the stop flag of a waiting main thread.
STOP_POLL_S = 0.5


def wait_for_stop(stop: threading.Event, poll_s: float = STOP_POLL_S) -> None:
    """Wait in the main thread until ``stop`` is set, in slices of ``poll_s``.

    A signal the kernel hands to another thread (any of the job's threads may take
    the process's SIGTERM) sets the handler's flag but does not wake a main thread
    blocked on a lock, and Python runs the handler only in the main thread between
    two bytecodes: an untimed ``stop.wait()`` then never returned (a SIGTERM'd worker
    still running 90 s later, its main thread in ``stop.wait()``). Each slice lets
    the handler run."""
    while not stop.wait(poll_s):
        pass


def shut_down(worker: Any, runner: JobRunner, flight: Any, grace_s: float) -> bool:
    """Stop the Dramatiq ``worker`` within ``grace_s + HAND_BACK_S`` (plus the
    consumers' last poll): the running job finishes within ``grace_s`` or hands
    itself back at its next frame; one still running after that is requeued here
    (record and message). True when the job stopped by itself (or none ran)."""
    timer = threading.Timer(grace_s, runner.handing_back.set)
    timer.daemon = True
    timer.start()
    bound = grace_s + HAND_BACK_S
    stopper = threading.Thread(target=worker.stop, kwargs={"timeout": int(bound * 1000)},
                               daemon=True, name="worker-stop")
    stopper.start()
    stopper.join(bound + 5.0)  # Dramatiq's stop: the job's thread, then a consumer poll
    timer.cancel()
    job_id, message = runner.current, flight.message
    if job_id is None and not stopper.is_alive():
        return True
    if job_id is None:
        log.warning("the worker's consumers did not stop within %.0f s of the signal", bound)
    else:
        log.warning("job %s did not stop within %.0f s of the signal; requeued", job_id, bound)
    if job_id is not None:
        with contextlib.suppress(Exception):
            patient(runner.store.requeue, job_id, seconds=REDIS_PATIENCE_S)
    if message is not None:
        # Back on its queue now, not when this worker's heartbeats are missed.
        with contextlib.suppress(Exception):
            worker.broker.do_requeue(message.queue_name,
                                     message.options["redis_message_id"])
    return False
