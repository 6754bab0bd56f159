"""The job path under hostile clips and faults: a real redis-server (append-only, as
deployed), a real API process and real ``facefuse worker`` processes, with clips
that lie about themselves made in the test with PyAV
(:mod:`facefuse.toolchain.hostile_clips`).

Refused at the door, typed, with the code ``/v1/fuse`` gives the same fault; the
API's and the worker's memory read from ``/proc`` (``VmRSS``, ``VmHWM``): bounds on
what a refusal or a failed clip costs, not speeds; a job outlives a Redis outage
longer than any patience the worker used to have; expired jobs free their places;
the queue is bounded per key.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import redis
from server_harness import ADMIN_TOKEN, USER_TOKEN, ServerProcess
from worker_harness import WorkerProcess, job_state, wait_for, wait_state

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.toolchain.clips import Scene, motion_frames, write_clip
from facefuse.toolchain.hostile_clips import pcm_clip, swollen_clip, undated_clip

pytestmark = pytest.mark.slow

KEYS = f"admin:{ADMIN_TOKEN},user:{USER_TOKEN}"
#: What a refused upload may add to the API's peak memory, and what a failed job may
#: leave in a worker beyond where it was before it, MB.
GROWTH_MB = 100
#: Frames of the clip a Redis outage interrupts (it is fused before Redis is back).
LONG_FRAMES = 120


def status_mb(pid: int, field: str) -> float:
    """``VmRSS`` / ``VmHWM`` of process ``pid``, MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory, analyser: FaceAnalyser,
          sample_images: dict[str, np.ndarray]) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("hostile-jobs")
    photo = sample_images["obama"]
    b = analyser.analyse(photo, embed=False)[0].bbox
    face = (float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2, float(b[2] - b[0]))

    def moving(name: str, n: int) -> bytes:
        frames = motion_frames(Scene(photo, n, face, size=(480, 360), face_px=130))
        return write_clip(d / f"{name}.mp4", list(frames)).read_bytes()

    return {
        "short": moving("short", 8),
        "long": moving("long", LONG_FRAMES),
        # A header of 640x480 whose frames grow to 16000x16000 after three.
        "swollen": swollen_clip(d / "swollen.mov", (640, 480),
                                [(640, 480)] * 3 + [(16000, 16000)] * 3).read_bytes(),
        # One 16000x16000 frame in a 750 KB file.
        "huge": swollen_clip(d / "huge.mov", (16000, 16000), [(16000, 16000)]).read_bytes(),
        "undated_40": undated_clip(d / "u40.mkv", 40).read_bytes(),
        "undated_60": undated_clip(d / "u60.mkv", 60).read_bytes(),
        "pcm": pcm_clip(d / "pcm.mkv", 10).read_bytes(),
    }


@pytest.fixture
def jobs_redis(redis_factory: Callable[..., Any]) -> Any:
    return redis_factory("--maxmemory-policy", "noeviction", "--appendonly", "yes",
                         "--appendfsync", "always")


@pytest.fixture
def api_factory(settings: Settings, model_dir: Path, jobs_redis: Any, tmp_path: Path
                ) -> Iterator[Callable[..., ServerProcess]]:
    """``make(**env)``: a started API (two keys) on the job Redis, more settings in
    ``env``."""
    made: list[ServerProcess] = []

    def make(**env: str) -> ServerProcess:
        full = {"FACEFUSE_JOBS_REDIS_URL": jobs_redis.url, "FACEFUSE_API_KEYS": KEYS, **env}
        api = ServerProcess(settings.home, tmp_path, full, name=f"api-{len(made)}")
        made.append(api)
        return api.start()

    try:
        yield make
    finally:
        for api in made:
            api.kill()


@pytest.fixture
def worker(settings: Settings, jobs_redis: Any, tmp_path: Path
           ) -> Iterator[Callable[[], WorkerProcess]]:
    made: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        w = WorkerProcess(settings.home, tmp_path, jobs_redis.url, name=f"w{len(made)}")
        made.append(w)
        return w.start()

    try:
        yield start
    finally:
        for w in made:
            w.kill()


