"""Long work as jobs: a job record and its files in Redis (the work is on Dramatiq:
:mod:`~facefuse.serving.jobs.queue`).

The queue engine is **Dramatiq** (its Redis broker; docs/video.md says why), on
the job queue's own Redis, ``jobs_redis_url``: one that never evicts and keeps an
append-only file, never the L2 cache's (an LRU cache would evict queued jobs).
What each part keeps:

* Dramatiq owns delivery: a message per job on the ``video`` queue; a worker
  acknowledges it only when the job is over, and a worker that stops sending
  heartbeats (SIGKILL, a lost node) has its unacknowledged message put back on
  the queue by the broker's maintenance, for another worker.
* :class:`JobStore` owns the job as the API shows it, under ``facefuse:job:<id>``:
  a hash (owner, state, progress, error, report), the uploaded files and the
  result, all expiring after ``jobs_ttl_s``; sorted sets of queued job ids, one per
  owner (its size bounds that owner's share of the queue, ``jobs_max_queued``) and
  one over every owner (``jobs_max_queued_total``; its oldest score is the queue's
  age); an ``Idempotency-Key`` index per owner. An id whose record expired leaves
  the sets: at its claim, and by age (a queued score older than the TTL is an
  expired record) whenever a job is created.

State machine: ``queued`` → ``running`` → ``succeeded`` | ``failed``, and
``cancelled`` from ``queued`` or ``running``. Exactly one result: the result is
written with ``SET NX`` and the state moves to ``succeeded`` only by the
attempt that wrote it; a second attempt of the same job (a worker thought dead
that was not) finds the result there and stops.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from facefuse.config import Settings
from facefuse.errors import (
    IdempotencyConflictError,
    JobNotFoundError,
    OverloadedError,
)
from facefuse.fusion.types import FuseOptions, declared
from facefuse.serving.jobs.queue import jobs_redis_url
from facefuse.video.options import VideoOptions

__all__ = ["FINAL", "JobRecord", "JobState", "JobStore", "job_options", "new_job_id",
           "request_digest"]

JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
#: States a job does not leave.
FINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
_P = "facefuse:job:"
_QUEUED = "facefuse:jobs:queued"
#: The queued set of one owner: this prefix and the owner.
_OWNER_QUEUED = "facefuse:jobs:queued:"

# The scripts below find an owner's queued set from the record's owner field: a
# single Redis, not a Cluster (as the replayed job's hash, named from a key's value).
# Leaving both queued sets: ARGV[n] the job id, the owner sets' prefix.
_UNQUEUE = """
local function unqueue(job, id, prefix, all)
  redis.call('zrem', all, id)
  local owner = redis.call('hget', job, 'owner')
  if owner then redis.call('zrem', prefix .. owner, id) end
end
"""
# Admission, in one step: an idempotency key that names a job still there returns it
# (or, when that job was made from another request, whose digest differs, refuses);
# ids whose records expired leave the queued sets (by age: a score older than the TTL);
# a full queue (the owner's, then everyone's) refuses; else the files, the record, its
# place in both queued sets and the idempotency key are written together. Atomic, so
# two simultaneous first requests with one key make one job (the second sees the
# first's key and job). KEYS: the job hash, the queued set, the idempotency key (the
# job hash again when there is none), the owner's queued set, the file keys. ARGV: max
# queued for the owner, max queued in all, now, ttl, the record's fields (JSON), the
# job id, the job key prefix, the request's digest, the files' bytes (in KEYS order).
_CREATE = """
local idem = KEYS[3] ~= KEYS[1]
if idem then
  local existing = redis.call('get', KEYS[3])
  if existing and redis.call('exists', ARGV[7] .. existing) == 1 then
    local digest = redis.call('hget', ARGV[7] .. existing, 'digest')
    if digest and digest ~= ARGV[8] then return {-3, existing} end
    return {0, existing}
  end
end
local stale = tonumber(ARGV[3]) - tonumber(ARGV[4])
redis.call('zremrangebyscore', KEYS[2], '-inf', stale)
redis.call('zremrangebyscore', KEYS[4], '-inf', stale)
if redis.call('zcard', KEYS[4]) >= tonumber(ARGV[1]) then return {-1, ''} end
if redis.call('zcard', KEYS[2]) >= tonumber(ARGV[2]) then return {-2, ''} end
for i = 5, #KEYS do redis.call('set', KEYS[i], ARGV[i + 4], 'EX', ARGV[4]) end
redis.call('hset', KEYS[1], unpack(cjson.decode(ARGV[5])))
redis.call('expire', KEYS[1], ARGV[4])
redis.call('zadd', KEYS[2], ARGV[3], ARGV[6])
redis.call('zadd', KEYS[4], ARGV[3], ARGV[6])
redis.call('expire', KEYS[4], ARGV[4])
if idem then redis.call('set', KEYS[3], ARGV[6], 'EX', ARGV[4]) end
return {1, ARGV[6]}
"""
# Claim by an attempt: only a queued or running (a retried attempt) job. The id leaves
# the queued sets whatever its state, an expired record's too (its message is the
# last thing that names it).
_CLAIM = _UNQUEUE + """
unqueue(KEYS[1], ARGV[3], ARGV[4], KEYS[2])
local s = redis.call('hget', KEYS[1], 'state')
if s ~= 'queued' and s ~= 'running' then return false end
redis.call('hset', KEYS[1], 'state', 'running', 'started', ARGV[1], 'worker', ARGV[2],
           'frames_done', 0, 'fps', 0)
