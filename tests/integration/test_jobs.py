"""Fusion jobs end to end: a real redis-server, a real API process and real
``facefuse worker`` processes, on clips made with PyAV from the sample photos.

A clip job goes queued → running (progress) → succeeded, its result is the clip
with every frame; keys are isolated; Idempotency-Key replays; the queue is
bounded; bad clips and limits are typed before queueing; cancelling works; a
worker stopped with SIGTERM hands its job back, one killed with SIGKILL has its
job retried by another, and the job ends with exactly one result.
"""

from __future__ import annotations

import contextlib
import io
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
import redis
from server_harness import ADMIN_TOKEN, USER_TOKEN, ServerProcess
from worker_harness import WorkerProcess, wait_for, wait_state

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.toolchain.clips import Scene, motion_frames, write_clip

pytestmark = pytest.mark.slow

KEYS = f"admin:{ADMIN_TOKEN},user:{USER_TOKEN}"


def _face(analyser: FaceAnalyser, photo: np.ndarray) -> tuple[float, float, float]:
    b = analyser.analyse(photo, embed=False)[0].bbox
    return float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2, float(b[2] - b[0])


#: Frames of the ``long`` clip: enough that a worker stopped or killed once the job
#: shows progress is still mid-clip after its grace (1 s; the worker renders this
#: 480x360 clip at ~40 fps), and that the queue's Redis goes down mid-job.
LONG_FRAMES = 180


@pytest.fixture(scope="module")
def clip_bytes(tmp_path_factory: pytest.TempPathFactory, analyser: FaceAnalyser,
               sample_images: dict[str, np.ndarray]) -> dict[str, bytes]:
    """``short`` (12 frames, audio) and ``long`` (:data:`LONG_FRAMES`) clips of a
    moving face."""
    d = tmp_path_factory.mktemp("jobclips")
    photo = sample_images["obama"]
    face = _face(analyser, photo)
    out = {}
    for name, n in (("short", 12), ("long", LONG_FRAMES)):
        frames = list(motion_frames(Scene(photo, n, face, size=(480, 360), face_px=130)))
        out[name] = write_clip(d / f"{name}.mp4", frames, audio=name == "short").read_bytes()
    return out


def frame_count(data: bytes) -> int:
    with contextlib.closing(av.open(io.BytesIO(data), "r")) as c:
        return sum(1 for _ in c.decode(c.streams.video[0]))


def post_clip(c: httpx.Client, source: bytes, clip: bytes, **headers: str) -> httpx.Response:
    return c.post("/v1/jobs", files={"source": ("s.jpg", source), "clip": ("c.mp4", clip)},
                  data={"degree": "80"}, headers=headers)


@pytest.fixture
def jobs_redis(redis_factory: Callable[..., Any]) -> Any:
    """The job queue's own Redis, configured as deployments run it: nothing evicted,
    every write in the append-only file before it is acknowledged."""
    return redis_factory("--maxmemory-policy", "noeviction", "--appendonly", "yes",
                         "--appendfsync", "always")


