"""The ``redis`` template backend, shared by every replica (see
:mod:`~facefuse.serving.templates.store`)."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from facefuse.errors import (
    CacheUnavailableError,
    TemplateDamagedError,
    TemplateNotFoundError,
    TemplateStoreFullError,
)
from facefuse.serving.templates.records import (
    DamagedRecordError,
    Template,
    record_sha256,
    unpack,
)
from facefuse.serving.templates.store import (
    StoreHealth,
    check_id,
    check_room,
    log_damaged,
    newest_first,
    summary_problem,
)

__all__ = ["RedisTemplateStore"]

log = logging.getLogger("facefuse.templates")


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
                        check_room([json.loads(v) for v in index], template.nbytes,
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
        log_damaged(template, reason, self.incidents, lost=True)

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
        log_damaged(template, reason, self.incidents, lost=False)

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
            problem = summary_problem(summary, template)
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
            problem = summary_problem(summary, template)
            if problem:
                await self._quarantine(template, problem)
                continue
            out.append(summary)
        return newest_first(out)

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
