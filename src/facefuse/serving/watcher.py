"""Model hot reload: on demand (admin route) and when the model directory changes.

The watcher polls, every ``Settings.reload_poll_s`` seconds, a fingerprint of the
model directory — ``(mtime_ns, size, inode)`` of ``manifest.json`` and of every
loaded model file. When it changes, :meth:`Pipeline.reload` builds the new sessions
beside the old ones (verifying each file's sha256) and swaps them in one step;
requests already running finish on the old sessions. A bad model on disk (missing,
corrupt, unloadable) is refused and logged; the old models keep serving, and the
next change of the directory is tried again. Writing a new model file and *then*
the manifest (atomically, as ``Manifest.save`` does) is the safe order.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

from prometheus_client import Counter

from facefuse.errors import FacefuseError
from facefuse.runtime.manifest import MANIFEST_NAME
from facefuse.serving.state import Services

__all__ = ["fingerprint", "reload_now", "watch_models"]

log = logging.getLogger("facefuse.serving.reload")

Fingerprint = tuple[tuple[str, int, int, int], ...]


def fingerprint(models_dir: Path, files: list[str]) -> Fingerprint:
    """Stat tuples of the manifest and ``files`` (missing files count as (-1, -1, -1))."""
    out = []
    for name in [MANIFEST_NAME, *sorted(set(files))]:
        try:
            st = os.stat(models_dir / name)
            out.append((name, st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((name, -1, -1, -1))
    return tuple(out)


def _reload_counter(svc: Services) -> Counter:
    counter: Counter | None = getattr(svc.metrics, "_facefuse_reloads", None)
    if counter is None:
        counter = Counter("facefuse_model_reloads", "Model reloads by trigger and result.",
                          ["trigger", "result"], registry=svc.metrics.registry)
        svc.metrics._facefuse_reloads = counter  # type: ignore[attr-defined]
    return counter


async def reload_now(svc: Services, *, trigger: str) -> list[str]:
    """Reload changed models; record the outcome. Raises the typed error on refusal."""
    pipeline = svc.require_pipeline()
    counter = _reload_counter(svc)
    try:
        changed = await pipeline.reload()
    except FacefuseError as exc:
        svc.last_reload.at, svc.last_reload.ok = time.time(), False
        svc.last_reload.error, svc.last_reload.changed = exc.code, []
        counter.labels(trigger, "refused").inc()
        log.error("model reload refused; the old models keep serving",
                  extra={"fields": {"trigger": trigger, "code": exc.code,
                                    "reason": exc.message}})
        raise
    svc.last_reload.at, svc.last_reload.ok = time.time(), True
    svc.last_reload.error, svc.last_reload.changed = None, changed
    counter.labels(trigger, "ok").inc()
    svc.metrics.set_models(svc.model_rows())
    if changed:
        log.info("models reloaded", extra={"fields": {"trigger": trigger, "changed": changed}})
    return changed


async def watch_models(svc: Services) -> None:
    """Poll the model directory forever (cancel to stop); reload on every change."""
    interval = svc.settings.reload_poll_s
    pipeline = svc.require_pipeline()
    models_dir = pipeline.registry.models_dir
    _reload_counter(svc)

    def current() -> Fingerprint:
        files = [s.file for s in pipeline.model_specs().values()]
        return fingerprint(models_dir, files)

    loop = asyncio.get_running_loop()
    seen = await loop.run_in_executor(None, current)
    loaded = set(pipeline.registry.loaded())
    while True:
        await asyncio.sleep(interval)
        if set(pipeline.registry.loaded()) != loaded:  # one loaded on its first run
            loaded = set(pipeline.registry.loaded())
            svc.metrics.set_models(svc.model_rows())
        now = await loop.run_in_executor(None, current)
        if now == seen:
            continue
        seen = now
        try:
            await reload_now(svc, trigger="watch")
        except FacefuseError:
            continue  # logged; retried when the directory changes again
        except Exception:
            log.exception("model reload failed unexpectedly; the old models keep serving")
            continue
        # The set of loaded files may have changed: watch the new set, unless the
        # manifest changed again while we reloaded (then the next poll reloads again).
        after = await loop.run_in_executor(None, current)
        if after[0] == now[0]:
            seen = after
