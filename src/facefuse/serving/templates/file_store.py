"""The ``file`` template backend: one ``<id>.tpl`` record and one ``<id>.json``
summary per template under ``templates_dir``, written atomically; damaged records
moved to ``quarantine/`` (see :mod:`~facefuse.serving.templates.store`)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

from facefuse.errors import (
    TemplateDamagedError,
    TemplateNotFoundError,
)
from facefuse.runtime.files import atomic_write_bytes
from facefuse.serving.templates.records import (
    DamagedRecordError,
    Template,
    record_sha256,
    unpack,
)
from facefuse.serving.templates.store import (
    MAX_SUMMARY_BYTES,
    StoreHealth,
    check_id,
    check_room,
    is_template_id,
    log_damaged,
    newest_first,
    summary_problem,
)

__all__ = ["FileTemplateStore"]

log = logging.getLogger("facefuse.templates")


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
            log_damaged(template, reason, self.incidents, lost=lost)

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
            if (problem := summary_problem(s, template)) is None:
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
            if is_template_id(p.stem) and isinstance(s := self._summary(p.stem), dict):
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
        check_room(summaries, template.nbytes, self.max_count, self.max_bytes, orphan_bytes)
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
        return newest_first(summaries)

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