return redis.call('hincrby', KEYS[1], 'attempts', 1)
"""
# Finish: the first attempt to store a result wins; the state follows it, and the
# progress its frame count (the last progress write may have missed Redis).
_FINISH = """
if redis.call('hget', KEYS[1], 'state') ~= 'running' then return 0 end
if redis.call('set', KEYS[2], ARGV[1], 'NX', 'EX', ARGV[2]) == false then return 0 end
redis.call('hset', KEYS[1], 'state', 'succeeded', 'finished', ARGV[3], 'report', ARGV[4],
           'result_bytes', string.len(ARGV[1]))
if ARGV[5] ~= '' then
  redis.call('hset', KEYS[1], 'frames_done', ARGV[5], 'frames_total', ARGV[5])
end
redis.call('expire', KEYS[1], ARGV[2])
return 1
"""
# Back to queued: only a running job (a finished one keeps its state and result).
_REQUEUE = """
if redis.call('hget', KEYS[1], 'state') ~= 'running' then return 0 end
redis.call('hset', KEYS[1], 'state', 'queued', 'frames_done', 0, 'fps', 0)
redis.call('zadd', KEYS[2], ARGV[1], ARGV[2])
redis.call('zadd', ARGV[3] .. redis.call('hget', KEYS[1], 'owner'), ARGV[1], ARGV[2])
return 1
"""
# Move to a final state unless already final.
_END = _UNQUEUE + """
local s = redis.call('hget', KEYS[1], 'state')
if not s or s == 'succeeded' or s == 'failed' or s == 'cancelled' then return 0 end
redis.call('hset', KEYS[1], 'state', ARGV[1], 'finished', ARGV[2], 'error_code', ARGV[3],
           'error_message', ARGV[4])
