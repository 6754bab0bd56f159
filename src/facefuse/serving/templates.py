"""Template storage: an image registered once, with its analysis, fused by id.

A template is the uploaded image's bytes plus the analysis of its faces (boxes,
mesh, alignment, embeddings) computed once at upload, and a name and metadata.
Its id is content-addressed — the first 32 hex digits (128 bits) of the SHA-256
of the image bytes — so the same upload is stored once, and an id cannot be
guessed without the image itself.

Two backends with one interface (:class:`TemplateStore`), chosen by
``FACEFUSE_TEMPLATES_BACKEND``:

* ``file`` (default, needs nothing): one ``<id>.tpl`` record and one ``<id>.json``
  summary per template under ``templates_dir``, written atomically;
* ``redis`` (several replicas share one store): ``facefuse:tpl:v1:<id>`` records
  and a ``facefuse:tpl:v1:index`` hash of summaries, updated in one transaction.

Both are bounded by count and by bytes (``templates_max_count``,
``templates_max_bytes``): a put past either bound is refused
(:class:`~facefuse.errors.TemplateStoreFullError`), nothing is evicted silently.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError, TemplateNotFoundError, TemplateStoreFullError
from facefuse.faces.types import Face
from facefuse.runtime.files import atomic_write_bytes

__all__ = [
    "FileTemplateStore",
    "RedisTemplateStore",
    "Template",
    "TemplateStore",
    "build_template_store",
    "template_id",
]

#: Hex digits of the SHA-256 that make an id.
ID_HEX = 32
_ID_RE = re.compile(rf"^[0-9a-f]{{{ID_HEX}}}$")
_FACE_ARRAYS = ("bbox", "keypoints", "landmarks", "landmarks5", "chip_transform", "embedding",
                "embedding_raw")
_FACE_SCALARS = ("score", "mesh_score", "age", "gender", "gender_score")


def template_id(image: bytes) -> str:
    """The content address of an uploaded image."""
    return hashlib.sha256(image).hexdigest()[:ID_HEX]


def check_id(template: str) -> str:
    """``template`` if it is well formed; else 404 (an id that cannot exist)."""
    if not _ID_RE.match(template):
        raise TemplateNotFoundError(f"no template {template[:40]!r}")
    return template


@dataclass(frozen=True)
class Template:
    """A stored template.

    Attributes:
        id: content address (see :func:`template_id`).
        image: the uploaded image bytes, as sent.
        faces: its analysed faces, largest first, with embeddings.
        width, height: the decoded image's size in pixels.
        model_versions: the models that analysed it (name → sha256 prefix).
    """

    id: str
    name: str
    image: bytes
    faces: tuple[Face, ...]
    width: int
    height: int
    model_versions: dict[str, str]
    metadata: dict[str, str] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    def summary(self) -> dict[str, Any]:
        """What ``GET /v1/templates`` lists (no image, no face details)."""
        return {"id": self.id, "name": self.name, "metadata": self.metadata,
                "created": round(self.created, 3), "width": self.width, "height": self.height,
                "faces": len(self.faces), "bytes": self.nbytes}

    @property
    def nbytes(self) -> int:
        return len(self.image) + sum(
            int(a.nbytes) for f in self.faces for a in (getattr(f, n) for n in _FACE_ARRAYS)
            if a is not None)

    # --- serialisation (numpy .npz: no pickle) ----------------------------------------

    def pack(self) -> bytes:
        head = {k: v for k, v in self.summary().items() if k not in ("faces", "bytes")}
        head["created"] = self.created
        head["model_versions"] = self.model_versions
        head["faces"] = [{n: getattr(f, n) for n in _FACE_SCALARS} for f in self.faces]
        arrays: dict[str, np.ndarray] = {
            "head": np.frombuffer(json.dumps(head).encode(), np.uint8),
            "image": np.frombuffer(self.image, np.uint8)}
        for i, f in enumerate(self.faces):
            for n in _FACE_ARRAYS:
                a = getattr(f, n)
                if a is not None:
                    arrays[f"f{i}_{n}"] = a
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        return buf.getvalue()

    @classmethod
    def unpack(cls, data: bytes) -> Template:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            head = json.loads(z["head"].tobytes())
            faces = []
            for i, scalars in enumerate(head["faces"]):
                arrays: dict[str, Any] = {n: np.array(z[f"f{i}_{n}"]) for n in _FACE_ARRAYS
                                          if f"f{i}_{n}" in z.files}
                faces.append(Face(**arrays, **scalars))
            image = z["image"].tobytes()
        return cls(id=head["id"], name=head["name"], image=image, faces=tuple(faces),
                   width=head["width"], height=head["height"],
                   model_versions=head["model_versions"], metadata=head["metadata"],
                   created=head["created"])


class TemplateStore(Protocol):
    """Where templates live. Every method may raise
    :class:`~facefuse.errors.CacheUnavailableError` when the backend is down."""

    kind: str
    max_count: int
    max_bytes: int

    async def put(self, template: Template) -> bool:
        """Store ``template``; False when that id was stored already (kept as is)."""
        ...

    async def get(self, template: str) -> Template:
        """The template with id ``template``, or :class:`TemplateNotFoundError`."""
        ...

    async def list(self) -> list[dict[str, Any]]:
        """Summaries of every template, newest first."""
        ...

    async def delete(self, template: str) -> None:
        """Remove a template (:class:`TemplateNotFoundError` when there is none)."""
        ...

    async def close(self) -> None: ...


def _check_room(summaries: list[dict[str, Any]], new_bytes: int, max_count: int,
                max_bytes: int) -> None:
    used = sum(int(s["bytes"]) for s in summaries)
    if len(summaries) + 1 > max_count:
        raise TemplateStoreFullError(f"the template store holds its maximum of {max_count} "
                                     "templates; delete one first")
    if used + new_bytes > max_bytes:
        raise TemplateStoreFullError(f"the template store would exceed {max_bytes} bytes "
                                     f"({used} used, {new_bytes} more); delete one first")


def _newest_first(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(summaries, key=lambda s: (-float(s["created"]), str(s["id"])))


class FileTemplateStore:
    """Templates as files under one directory (one replica, or a shared volume)."""

    kind = "file"

    def __init__(self, root: Path, *, max_count: int, max_bytes: int) -> None:
        self.root = root
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._lock = asyncio.Lock()  # one put/delete at a time per process

    def _paths(self, template: str) -> tuple[Path, Path]:
        return self.root / f"{template}.tpl", self.root / f"{template}.json"

    def _summaries(self) -> list[dict[str, Any]]:
        out = []
        for p in self.root.glob("*.json"):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue  # removed meanwhile, or half-written by another tool
        return out

    async def put(self, template: Template) -> bool:
        async with self._lock:
            return await asyncio.to_thread(self._put, template)

    def _put(self, template: Template) -> bool:
        record, summary = self._paths(template.id)
        if summary.exists():
            return False
        _check_room(self._summaries(), template.nbytes, self.max_count, self.max_bytes)
        atomic_write_bytes(record, template.pack())
        atomic_write_bytes(summary, json.dumps(template.summary()).encode())  # last: visible
        return True

    async def get(self, template: str) -> Template:
        record, _ = self._paths(check_id(template))
        try:
            data = await asyncio.to_thread(record.read_bytes)
        except FileNotFoundError:
            raise TemplateNotFoundError(f"no template {template!r}") from None
        return Template.unpack(data)

    async def list(self) -> list[dict[str, Any]]:
        return _newest_first(await asyncio.to_thread(self._summaries))

    async def delete(self, template: str) -> None:
        record, summary = self._paths(check_id(template))
        async with self._lock:
            if not summary.exists():
                raise TemplateNotFoundError(f"no template {template!r}")
            summary.unlink(missing_ok=True)  # first: no longer listed
            record.unlink(missing_ok=True)

    async def close(self) -> None:
        return None


class RedisTemplateStore:
    """Templates in Redis, shared by every replica.

    A put runs in a WATCH/MULTI transaction on the index, so two replicas cannot
    both take the last free place.
    """

    kind = "redis"
    PREFIX = "facefuse:tpl:v1:"
    INDEX = PREFIX + "index"

    def __init__(self, url: str, *, max_count: int, max_bytes: int,
                 socket_timeout: float = 2.0) -> None:
        import redis.asyncio as aioredis

        self.max_count = max_count
        self.max_bytes = max_bytes
        self._redis = aioredis.from_url(url, socket_timeout=socket_timeout,
                                        socket_connect_timeout=socket_timeout)

    async def _call(self, fn: Any) -> Any:
        from redis.exceptions import RedisError

        from facefuse.errors import CacheUnavailableError

        try:
            return await fn()
        except RedisError as exc:
            raise CacheUnavailableError(
                f"the template store (Redis) is unavailable: {type(exc).__name__}",
                code="template_store_unavailable") from None

    async def put(self, template: Template) -> bool:
        from redis.exceptions import WatchError

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
                        pipe.set(self.PREFIX + template.id, template.pack())
                        pipe.hset(self.INDEX, template.id, json.dumps(template.summary()))
                        await pipe.execute()
                        return True
                    except WatchError:
                        continue

        result: bool = await self._call(run)
        return result

    async def get(self, template: str) -> Template:
        data = await self._call(lambda: self._redis.get(self.PREFIX + check_id(template)))
        if data is None:
            raise TemplateNotFoundError(f"no template {template!r}")
        return Template.unpack(data)

    async def list(self) -> list[dict[str, Any]]:
        values = await self._call(lambda: self._redis.hvals(self.INDEX))
        return _newest_first([json.loads(v) for v in values])

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

    async def close(self) -> None:
        await self._redis.aclose()


def build_template_store(settings: Settings) -> TemplateStore:
    """The backend ``settings.templates_backend`` names."""
    bounds = {"max_count": settings.templates_max_count,
              "max_bytes": settings.templates_max_bytes}
    if settings.templates_backend == "redis":
        if not settings.redis_url:
            raise InvalidArgumentError("templates_backend=redis needs redis_url")
        return RedisTemplateStore(settings.redis_url, **bounds)
    return FileTemplateStore(settings.template_dir, **bounds)
