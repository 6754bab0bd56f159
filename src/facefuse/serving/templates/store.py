"""Template storage: an image registered once, with its analysis, fused by id.

A template is the uploaded image's bytes plus the analysis of its faces (boxes,
mesh, alignment, embeddings) computed once at upload, and a name and metadata.
Its id is content-addressed — the first 32 hex digits (128 bits) of the SHA-256
of the image bytes — so the same upload is stored once, and an id cannot be
guessed without the image itself. Records and their checks:
:mod:`~facefuse.serving.templates.records`.

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

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol

from facefuse.errors import InvalidArgumentError, TemplateNotFoundError, TemplateStoreFullError
from facefuse.serving.templates.records import Template, check_labels

__all__ = ["ID_HEX", "MAX_SUMMARY_BYTES", "RECORD_OVERHEAD", "StoreHealth", "TemplateStore",
           "check_id", "check_room", "is_template_id", "log_damaged", "newest_first",
           "public_summary", "summary_problem", "template_id"]

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


def is_template_id(text: str) -> bool:
    """Whether ``text`` has the form of a template id (:data:`ID_HEX` lower-case hex)."""
    return _ID_RE.match(text) is not None


def check_id(template: str) -> str:
    """``template`` if it is well formed; else 404 (an id that cannot exist)."""
    if not is_template_id(template):
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


def summary_problem(s: Any, template: str) -> str | None:
    """Why a stored summary of ``template`` is unusable; None when it is usable."""
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


def check_room(summaries: list[dict[str, Any]], new_bytes: int, max_count: int,
                max_bytes: int, extra_bytes: int = 0) -> None:
    """Refuse a put of ``new_bytes`` past the count or byte bound (507)."""
    used = sum(int(s["bytes"]) for s in summaries) + extra_bytes
    if len(summaries) + 1 > max_count:
        raise TemplateStoreFullError(f"the template store holds its maximum of {max_count} "
                                     "templates; delete one first")
    if used + new_bytes > max_bytes:
        raise TemplateStoreFullError(f"the template store would exceed {max_bytes} bytes "
                                     f"({used} used, {new_bytes} more); delete one first")


def public_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary as the API lists it (no record digest)."""
    return {k: v for k, v in summary.items() if k != "sha256"}


def newest_first(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Public summaries, newest first."""
    return sorted((public_summary(s) for s in summaries),
                  key=lambda s: (-float(s["created"]), str(s["id"])))


def log_damaged(template: str, reason: str, incidents: dict[str, int], *, lost: bool) -> None:
    """Count and log a record lost or set aside."""
    kind = "lost" if lost else "damaged"
    incidents[kind] = incidents.get(kind, 0) + 1
    log.error("template %s %s: %s; set aside", template,
              "record lost" if lost else "record damaged", reason,
              extra={"fields": {"template": template, "incident": kind}})
