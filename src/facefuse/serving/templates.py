"""Template storage: an image registered once, with its analysis, fused by id.

A template is the uploaded image's bytes plus the analysis of its faces (boxes,
mesh, alignment, embeddings) computed once at upload, and a name and metadata.
Its id is content-addressed — the first 32 hex digits (128 bits) of the SHA-256
of the image bytes — so the same upload is stored once, and an id cannot be
guessed without the image itself. Records and their checks:
:mod:`facefuse.serving.template_records`.

Templates are user data, not cache. Two backends with one interface
(:class:`TemplateStore`), chosen by ``FACEFUSE_TEMPLATES_BACKEND``:

* ``file`` (default, needs nothing): one ``<id>.tpl`` record and one ``<id>.json``
  summary per template under ``templates_dir``, written atomically;
* ``redis`` (several replicas share one store): ``facefuse:tpl:v1:<id>`` records and
  a ``facefuse:tpl:v1:index`` hash of summaries, updated in one transaction, on a
  Redis of its own (``FACEFUSE_TEMPLATES_REDIS_URL``, never the L2 cache's): one
  that never evicts (``maxmemory-policy noeviction``) and persists (``appendonly
  yes``). :meth:`RedisTemplateStore.health` reads both settings from the server.

Both are bounded by count and by bytes (``templates_max_count``,
``templates_max_bytes``): a put past either bound is refused
(:class:`~facefuse.errors.TemplateStoreFullError`), nothing is evicted silently.

Loss is detected and logged, never silent: a record that fails its checks is moved
aside (quarantined: ``<templates_dir>/quarantine/``, ``facefuse:tpl:v1:quarantine:``)
and answered ``410 template_damaged``; a listed template whose record is gone, and a
Redis that lost the whole store (restarted without persistence, flushed), are logged
at error level and counted (``incidents``, ``facefuse_template_store_incidents_total``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from facefuse.config import Settings
from facefuse.errors import (
    CacheUnavailableError,
    InvalidArgumentError,
    TemplateDamagedError,
    TemplateNotFoundError,
    TemplateStoreFullError,
)
from facefuse.runtime.files import atomic_write_bytes
from facefuse.serving.template_records import (
    DamagedRecordError,
    Template,
    check_labels,
    record_sha256,
    unpack,
)

__all__ = [
    "FileTemplateStore",
    "RedisTemplateStore",
    "StoreHealth",
    "Template",
    "TemplateStore",
    "build_template_store",
    "template_id",
]

log = logging.getLogger("facefuse.templates")

#: Hex digits of the SHA-256 that make an id.
ID_HEX = 32
_ID_RE = re.compile(rf"^[0-9a-f]{{{ID_HEX}}}$")
#: Largest summary read back, bytes (name + 16 metadata pairs fit in ~10 KB).
MAX_SUMMARY_BYTES = 64 * 1024
#: Beyond the largest body, room for the face arrays of a record, bytes.
RECORD_OVERHEAD = 4 * 1024 * 1024


def template_id(image: bytes) -> str:
    """The content address of an uploaded image."""
    return hashlib.sha256(image).hexdigest()[:ID_HEX]


def check_id(template: str) -> str:
    """``template`` if it is well formed; else 404 (an id that cannot exist)."""
    if not _ID_RE.match(template):
        raise TemplateNotFoundError(f"no template {template[:40]!r}")
    return template


@dataclass(frozen=True)
class StoreHealth:
    """What /readyz and the metrics say about the store.

    Attributes:
        reachable: the backend answered.
        durable: it keeps what it acknowledged across evictions and restarts (None:
            could not tell).
        reason: why not durable (empty when durable).
    """

    reachable: bool
    durable: bool | None
    reason: str = ""


def _summary_problem(s: Any, template: str) -> str | None:
    if not isinstance(s, dict) or s.get("id") != template:
        return "its summary does not name it"
    if not (isinstance(s.get("bytes"), int) and isinstance(s.get("created"), int | float)
            and isinstance(s.get("faces"), int) and isinstance(s.get("sha256", ""), str)):
        return "its summary's fields are missing or mistyped"
    try:
        check_labels(s.get("name"), s.get("metadata"))
    except InvalidArgumentError as exc:
        return f"its summary's labels are unusable: {exc.message}"
    return None


class TemplateStore(Protocol):
    """Where templates live. Every method may raise
    :class:`~facefuse.errors.CacheUnavailableError` (code
    ``template_store_unavailable``) when the backend is down."""

    kind: str
    max_count: int
    max_bytes: int
    #: Losses seen by this process: ``lost`` (records gone), ``damaged`` (quarantined).
    incidents: dict[str, int]
    #: The last :meth:`health` answer (None before the first).
    last_health: StoreHealth | None

    async def put(self, template: Template) -> bool:
        """Store ``template``; False when that id was stored already (kept as is)."""
        ...

    async def get(self, template: str) -> Template:
        """The template with id ``template``; :class:`TemplateNotFoundError`, or
        :class:`TemplateDamagedError` (quarantined) for a record that fails its checks."""
        ...

    async def list(self) -> list[dict[str, Any]]:
        """Summaries of every template, newest first (damaged ones quarantined)."""
        ...

    async def delete(self, template: str) -> None:
        """Remove a template (:class:`TemplateNotFoundError` when there is none)."""
        ...

    async def health(self) -> StoreHealth:
        """Reachable and durable, checked now (also detects a wiped store)."""
        ...

    async def close(self) -> None: ...


def _check_room(summaries: list[dict[str, Any]], new_bytes: int, max_count: int,
                max_bytes: int, extra_bytes: int = 0) -> None:
    used = sum(int(s["bytes"]) for s in summaries) + extra_bytes
    if len(summaries) + 1 > max_count:
        raise TemplateStoreFullError(f"the template store holds its maximum of {max_count} "
                                     "templates; delete one first")
    if used + new_bytes > max_bytes:
        raise TemplateStoreFullError(f"the template store would exceed {max_bytes} bytes "
                                     f"({used} used, {new_bytes} more); delete one first")


def _public(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k != "sha256"}


def _newest_first(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((_public(s) for s in summaries),
                  key=lambda s: (-float(s["created"]), str(s["id"])))


def _damaged(template: str, reason: str, incidents: dict[str, int], *, lost: bool) -> None:
    kind = "lost" if lost else "damaged"
    incidents[kind] = incidents.get(kind, 0) + 1
    log.error("template %s %s: %s; set aside", template,
              "record lost" if lost else "record damaged", reason,
              extra={"fields": {"template": template, "incident": kind}})


def _read_file(path: Path, limit: int) -> bytes:
    """A regular file's bytes, not through a symbolic link, at most ``limit`` bytes.

    Raises:
        FileNotFoundError: there is none.
        DamagedRecordError: a link, not a regular file, or larger than ``limit``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise DamagedRecordError(f"cannot be opened as a plain file ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise DamagedRecordError("not a regular file")
        if st.st_size > limit:
            raise DamagedRecordError(f"{st.st_size} bytes, more than the {limit} a record may hold")
        return fh.read(limit + 1)


class FileTemplateStore:
    """Templates as files under one directory (one replica, or a shared volume).

    Args:
        root: the directory (created on first put).
        max_count, max_bytes: the store's bounds.
        max_record_bytes: the largest record read back (bounds the memory one read
            takes whatever is on disk).
        orphan_grace_s: a record without a summary older than this is a leftover of
            an interrupted put and is set aside (younger ones may be a put under way
            in another process); until then its bytes count against ``max_bytes``.
    """

    kind = "file"

    def __init__(self, root: Path, *, max_count: int, max_bytes: int,
                 max_record_bytes: int = 64 * 1024 * 1024, orphan_grace_s: float = 60.0
                 ) -> None:
        self.root = root
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.max_record_bytes = max_record_bytes
        self.orphan_grace_s = orphan_grace_s
        self.incidents: dict[str, int] = {}
        self.last_health: StoreHealth | None = None
        self._lock = asyncio.Lock()  # one put/delete at a time per process

    def _paths(self, template: str) -> tuple[Path, Path]:
        return self.root / f"{template}.tpl", self.root / f"{template}.json"

    def _quarantine(self, template: str, reason: str, *, lost: bool = False) -> None:
        """Move the template's files into ``quarantine/`` (never deleted: evidence)."""
        qdir = self.root / "quarantine"
        qdir.mkdir(exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S")
        moved = False
        for p in self._paths(template)[::-1]:  # the summary first: no longer listed
            try:
                os.replace(p, qdir / f"{p.name}.{stamp}")
                moved = True
            except FileNotFoundError:
                continue
        if moved:  # nothing moved: deleted meanwhile, not a loss
            _damaged(template, reason, self.incidents, lost=lost)

    def _summary(self, template: str) -> dict[str, Any] | str | None:
        """The verified summary of ``template``; None when there is none; the reason
        when it failed its checks (the template is quarantined now)."""
        record, summary = self._paths(template)
        try:
            s = json.loads(_read_file(summary, MAX_SUMMARY_BYTES))
        except FileNotFoundError:
            return None
        except (DamagedRecordError, ValueError) as exc:
            reason = f"summary unreadable: {exc}"
        else:
            if (problem := _summary_problem(s, template)) is None:
                if record.exists() or not summary.exists():  # not exists: deleted meanwhile
                    out: dict[str, Any] = s
                    return out
                self._quarantine(template, "listed, but its record file is gone", lost=True)
                return "lost"
            reason = problem
        self._quarantine(template, reason)
        return reason

    def _scan(self) -> tuple[list[dict[str, Any]], int]:
        """(verified summaries, bytes of young records without one)."""
        if not self.root.is_dir():
            return [], 0
        out = []
        for p in self.root.glob("*.json"):
            if _ID_RE.match(p.stem) and isinstance(s := self._summary(p.stem), dict):
                out.append(s)
        listed = {s["id"] for s in out}
        orphan_bytes = 0
        now = time.time()
        for p in self.root.glob("*.tpl"):
            if p.stem in listed:
                continue
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue
            if now - st.st_mtime > self.orphan_grace_s and not (self.root / f"{p.stem}.json"
                                                                 ).exists():
                self._quarantine(p.stem, "a record without a summary (an interrupted put)")
            else:
                orphan_bytes += st.st_size
        return out, orphan_bytes

    async def put(self, template: Template) -> bool:
        async with self._lock:
            return await asyncio.to_thread(self._put, template)

    def _put(self, template: Template) -> bool:
        record, summary = self._paths(template.id)
        summaries, orphan_bytes = self._scan()
        if any(s["id"] == template.id for s in summaries):
            return False
        _check_room(summaries, template.nbytes, self.max_count, self.max_bytes, orphan_bytes)
        data = template.pack()
        atomic_write_bytes(record, data)
        # Last: what makes it visible, with the hash that verifies the record.
        atomic_write_bytes(summary, json.dumps(template.summary(record_sha256(data))).encode())
        return True

    async def get(self, template: str) -> Template:
        return await asyncio.to_thread(self._get, check_id(template))

    def _get(self, template: str) -> Template:
        summary = self._summary(template)
        if summary is None:
            raise TemplateNotFoundError(f"no template {template!r}")
        if summary == "lost":
            raise TemplateDamagedError(f"template {template} was lost", code="template_lost")
        if isinstance(summary, str):
            raise TemplateDamagedError(f"template {template} was damaged and set aside")
        record, _ = self._paths(template)
        try:
            data = _read_file(record, self.max_record_bytes)
            t = unpack(data, max_bytes=self.max_record_bytes, sha256=summary.get("sha256"))
            if t.id != template:
                raise DamagedRecordError(f"the record holds template {t.id}")
        except FileNotFoundError:
            self._quarantine(template, "listed, but its record file is gone", lost=True)
            raise TemplateDamagedError(f"template {template} was lost",
                                       code="template_lost") from None
        except DamagedRecordError as exc:
            self._quarantine(template, str(exc))
            raise TemplateDamagedError(f"template {template} was damaged and set aside"
                                       ) from None
        return t

    async def list(self) -> list[dict[str, Any]]:
        summaries, _ = await asyncio.to_thread(self._scan)
        return _newest_first(summaries)

    async def delete(self, template: str) -> None:
        record, summary = self._paths(check_id(template))
        async with self._lock:
            if not summary.exists() and not summary.is_symlink():
                raise TemplateNotFoundError(f"no template {template!r}")
            summary.unlink(missing_ok=True)  # first: no longer listed
            record.unlink(missing_ok=True)

    async def health(self) -> StoreHealth:
        self.last_health = await asyncio.to_thread(self._health)
        return self.last_health

    def _health(self) -> StoreHealth:
        fstype = _fstype(self.root)
        if fstype in ("tmpfs", "ramfs"):
            return StoreHealth(True, False, f"{self.root} is on {fstype}: lost at restart")
        return StoreHealth(True, True)

    async def close(self) -> None:
        return None


def _fstype(path: Path) -> str:
    """The filesystem type of the mount holding ``path`` (or its nearest existing
    parent), from /proc/self/mountinfo; empty when unknown."""
    p = path.resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    best, kind = "", ""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = str(p) == mount or str(p).startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, right.split()[0]
    return kind


class RedisTemplateStore:
    """Templates in a Redis of their own, shared by every replica.

    A put runs in a WATCH/MULTI transaction on the index, so two replicas cannot
    both take the last free place; then (Redis 7.2+) ``WAITAOF`` waits until the
    write is on disk before it is acknowledged. A ``facefuse:tpl:v1:store`` key
    names the store: when it vanishes or changes under a running process, the store
    was wiped (a restart without persistence, a flush) and that is logged.

    Args:
        url: the template Redis (not the L2 cache's).
        max_count, max_bytes, max_record_bytes: as :class:`FileTemplateStore`.
        socket_timeout: connect and command timeout, seconds; a broken connection
            (Redis restarted) is reconnected and the command retried twice, with a
            short backoff, before the caller sees 503.
    """

    kind = "redis"
    PREFIX = "facefuse:tpl:v1:"
    INDEX = PREFIX + "index"
    STORE = PREFIX + "store"
    QUARANTINE = PREFIX + "quarantine:"

    def __init__(self, url: str, *, max_count: int, max_bytes: int,
                 max_record_bytes: int = 64 * 1024 * 1024, socket_timeout: float = 2.0
                 ) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        self.max_count = max_count
        self.max_bytes = max_bytes
        self.max_record_bytes = max_record_bytes
        self.incidents: dict[str, int] = {}
        self.last_health: StoreHealth | None = None
        self._store_id: Any = None
        self._redis = aioredis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
            retry_on_error=[RedisConnectionError, RedisTimeoutError])

    async def _call(self, fn: Any) -> Any:
        from redis.exceptions import RedisError, ResponseError

        try:
            return await fn()
        except ResponseError as exc:
            if str(exc).startswith("OOM"):
                raise TemplateStoreFullError(
                    "the template store's Redis is at its maxmemory; delete a template or "
                    "give it more memory") from None
            raise CacheUnavailableError(
                f"the template store (Redis) refused a command: {str(exc)[:80]}",
                code="template_store_unavailable") from None
        except RedisError as exc:
            raise CacheUnavailableError(
                f"the template store (Redis) is unavailable: {type(exc).__name__}",
                code="template_store_unavailable") from None

    async def put(self, template: Template) -> bool:
        from redis.exceptions import WatchError

        data = template.pack()
        summary = json.dumps(template.summary(record_sha256(data)))

        async def run() -> bool:
            async with self._redis.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        await pipe.watch(self.INDEX)
                        if await pipe.hexists(self.INDEX, template.id):
                            return False
                        index = await pipe.hvals(self.INDEX)
                        _check_room([json.loads(v) for v in index], template.nbytes,
                                    self.max_count, self.max_bytes)
                        pipe.multi()
                        pipe.set(self.PREFIX + template.id, data)
                        pipe.hset(self.INDEX, template.id, summary)
                        pipe.set(self.STORE, uuid.uuid4().hex, nx=True)
                        await pipe.execute()
                        return True
                    except WatchError:
                        continue

        created: bool = await self._call(run)
        if created:
            await self._wait_on_disk(template.id)
        return created

    async def _wait_on_disk(self, template: str) -> None:
        from redis.exceptions import RedisError, ResponseError

        try:
            local, _ = await self._redis.execute_command("WAITAOF", 1, 0, 2000)
        except ResponseError:
            return  # Redis < 7.2 or AOF off: health() reports what durability there is
        except RedisError as exc:
            log.warning("template %s stored, but WAITAOF failed: %s", template,
                        type(exc).__name__)
            return
        if int(local) < 1:
            log.warning("template %s stored, but not yet on disk after 2 s", template)

    async def _lost(self, template: str, reason: str) -> None:
        await self._call(lambda: self._redis.hdel(self.INDEX, template))
        _damaged(template, reason, self.incidents, lost=True)

    async def _quarantine(self, template: str, reason: str) -> None:
        async def run() -> None:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hget(self.INDEX, template)
                pipe.hdel(self.INDEX, template)
                pipe.get(self.PREFIX + template)
                pipe.delete(self.PREFIX + template)
                summary, _, record, _ = await pipe.execute()
            if record is not None or summary is not None:
                await self._redis.hset(self.QUARANTINE + template,
                                       mapping={"summary": summary or b"", "record": record
                                                or b"", "reason": reason})
        await self._call(run)
        _damaged(template, reason, self.incidents, lost=False)

    async def get(self, template: str) -> Template:
        check_id(template)

        async def read() -> tuple[Any, Any, Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hget(self.INDEX, template)
                pipe.strlen(self.PREFIX + template)
                pipe.exists(self.PREFIX + template)
                summary, size, exists = await pipe.execute()
            return summary, size, exists

        raw, size, exists = await self._call(read)
        if raw is None:
            raise TemplateNotFoundError(f"no template {template!r}")
        if not exists:
            await self._lost(template, "listed, but its record is gone from Redis")
            raise TemplateDamagedError(f"template {template} was lost", code="template_lost")
        try:
            summary = json.loads(raw)
            problem = _summary_problem(summary, template)
            if problem:
                raise DamagedRecordError(problem)
            if int(size) > self.max_record_bytes:  # checked before it is read
                raise DamagedRecordError(f"{size} bytes, more than the {self.max_record_bytes} "
                                    "a record may hold")
            data = await self._call(lambda: self._redis.get(self.PREFIX + template))
            if data is None:
                await self._lost(template, "listed, but its record is gone from Redis")
                raise TemplateDamagedError(f"template {template} was lost",
                                           code="template_lost")
            t = unpack(data, max_bytes=self.max_record_bytes, sha256=summary.get("sha256"))
            if t.id != template:
                raise DamagedRecordError(f"the record holds template {t.id}")
        except (DamagedRecordError, ValueError) as exc:
            await self._quarantine(template, str(exc))
            raise TemplateDamagedError(f"template {template} was damaged and set aside"
                                       ) from None
        return t

    async def list(self) -> list[dict[str, Any]]:
        async def read() -> tuple[dict[Any, Any], list[Any]]:
            index: dict[Any, Any] = await self._redis.hgetall(self.INDEX)
            async with self._redis.pipeline(transaction=False) as pipe:
                for k in index:
                    pipe.exists(self.PREFIX + k.decode())
                exists = await pipe.execute() if index else []
            return index, exists

        index, exists = await self._call(read)
        out = []
        for (k, v), there in zip(index.items(), exists, strict=True):
            template = k.decode(errors="replace")
            if not there:
                await self._lost(template, "listed, but its record is gone from Redis")
                continue
            try:
                summary = json.loads(v)
            except ValueError:
                summary = None
            problem = _summary_problem(summary, template)
            if problem:
                await self._quarantine(template, problem)
                continue
            out.append(summary)
        return _newest_first(out)

    async def delete(self, template: str) -> None:
        check_id(template)

        async def run() -> int:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hdel(self.INDEX, template)
                pipe.delete(self.PREFIX + template)
                removed, _ = await pipe.execute()
                return int(removed)

        if not await self._call(run):
            raise TemplateNotFoundError(f"no template {template!r}")

    async def health(self) -> StoreHealth:
        """Reachable; durable when the server never evicts and appends every write
        to its AOF; and whether the store was wiped since this process last looked."""
        from redis.exceptions import RedisError, ResponseError

        try:
            policy = (await self._redis.info("memory")).get("maxmemory_policy", "")
            aof = int((await self._redis.info("persistence")).get("aof_enabled", 0))
            current = await self._redis.get(self.STORE)
            if current is None:
                await self._redis.set(self.STORE, uuid.uuid4().hex, nx=True)
                current = await self._redis.get(self.STORE)
        except (RedisError, ResponseError) as exc:
            self.last_health = StoreHealth(False, None, f"unreachable: {type(exc).__name__}")
            return self.last_health
        if self._store_id is not None and current != self._store_id:
            self.incidents["lost"] = self.incidents.get("lost", 0) + 1
            log.error("the template store in Redis was wiped (restarted without "
                      "persistence, flushed or replaced): every template registered before "
                      "is gone", extra={"fields": {"incident": "store_wiped"}})
        self._store_id = current
        reasons = []
        if policy != "noeviction":
            reasons.append(f"maxmemory-policy is {policy or 'unknown'} (templates may be "
                           "evicted; set noeviction)")
        if not aof:
            reasons.append("appendonly is off (templates are lost at a restart; set "
                           "appendonly yes)")
        self.last_health = StoreHealth(True, not reasons, "; ".join(reasons))
        return self.last_health

    async def close(self) -> None:
        await self._redis.aclose()


def build_template_store(settings: Settings) -> TemplateStore:
    """The backend ``settings.templates_backend`` names."""
    bounds = {"max_count": settings.templates_max_count,
              "max_bytes": settings.templates_max_bytes,
              "max_record_bytes": settings.max_body_bytes + RECORD_OVERHEAD}
    if settings.templates_backend == "redis":
        if not settings.templates_redis_url:
            raise InvalidArgumentError("templates_backend=redis needs templates_redis_url")
        return RedisTemplateStore(settings.templates_redis_url, **bounds)
    return FileTemplateStore(settings.template_dir, **bounds)