@pytest.fixture
def stack(settings: Settings, model_dir: Path, redis_server: Any, jobs_redis: Any,
          tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The API (two keys) with its L2 cache on one Redis and the job queue on
    another; workers are started by the tests."""
    env = {"FACEFUSE_REDIS_URL": redis_server.url, "FACEFUSE_JOBS_REDIS_URL": jobs_redis.url,
           "FACEFUSE_API_KEYS": KEYS, "FACEFUSE_JOBS_MAX_QUEUED": "2",
           "FACEFUSE_VIDEO_MAX_FRAMES": str(LONG_FRAMES + 20)}
    api = ServerProcess(settings.home, tmp_path, env, name="jobs-api")
    workers: list[WorkerProcess] = []

    def worker(name: str) -> WorkerProcess:
        w = WorkerProcess(settings.home, tmp_path, jobs_redis.url, name=name)
        workers.append(w)
        return w.start()

    api.start()
    try:
        yield {"api": api, "worker": worker, "redis": redis.Redis.from_url(jobs_redis.url),
               "jobs_redis": jobs_redis, "cache": redis.Redis.from_url(redis_server.url)}
    finally:
        for w in workers:
            w.kill()
        api.kill()


def test_clip_job_end_to_end(stack: dict[str, Any], clip_bytes: dict[str, bytes],
                             sample_paths: dict[str, Path]) -> None:
    api: ServerProcess = stack["api"]
    source = sample_paths["biden"].read_bytes()
    with api.client(USER_TOKEN) as user, api.client(ADMIN_TOKEN) as other:
        r = post_clip(user, source, clip_bytes["short"], **{"Idempotency-Key": "clip-1"})
        assert r.status_code == 202, r.text
        loc = r.headers["location"]
        assert loc == f"/v1/jobs/{r.json()['id']}" and r.json()["status"] == "queued"
        again = post_clip(user, source, clip_bytes["short"], **{"Idempotency-Key": "clip-1"})
        assert again.status_code == 202 and again.headers["location"] == loc
        assert again.headers["idempotent-replayed"] == "true"
        # Another key neither sees the job nor shares its idempotency keys.
        assert other.get(loc).status_code == 404
        assert other.get(loc).json()["error"]["code"] == "job_not_found"
        assert user.get(loc + "/result").json()["error"]["code"] == "job_not_finished"
        image = user.post("/v1/jobs", files={"source": ("s.jpg", source),
                                             "target": ("t.jpg", sample_paths["obama"]
                                                        .read_bytes())})
        assert image.status_code == 202, image.text

        stack["worker"]("w1")
        done = wait_state(user, loc, {"succeeded", "failed"})
        assert done["status"] == "succeeded", done
        assert done["progress"]["frames_done"] == done["progress"]["frames_total"] == 12
        assert done["progress"]["percent"] == 100.0 and done["attempts"] == 1
        assert done["report"]["fused_frames"] == 12
        res = user.get(loc + "/result")
        assert res.status_code == 200 and res.headers["content-type"] == "video/mp4"
        assert frame_count(res.content) == 12
        img = wait_state(user, image.headers["location"], {"succeeded", "failed"})
        assert img["status"] == "succeeded", img
        got = user.get(image.headers["location"] + "/result")
        assert got.headers["content-type"] == "image/jpeg" and got.content[:2] == b"\xff\xd8"

        assert other.delete(loc).status_code == 404
        assert user.delete(loc).status_code == 204
        assert user.get(loc).status_code == 404
    # Jobs and their messages live on the queue's Redis only; the cache's holds none.
    assert list(stack["redis"].scan_iter("facefuse:job:*"))
    assert list(stack["redis"].scan_iter("facefuse-dramatiq:*"))
    assert not [k for k in stack["cache"].scan_iter("*")
                if k.startswith((b"facefuse:job", b"facefuse:idem", b"facefuse-dramatiq"))]


def test_simultaneous_first_requests_with_one_idempotency_key_make_one_job(
        stack: dict[str, Any], clip_bytes: dict[str, bytes],
        sample_paths: dict[str, Path]) -> None:
    """Requests with one Idempotency-Key, sent at once from several clients (none has
    seen the key before): one job, every answer names it, the others are replays."""
    import threading

    api: ServerProcess = stack["api"]
    source = sample_paths["biden"].read_bytes()
    n = 6
    start = threading.Barrier(n)
    answers: list[httpx.Response] = []

    def post() -> None:
        with api.client(USER_TOKEN) as c:
            start.wait(30)
            answers.append(post_clip(c, source, clip_bytes["long"],
                                     **{"Idempotency-Key": "at-once"}))

    threads = [threading.Thread(target=post) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [r.status_code for r in answers] == [202] * n, [r.text for r in answers]
    assert len({r.headers["location"] for r in answers}) == 1
    assert sorted(r.headers.get("idempotent-replayed", "") for r in answers) == [
        ""] + ["true"] * (n - 1)
    r_store: redis.Redis = stack["redis"]
    jobs = [k for k in r_store.scan_iter("facefuse:job:*") if r_store.type(k) == b"hash"]
    assert len(jobs) == 1 and r_store.zcard("facefuse:jobs:queued") == 1
    assert r_store.llen("facefuse-dramatiq:video") == 1  # one message queued


def test_refusals_bounded_queue_and_cancel(stack: dict[str, Any], clip_bytes: dict[str, bytes],
                                           sample_paths: dict[str, Path]) -> None:
    api: ServerProcess = stack["api"]
    source = sample_paths["biden"].read_bytes()
    with api.client(USER_TOKEN) as c:
        bad = post_clip(c, source, clip_bytes["short"][:3000])
        assert (bad.status_code, bad.json()["error"]["code"]) == (400, "corrupt_video")
        bad_option = c.post("/v1/jobs", files={"source": ("s.jpg", source),
                                               "clip": ("c.mp4", clip_bytes["short"])},
                            data={"detect_every": "0"})
        assert bad_option.status_code == 422, bad_option.text
        neither = c.post("/v1/jobs", files={"source": ("s.jpg", source)})
        assert neither.json()["error"]["code"] == "job_input_missing"
        # No worker runs: two jobs fill the queue, the third is refused.
        first = post_clip(c, source, clip_bytes["short"])
        second = post_clip(c, source, clip_bytes["short"])
        assert (first.status_code, second.status_code) == (202, 202)
        full = post_clip(c, source, clip_bytes["short"])
        assert full.status_code == 503 and full.json()["error"]["code"] == "queue_full"
        assert int(full.headers["retry-after"]) >= 1
        # Cancelling a queued job frees its place.
        gone = c.delete(first.headers["location"])
        assert gone.status_code == 202 and gone.json()["status"] == "cancelled"
        assert post_clip(c, source, clip_bytes["short"]).status_code == 202
        # A worker skips the cancelled job: it never runs and has no result.
        stack["worker"]("w1")
        wait_state(c, second.headers["location"], {"succeeded"})
        assert c.get(first.headers["location"]).json()["status"] == "cancelled"
        assert c.get(first.headers["location"] + "/result").status_code == 409


def test_limits_are_typed_before_queueing(settings: Settings, model_dir: Path,
                                          redis_server: Any, tmp_path: Path,
                                          clip_bytes: dict[str, bytes],
                                          sample_paths: dict[str, Path]) -> None:
    env = {"FACEFUSE_JOBS_REDIS_URL": redis_server.url, "FACEFUSE_VIDEO_MAX_FRAMES": "30",
           "FACEFUSE_VIDEO_MAX_SIDE": "640"}
    api = ServerProcess(settings.home, tmp_path, env, name="limits-api").start()
    try:
        with api.client() as c:
            r = post_clip(c, sample_paths["biden"].read_bytes(), clip_bytes["long"])
            assert (r.status_code, r.json()["error"]["code"]) == (413, "video_too_long")
            assert redis.Redis.from_url(redis_server.url).zcard("facefuse:jobs:queued") == 0
    finally:
        api.kill()


def test_stopped_and_killed_workers_hand_the_job_on(
        stack: dict[str, Any], clip_bytes: dict[str, bytes],
        sample_paths: dict[str, Path]) -> None:
    api: ServerProcess = stack["api"]
    r_store: redis.Redis = stack["redis"]
    with api.client(USER_TOKEN) as c:
        r = post_clip(c, sample_paths["biden"].read_bytes(), clip_bytes["long"])
        assert r.status_code == 202, r.text
        loc = r.headers["location"]

        def running_with_progress() -> bool:
            body = c.get(loc).json()
            return bool(body["status"] == "running" and body["progress"]["frames_done"] > 0)

        # SIGUSR1 dumps every thread's stack to the log and the job runs on.
        a = stack["worker"]("term")
        wait_for(running_with_progress, 240, "job never ran on the first worker")
        assert a.proc is not None
        a.proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: "most recent call first" in a.log_tail(20000), 10, "no stack dump")
        assert a.proc.poll() is None and c.get(loc).json()["status"] == "running"
        # SIGTERM: the job gets its grace (1 s), then goes back on the queue.
        a.terminate()
        assert a.wait(90) == 0, a.log_tail()
        assert c.get(loc).json()["status"] == "queued"
        # SIGKILL: the next worker dies mid-job; a third one finishes it.
        b = stack["worker"]("kill")
        wait_for(running_with_progress, 240, "job never ran on the second worker")
        b.kill()
        stack["worker"]("last")
        done = wait_state(c, loc, {"succeeded", "failed"}, timeout=400)
        assert done["status"] == "succeeded", done
        assert done["attempts"] == 3
        res = c.get(loc + "/result")
        assert frame_count(res.content) == LONG_FRAMES
        # Exactly one result stored.
        assert len(list(r_store.scan_iter("facefuse:job:*:result"))) == 1


def test_job_routes_keep_to_their_schema(settings: Settings, model_dir: Path,
                                         redis_server: Any, tmp_path: Path,
                                         sample_images: dict[str, np.ndarray]) -> None:
    """schemathesis on every /v1/jobs operation (valid and invalid requests, real and
    mutated photos): documented statuses and bodies only, never a 5xx (the queue is
    large enough that it never fills here)."""
    import schemathesis
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from test_server_fuzz import _fuzz, fuzz_images

    images = fuzz_images.__wrapped__(sample_images)  # type: ignore[attr-defined]
    env = {"FACEFUSE_JOBS_REDIS_URL": redis_server.url, "FACEFUSE_JOBS_MAX_QUEUED": "10000",
           "FACEFUSE_MAX_BODY_BYTES": str(4 * 1024 * 1024)}
    api = ServerProcess(settings.home, tmp_path, env, name="jobs-fuzz").start()
    try:
        schema = schemathesis.openapi.from_url(api.url + "/openapi.json")
        ops = [r.ok() for r in schema.get_all_operations()]  # type: ignore[union-attr]
        ops = [op for op in ops if op.path.startswith("/v1/jobs")]
        assert len(ops) == 4, [op.label for op in ops]
        failures = {}
        for op in ops:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    _fuzz(op, mode, images)()
                except Unsatisfiable:
                    assert mode is GenerationMode.NEGATIVE
                except Exception as exc:
                    failures[f"{op.label} ({mode.value})"] = str(exc)[:2000]
        assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    finally:
        api.kill()


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_redis_restarted_mid_job_loses_nothing(stack: dict[str, Any], how: str,
                                               clip_bytes: dict[str, bytes],
                                               sample_paths: dict[str, Path]) -> None:
    """The queue's Redis goes away while a clip is fused: a restart (a save, a stop, a
    start: an upgrade) or a crash (SIGKILL: nothing saved but the append-only file).
    The API answers 503 meanwhile, the worker waits for it, and the job finishes once."""
    api: ServerProcess = stack["api"]
    redis_server = stack["jobs_redis"]
    with api.client(USER_TOKEN) as c:
        loc = post_clip(c, sample_paths["biden"].read_bytes(), clip_bytes["long"]).headers[
            "location"]
        stack["worker"]("w1")
        wait_for(lambda: c.get(loc).json()["progress"]["frames_done"] > 0, 240,
                 "the job never ran")
        assert c.get(loc).json()["status"] == "running"
        if how == "crash":
            redis_server.kill()
        else:
            with contextlib.suppress(redis.ConnectionError):
                stack["redis"].shutdown(save=True)
            redis_server.proc.wait(timeout=30)
            redis_server.proc = None
        down = c.get(loc)
        assert (down.status_code, down.json()["error"]["code"]) == (503, "jobs_unavailable")
        redis_server.start()
        done = wait_state(c, loc, {"succeeded", "failed"}, timeout=400)
        assert done["status"] == "succeeded", done
        assert frame_count(c.get(loc + "/result").content) == LONG_FRAMES
        assert len(list(redis.Redis.from_url(redis_server.url)
                        .scan_iter("facefuse:job:*:result"))) == 1