unqueue(KEYS[1], ARGV[5], ARGV[6], KEYS[2])
return 1
"""


def request_digest(kind: str, files: Mapping[str, bytes], options: Mapping[str, Any]) -> str:
    """What a job request is, as one SHA-256 hex digest: its kind, each file's name
    and content, and its options (defaults included, so leaving one out and sending
    its default are the same request)."""
    h = hashlib.sha256(kind.encode())
    for name in sorted(files):
        h.update(b"\0" + name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    h.update(json.dumps(dict(options), sort_keys=True, default=str).encode())
    return h.hexdigest()


def new_job_id() -> str:
    """A random job id (URL-safe, 22 characters)."""
    return secrets.token_urlsafe(16)


@dataclass
class JobRecord:
    """A job as ``GET /v1/jobs/{id}`` shows it."""

    id: str
    owner: str
    kind: str
    state: str
    created: float
    options: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    started: float | None = None
    finished: float | None = None
    frames_done: int = 0
    frames_total: int = 0
    fps: float = 0.0
    error_code: str = ""
    error_message: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    result_type: str = ""
    result_bytes: int = 0

    @classmethod
    def from_hash(cls, job_id: str, h: Mapping[bytes, bytes]) -> JobRecord:
        g = {k.decode(): v.decode() for k, v in h.items()}

        def num(name: str) -> float | None:
            return float(g[name]) if g.get(name) else None

        return cls(id=job_id, owner=g.get("owner", ""), kind=g.get("kind", "clip"),
                   state=g.get("state", "queued"), created=float(g.get("created", 0)),
                   options=json.loads(g.get("options", "{}")),
                   attempts=int(g.get("attempts", 0)), started=num("started"),
                   finished=num("finished"), frames_done=int(float(g.get("frames_done", 0))),
                   frames_total=int(float(g.get("frames_total", 0))),
                   fps=float(g.get("fps", 0)), error_code=g.get("error_code", ""),
                   error_message=g.get("error_message", ""),
                   report=json.loads(g.get("report") or "{}"),
                   result_type=g.get("result_type", ""),
                   result_bytes=int(g.get("result_bytes", 0)))

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """The status body: state, progress (frames, percent, fps, ETA seconds),
        the error when failed, the report when succeeded."""
        now = time.time() if now is None else now
        d: dict[str, Any] = {"id": self.id, "status": self.state, "kind": self.kind,
                             "created": self.created, "attempts": self.attempts}
        if self.started is not None:
            d["started"] = self.started
        if self.finished is not None:
            d["finished"] = self.finished
        total = max(self.frames_total, self.frames_done)
        progress: dict[str, Any] = {"frames_done": self.frames_done, "frames_total": total,
                                    "percent": round(100.0 * self.frames_done / total, 1)
                                    if total else (100.0 if self.state == "succeeded" else 0.0),
                                    "fps": round(self.fps, 2)}
        if self.state == "running" and self.fps > 0 and total:
            progress["eta_s"] = round((total - self.frames_done) / self.fps, 1)
        d["progress"] = progress
        if self.state == "failed":
            d["error"] = {"code": self.error_code, "message": self.error_message}
        if self.state == "succeeded":
            d["result"] = {"url": f"/v1/jobs/{self.id}/result", "type": self.result_type,
                           "bytes": self.result_bytes}
            d["report"] = self.report
        return d


class JobStore:
    """Jobs, their files and results in Redis (synchronous client: the worker calls
    it directly, the API from a thread)."""

    def __init__(self, settings: Settings, client: Any | None = None) -> None:
        import redis

        url = jobs_redis_url(settings)
        self.settings = settings
        self.ttl = settings.jobs_ttl_s
        self.r: Any = client or redis.Redis.from_url(url, socket_timeout=5.0,
                                                socket_connect_timeout=5.0)
        self._create = self.r.register_script(_CREATE)
        self._claim = self.r.register_script(_CLAIM)
        self._finish = self.r.register_script(_FINISH)
        self._end = self.r.register_script(_END)
        self._requeue = self.r.register_script(_REQUEUE)

    # ---- the API side ---------------------------------------------------------------------

    def create(self, owner: str, kind: str, files: Mapping[str, bytes],
               options: Mapping[str, Any], frames_total: int,
               idempotency_key: str | None = None, digest: str = "") -> tuple[str, bool]:
        """Store a new queued job and its files; returns (id, created). With an
        ``idempotency_key`` seen before for ``owner`` whose job is still there, that
        job's id and False, when the job was made from the same request (its
        ``digest``, see :func:`request_digest`). One atomic step (see ``_CREATE``):
        simultaneous first requests with one key make one job. The caller then
        enqueues the job's message (:meth:`enqueue`).

        Raises:
            IdempotencyConflictError: ``idempotency_key`` names a job made from
                another request (409).
            OverloadedError: ``queue_full`` (503 + Retry-After): ``owner`` has
                ``jobs_max_queued`` jobs queued, or every owner together
                ``jobs_max_queued_total``.
        """
        job_id = new_job_id()
        idem = f"facefuse:idem:{owner}:{idempotency_key}" if idempotency_key else _P + job_id
        now = time.time()
        fields = [str(x) for x in (
            "owner", owner, "kind", kind, "state", "queued", "created", repr(now),
            "options", json.dumps(dict(options)), "attempts", 0,
            "frames_total", frames_total, "files", ",".join(files), "digest", digest)]
        names = list(files)
        s = self.settings
        status, got = self._create(
            keys=[_P + job_id, _QUEUED, idem, _OWNER_QUEUED + owner,
                  *(f"{_P}{job_id}:in:{n}" for n in names)],
            args=[s.jobs_max_queued, s.jobs_max_queued_total, now, self.ttl,
                  json.dumps(fields), job_id, _P, digest, *(files[n] for n in names)])
        if int(status) == 0:
            return bytes(got).decode(), False
        if int(status) == -3:
            raise IdempotencyConflictError(
                f"the Idempotency-Key {idempotency_key!r} was used for another request "
                f"(job {bytes(got).decode()}); use a new key for a new request")
        if int(status) == -1:
            raise OverloadedError(
                f"this key has {s.jobs_max_queued} jobs waiting, its most; retry later",
                code="queue_full")
        if int(status) < 0:
            raise OverloadedError(
                f"the job queue is full ({s.jobs_max_queued_total} waiting); retry later",
                code="queue_full")
        return job_id, True

    def get(self, job_id: str, owner: str | None = None) -> JobRecord:
        """The job ``job_id`` (of ``owner``, when given).

        Raises:
            JobNotFoundError: no such job, another owner's, or expired.
        """
        h = self.r.hgetall(_P + job_id) if _valid_id(job_id) else {}
        if not h:
            raise JobNotFoundError(f"no job {job_id[:40]!r}")
        job = JobRecord.from_hash(job_id, h)
        if owner is not None and job.owner != owner:
            raise JobNotFoundError(f"no job {job_id[:40]!r}")
        return job

    def result(self, job_id: str) -> bytes | None:
        data = self.r.get(f"{_P}{job_id}:result")
        return bytes(data) if data is not None else None

    def cancel(self, job_id: str) -> bool:
        """Cancel a queued or running job (a running one stops at its next frame);
        False when it had already ended."""
        self.r.set(f"{_P}{job_id}:cancel", b"1", ex=self.ttl)
        done = bool(self._end(keys=[_P + job_id, _QUEUED],
                              args=["cancelled", time.time(), "cancelled",
                                    "cancelled by the client", job_id, _OWNER_QUEUED]))
        if done:
            self._drop_files(job_id, self._files(job_id))
        return done

    def delete(self, job_id: str) -> None:
        """Forget an ended job and its result."""
        self.r.delete(_P + job_id, f"{_P}{job_id}:result", f"{_P}{job_id}:cancel")

    def queue_stats(self) -> tuple[int, float]:
        """(jobs queued, age of the oldest in seconds); ids whose records expired are
        dropped first."""
        self.r.zremrangebyscore(_QUEUED, "-inf", time.time() - self.ttl)
        n = int(self.r.zcard(_QUEUED))
        oldest = self.r.zrange(_QUEUED, 0, 0, withscores=True)
        age = time.time() - float(oldest[0][1]) if oldest else 0.0
        return n, max(0.0, age)

    # ---- the worker side -----------------------------------------------------------------

    def claim(self, job_id: str, worker: str) -> int | None:
        """Start an attempt: the attempt number, or None when the job is gone or over."""
        n = self._claim(keys=[_P + job_id, _QUEUED],
                        args=[time.time(), worker, job_id, _OWNER_QUEUED])
        return int(n) if n is not None else None

    def files(self, job_id: str) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for name in self._files(job_id):
            data = self.r.get(f"{_P}{job_id}:in:{name}")
            if data is not None:
                out[name] = bytes(data)
        return out

    def progress(self, job_id: str, done: int, total: int, fps: float) -> None:
        self.r.hset(_P + job_id, mapping={"frames_done": done, "frames_total": total,
                                          "fps": round(fps, 3)})

    def cancel_requested(self, job_id: str) -> bool:
        return bool(self.r.exists(f"{_P}{job_id}:cancel"))

    def finish(self, job_id: str, data: bytes, content_type: str,
               report: Mapping[str, Any]) -> bool:
        """Store the result; True when this attempt's is the one (exactly one)."""
        self.r.hset(_P + job_id, "result_type", content_type)
        frames = report.get("frames")
        won = bool(self._finish(keys=[_P + job_id, f"{_P}{job_id}:result"],
                                args=[data, self.ttl, time.time(), json.dumps(dict(report)),
                                      "" if frames is None else int(frames)]))
        if won:
            self._drop_files(job_id, self._files(job_id))
        return won

    def fail(self, job_id: str, code: str, message: str) -> bool:
        done = bool(self._end(keys=[_P + job_id, _QUEUED],
                              args=["failed", time.time(), code, message[:500], job_id,
                                    _OWNER_QUEUED]))
        if done:
            self._drop_files(job_id, self._files(job_id))
        return done

    def requeue(self, job_id: str) -> bool:
        """Back to queued (a worker shutting down hands its job on); atomic, and only
        from ``running``: False when the job had ended meanwhile."""
        return bool(self._requeue(keys=[_P + job_id, _QUEUED],
                                  args=[time.time(), job_id, _OWNER_QUEUED]))

    # ---- helpers ---------------------------------------------------------------------------

    def _files(self, job_id: str) -> list[str]:
        raw = self.r.hget(_P + job_id, "files")
        return [n for n in (raw or b"").decode().split(",") if n]

    def _drop_files(self, job_id: str, names: Any) -> None:
        keys = [f"{_P}{job_id}:in:{n}" for n in names]
        if keys:
            self.r.delete(*keys)


def _valid_id(job_id: str) -> bool:
    return 0 < len(job_id) <= 64 and all(c.isalnum() or c in "-_" for c in job_id)


#: The job options that are :class:`FuseOptions` fields.
_FUSE_FIELDS = frozenset(f for f in FuseOptions.__dataclass_fields__)


def job_options(raw: Mapping[str, Any], kind: str
                ) -> tuple[VideoOptions, list[dict[str, Any]] | None, str, int]:
    """A job's stored options (validated by the API) → (video options, mapping,
    output format, quality). Raises the typed errors of the option classes."""
    fuse = FuseOptions(**{k: v for k, v in raw.items() if k in _FUSE_FIELDS - {"evaluate"}},
                       evaluate=False)
    video = VideoOptions(fuse=fuse, **{f.name: raw[f.name] for f, spec, _ in
                                       declared(VideoOptions) if spec.http and f.name in raw})
    fmt = str(raw.get("format", "jpeg")) if kind == "image" else str(
        raw.get("container") or "mp4")
    return video, raw.get("mapping"), fmt, int(raw.get("quality", 92))