def post_clip(c: httpx.Client, source: bytes, clip: bytes, **fields: str) -> httpx.Response:
    return c.post("/v1/jobs", files={"source": ("s.jpg", source), "clip": ("c.mov", clip)},
                  data=fields)


def post_image_job(c: httpx.Client, source: bytes, target: bytes) -> httpx.Response:
    return c.post("/v1/jobs", files={"source": ("s.jpg", source), "target": ("t.jpg", target)})


def code(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"] if r.status_code >= 400 else ""


# --- memory --------------------------------------------------------------------------------


def test_a_swollen_clip_fails_typed_and_the_worker_gives_its_memory_back(
        api_factory: Callable[..., ServerProcess], worker: Callable[[], WorkerProcess],
        clips: dict[str, bytes], sample_paths: dict[str, Path]) -> None:
    """A clip whose header says 640x480 and whose later frames are 16000x16000 PNGs
    (2.2 MB): the job fails ``corrupt_video`` at the first huge frame, the worker
    never decodes one, and its memory after each such job is where it was after a
    good clip."""
    api = api_factory()
    w = worker()
    assert w.proc is not None
    pid = w.proc.pid
    source = sample_paths["biden"].read_bytes()
    with api.client(USER_TOKEN) as c:
        warm = post_clip(c, source, clips["short"])
        assert warm.status_code == 202, warm.text
        assert wait_state(c, warm.headers["location"], {"succeeded", "failed"})[
            "status"] == "succeeded"
        idle, peak = status_mb(pid, "VmRSS"), status_mb(pid, "VmHWM")
        for _ in range(2):
            r = post_clip(c, source, clips["swollen"])
            assert r.status_code == 202, r.text  # the header and first frame are fine
            done = wait_state(c, r.headers["location"], {"succeeded", "failed"})
            assert done["status"] == "failed" and done["error"]["code"] == "corrupt_video"
            assert "frame 3" in done["error"]["message"]
            with contextlib.suppress(RuntimeError):  # a bound on the wait, not a speed
                wait_for(lambda: status_mb(pid, "VmRSS") - idle < GROWTH_MB, 30, "memory")
            assert status_mb(pid, "VmRSS") - idle < GROWTH_MB, w.log_tail()
    assert status_mb(pid, "VmHWM") - peak < GROWTH_MB


def test_huge_frames_are_refused_at_the_door_without_being_decoded(
        api_factory: Callable[..., ServerProcess], clips: dict[str, bytes],
        sample_paths: dict[str, Path]) -> None:
    """Four 750 KB clips of one 16000x16000 frame at once: 413 from the header, and
    the API's peak memory hardly moves (each frame would be 732 MB decoded)."""
    api = api_factory()
    source = sample_paths["biden"].read_bytes()
    before = status_mb(api.pid, "VmHWM")
    answers: list[httpx.Response] = []

    def post() -> None:
        with api.client(USER_TOKEN) as c:
            answers.append(post_clip(c, source, clips["huge"]))

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [code(r) for r in answers] == [(413, "video_resolution_too_high")] * 4
    assert status_mb(api.pid, "VmHWM") - before < GROWTH_MB


# --- limits counted, not declared ----------------------------------------------------------


def test_a_clip_without_a_duration_is_counted_at_the_door(
        api_factory: Callable[..., ServerProcess], clips: dict[str, bytes],
        sample_paths: dict[str, Path]) -> None:
    """A live-written Matroska declares no duration and no frame count: the API counts
    its packets, refuses it over the duration limit and shows its true length."""
    api = api_factory(FACEFUSE_VIDEO_MAX_DURATION_S="2")
    source = sample_paths["biden"].read_bytes()
    with api.client(USER_TOKEN) as c:
        over = post_clip(c, source, clips["undated_60"])  # 2.4 s at 25 fps
        assert code(over) == (413, "video_too_long"), over.text
        within = post_clip(c, source, clips["undated_40"])  # 1.6 s
        assert within.status_code == 202, within.text
        assert within.json()["progress"]["frames_total"] == 40


# --- the door: the same checks and codes as /v1/fuse ---------------------------------------


def test_a_deeply_nested_mapping_is_a_typed_422(
        api_factory: Callable[..., ServerProcess], clips: dict[str, bytes],
        sample_paths: dict[str, Path]) -> None:
    api = api_factory()
    source = sample_paths["biden"].read_bytes()
    target = sample_paths["obama"].read_bytes()
    deep = "[" * 1000 + "]" * 1000
    with api.client(USER_TOKEN) as c:
        fuse = c.post("/v1/fuse", files={"source": ("s.jpg", source), "target": ("t.jpg", target)},
                      data={"mapping": deep})
        job = post_clip(c, source, clips["short"], mapping=deep)
        for r in (fuse, job):
            assert code(r) == (422, "invalid_argument"), r.text
            assert "mapping" in r.json()["error"]["message"]


def test_jobs_refuse_at_the_door_what_fuse_refuses(
        api_factory: Callable[..., ServerProcess], clips: dict[str, bytes],
        sample_paths: dict[str, Path]) -> None:
    """Each fault sent to ``/v1/fuse`` and to ``/v1/jobs`` (an image job and a clip
    job): the same status and code from all three, and no job queued."""
    api = api_factory()
    source = sample_paths["biden"].read_bytes()
    target = sample_paths["obama"].read_bytes()
    rng = np.random.default_rng(7)
    noise = bytes(rng.integers(0, 256, 4000, np.uint8))
    mappings = [
        {"source": 0},
        {"source": 0, "target": -1},
        {"source": "a", "target": 0},
        {"source": 0, "target": [1, 2, 3]},
        {"source": 0, "target": [10, 10, 5, 5]},
        {"source": 0, "source_face": -1, "target": 0},
        {"source": 0, "target": 0, "extra": 1},
        {"source": 0, "target": True},
    ]
    faults: list[tuple[dict[str, bytes], dict[str, str]]] = [
        *(({}, {"mapping": json.dumps([m])}) for m in mappings),
        ({}, {"mapping": json.dumps([])}),
        ({}, {"mapping": json.dumps([{"source": 0, "target": i} for i in range(7)])}),
        ({}, {"mapping": json.dumps([{"source": 3, "target": 0}])}),
        ({}, {"mapping": json.dumps([{"source": 0, "target": 0}] * 2)}),
        ({"source": b""}, {}),
        ({"source": noise}, {}),
        ({"source": source[: len(source) // 2]}, {}),
        ({"source_2": source}, {}),
        # a reference outside mode reference, or beside a mapping, would be ignored
        ({"reference": target}, {}),
        ({"reference": target}, {"mode": "many"}),
        ({"reference": target}, {"mode": "reference",
                                 "mapping": json.dumps([{"source": 0, "target": 0}])}),
    ]
    image_faults: list[tuple[dict[str, bytes], dict[str, str]]] = [
        ({"target": b""}, {}), ({"target": noise}, {})]
    with api.client(USER_TOKEN) as c:
        for files, fields in faults + image_faults:
            images = {"source": source, "target": target, **files}
            parts = {k: (f"{k}.jpg", v) for k, v in images.items()}
            fuse = c.post("/v1/fuse", files=parts, data=fields)
            assert fuse.status_code in (400, 415, 422), (files.keys(), fields, fuse.text)
            if "reference" in files:
                assert code(fuse) == (422, "options_conflict"), fuse.text
            image_job = c.post("/v1/jobs", files=parts, data=fields)
            assert code(image_job) == code(fuse), (files.keys(), fields, image_job.text)
            if (files, fields) in image_faults:
                continue
            clip_parts = {k: v for k, v in parts.items() if k != "target"}
            clip_job = c.post("/v1/jobs", files={**clip_parts, "clip": ("c.mp4", clips["short"])},
                              data=fields)
            assert code(clip_job) == code(fuse), (files.keys(), fields, clip_job.text)
        # What only a clip has: the output container must take the encoder and audio.
        for clip, fields in ((clips["short"], {"encoder": "av1", "container": "mov"}),
                             (clips["short"], {"encoder": "x264", "container": "webm"}),
                             (clips["pcm"], {"container": "mp4"}),
                             (clips["pcm"], {"container": "webm"})):
            r = post_clip(c, source, clip, **fields)
            assert code(r) == (400, "unsupported_container"), (fields, r.text)
        assert post_clip(c, source, clips["pcm"], container="mkv").status_code == 202


def test_an_idempotency_key_reused_for_another_request_is_a_conflict(
        api_factory: Callable[..., ServerProcess], jobs_redis: Any, clips: dict[str, bytes],
        sample_paths: dict[str, Path]) -> None:
    """The key stands for the request it first came with: the same request replays
    its job, another one (other options, a clip for an image) is 409 and queues
    nothing."""
    api = api_factory()
    source = sample_paths["biden"].read_bytes()
    target = sample_paths["obama"].read_bytes()
    parts = {"source": ("s.jpg", source), "target": ("t.jpg", target)}
    key = {"Idempotency-Key": "upload-1"}
    with api.client(USER_TOKEN) as c:
        first = c.post("/v1/jobs", files=parts, data={"degree": "80"}, headers=key)
        assert first.status_code == 202, first.text
        same = c.post("/v1/jobs", files=parts, data={"degree": "80.0"}, headers=key)
        assert same.status_code == 202 and same.headers["idempotent-replayed"] == "true"
        assert same.headers["location"] == first.headers["location"]
        other = c.post("/v1/jobs", files=parts, data={"degree": "60"}, headers=key)
        assert code(other) == (409, "idempotency_conflict"), other.text
        clip = c.post("/v1/jobs", files={"source": ("s.jpg", source),
                                         "clip": ("c.mp4", clips["short"])}, headers=key)
        assert code(clip) == (409, "idempotency_conflict"), clip.text
    assert redis.Redis.from_url(jobs_redis.url).zcard("facefuse:jobs:queued") == 1


# --- the queue -----------------------------------------------------------------------------


def test_expired_queued_jobs_free_their_places(
        api_factory: Callable[..., ServerProcess], jobs_redis: Any,
        sample_paths: dict[str, Path]) -> None:
    """Queued jobs whose records expire (no worker ran them) leave the queue's count:
    a full queue opens again once they are gone."""
    api = api_factory(FACEFUSE_JOBS_MAX_QUEUED="2", FACEFUSE_JOBS_TTL_S="2")
    source = sample_paths["biden"].read_bytes()
    target = sample_paths["obama"].read_bytes()
    with api.client(USER_TOKEN) as c:
        assert [post_image_job(c, source, target).status_code for _ in range(3)] == [
            202, 202, 503]
        r = redis.Redis.from_url(jobs_redis.url)
        wait_for(lambda: not list(r.scan_iter("facefuse:job:*")), 30, "jobs never expired")
        again = post_image_job(c, source, target)
        assert again.status_code == 202, again.text
        assert r.zcard("facefuse:jobs:queued") == 1


def test_the_queue_is_bounded_per_key_and_in_all(
        api_factory: Callable[..., ServerProcess], sample_paths: dict[str, Path]) -> None:
    """One key's full share leaves the others theirs; a bound over every key's stands
    above them."""
    api = api_factory(FACEFUSE_JOBS_MAX_QUEUED="2", FACEFUSE_JOBS_MAX_QUEUED_TOTAL="3")
    source = sample_paths["biden"].read_bytes()
    target = sample_paths["obama"].read_bytes()
    with api.client(USER_TOKEN) as user, api.client(ADMIN_TOKEN) as other:
        assert [post_image_job(user, source, target).status_code for _ in range(2)] == [
            202, 202]
        full = post_image_job(user, source, target)
        assert code(full) == (503, "queue_full") and int(full.headers["retry-after"]) >= 1
        assert post_image_job(other, source, target).status_code == 202
        every = post_image_job(other, source, target)
        assert code(every) == (503, "queue_full"), every.text


# --- Redis away --------------------------------------------------------------------------


def test_a_job_outlives_a_redis_outage_longer_than_a_minute(
        api_factory: Callable[..., ServerProcess], worker: Callable[[], WorkerProcess],
        jobs_redis: Any, clips: dict[str, bytes], sample_paths: dict[str, Path]) -> None:
    """The queue's Redis crashes mid-clip and stays away 75 s (the worker used to give
    up after 60 s and leave the job ``running`` for ever, its message acknowledged):
    the clip's end waits for Redis, and the job succeeds once."""
    api = api_factory()
    with api.client(USER_TOKEN) as c:
        r = post_clip(c, sample_paths["biden"].read_bytes(), clips["long"])
        assert r.status_code == 202, r.text
        loc = r.headers["location"]
        worker()
        wait_for(lambda: c.get(loc).json()["progress"]["frames_done"] > 0, 240,
                 "the job never ran")
        jobs_redis.kill()
        time.sleep(75)
        jobs_redis.start()
        done = wait_state(c, loc, {"succeeded", "failed"}, timeout=120)
        assert done["status"] == "succeeded", done
        assert done["progress"]["frames_done"] == LONG_FRAMES
        assert c.get(loc + "/result").status_code == 200


def test_readyz_says_degraded_while_the_job_queue_is_down(
        api_factory: Callable[..., ServerProcess], jobs_redis: Any) -> None:
    """Every job route answers 503 while the queue's Redis is away: readiness says so."""
    api = api_factory()

    def ready() -> dict[str, Any]:
        r = httpx.get(api.url + "/readyz", timeout=30)
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    assert ready()["status"] == "ready" and ready()["checks"]["jobs_reachable"] is True
    jobs_redis.kill()
    down = ready()
    assert down["status"] == "degraded" and down["checks"]["jobs_reachable"] is False
    jobs_redis.start()
    assert ready()["status"] == "ready"


def test_a_starting_worker_removes_what_killed_workers_left(
        settings: Settings, model_dir: Path, jobs_redis: Any, tmp_path: Path) -> None:
    """A worker killed mid-job leaves its job directory (the user's clip) behind: the
    next worker on that temporary directory removes it, and leaves a live one's."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = tmp / f"facefuse-job-{gone.pid}-abc"
    orphan.mkdir()
    (orphan / "clip").write_bytes(b"a user's clip")
    running = tmp / f"facefuse-job-{os.getpid()}-def"
    running.mkdir()
    w = WorkerProcess(settings.home, tmp_path, jobs_redis.url, env={"TMPDIR": str(tmp)},
                      name="sweeper")
    try:
        w.start()
        assert not orphan.exists() and running.exists(), w.log_tail()
    finally:
        w.kill()


def test_a_worker_above_its_soft_memory_limit_finishes_its_job_and_exits(
        api_factory: Callable[..., ServerProcess], settings: Settings, jobs_redis: Any,
        tmp_path: Path, sample_paths: dict[str, Path]) -> None:
    """A soft limit below any worker's size: the worker finishes the job it took,
    writes its result, takes no other and exits 0; the job it left queued is done
    by the next worker (a supervisor's restart), and the first result is kept."""
    api = api_factory()
    source = sample_paths["biden"].read_bytes()
    target = sample_paths["obama"].read_bytes()
    heavy = WorkerProcess(settings.home, tmp_path, jobs_redis.url,
                          env={"FACEFUSE_JOBS_SOFT_MEMORY_MB": "20"}, name="heavy").start()
    with api.client(USER_TOKEN) as c:
        first, second = (post_image_job(c, source, target) for _ in range(2))
        assert first.status_code == second.status_code == 202
        assert heavy.wait(timeout=240) == 0, heavy.log_tail()
        assert "above its soft limit" in heavy.log_tail(), heavy.log_tail()
        assert "stopped (above its soft memory limit)" in heavy.log_tail()
        states = [job_state(c, r.headers["location"]) for r in (first, second)]
        # One job done, the other untouched: still queued, never started.
        assert sorted(s["status"] for s in states) == ["queued", "succeeded"], states
        done_loc, left_loc = ((first, second) if states[0]["status"] == "succeeded"
                              else (second, first))
        left = job_state(c, left_loc.headers["location"])
        assert left["attempts"] == 0, left
        fresh = WorkerProcess(settings.home, tmp_path, jobs_redis.url, name="fresh").start()
        try:
            assert wait_state(c, left_loc.headers["location"], {"succeeded", "failed"})[
                "status"] == "succeeded"
            assert fresh.proc is not None and fresh.proc.poll() is None  # no limit: it stays
        finally:
            fresh.kill()
        for r in (done_loc, left_loc):
            got = c.get(r.headers["location"] + "/result")
            assert got.status_code == 200 and got.headers["content-type"] == "image/jpeg"
