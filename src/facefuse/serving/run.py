"""Process start-up: uvicorn, worker processes, the C allocator.

``facefuse serve`` checks everything it can first (settings, keys, the model
manifest), then runs uvicorn. The :class:`~facefuse.config.Settings` travel to
every worker process inside uvicorn's config object (pickled with it), so the
workers build their app from the same validated settings; nothing is passed
through the environment except, with several workers, the metrics directory they
share (``PROMETHEUS_MULTIPROC_DIR``, see :mod:`facefuse.serving.metrics`).
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
import tempfile
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.supervisors import Multiprocess

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.runtime.manifest import Manifest
from facefuse.runtime.session import use_memory_pattern
from facefuse.serving.api_keys import ApiKeys
from facefuse.serving.app import create_app
from facefuse.serving.heap import ARENAS, TRIM_THRESHOLD
from facefuse.serving.http.protocol import GuardedHttpProtocol
from facefuse.serving.logs import configure_logging
from facefuse.serving.metrics import MULTIPROC_DIR_ENV

__all__ = ["limit_malloc_arenas", "pin_mmap_threshold", "pin_trim_threshold", "serve",
           "worker_app"]

#: The settings of this worker process (set by :class:`SettingsConfig` before uvicorn
#: builds the app in it).
_worker_settings: Settings | None = None


#: glibc's mallopt parameter numbers of M_ARENA_MAX, M_MMAP_THRESHOLD and M_TRIM_THRESHOLD.
M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
M_TRIM_THRESHOLD = -1

#: Allocations from this size up get their own mapping: decoded images of ~1.4 MP
#: and more, their float copies and full-frame maps. Measured in the server (one
#: run, 1 client, arena off): 128 KiB cost ~45 % more latency (every buffer a fresh
#: mapping, page faults and unmaps across threads), 1 MiB ~18 %, 4 MiB ~3 % for
#: ~7 MB less RSS than a fixed 32 MiB, which is where glibc's own threshold climbs.
MMAP_THRESHOLD = 4 * 1024 * 1024


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas, as ``MALLOC_ARENA_MAX=2`` would (unless that is set).

    Every thread that contends for the heap otherwise gets an arena of its own, and
    image buffers freed in one thread's arena are not reused by another: measured
    here, ~30 MB less peak RSS under load for the same throughput. Call before the
    pools start. Returns True when applied.
    """
    return _mallopt(M_ARENA_MAX, arenas, unless="MALLOC_ARENA_MAX")


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation of ``nbytes`` or more with its own ``mmap``, as
    ``MALLOC_MMAP_THRESHOLD_`` would (unless that is set).

    glibc otherwise raises its threshold each time a large block is freed, up to
    32 MB, after which even full decoded images come from the heap and stay in the
    process's RSS after they are freed, however large the uploads were. Pinned,
    the large ones go back to the system on ``free``. Returns True when applied.
    """
    return _mallopt(M_MMAP_THRESHOLD, nbytes, unless="MALLOC_MMAP_THRESHOLD_")


def pin_trim_threshold(nbytes: int = TRIM_THRESHOLD) -> bool:
    """Keep up to ``nbytes`` of free memory at the top of each heap instead of giving
    it back at once, as ``MALLOC_TRIM_THRESHOLD_`` would (unless that is set): see
    :data:`TRIM_THRESHOLD`. Returns True when applied."""
    return _mallopt(M_TRIM_THRESHOLD, nbytes, unless="MALLOC_TRIM_THRESHOLD_")


def _mallopt(param: int, value: int, *, unless: str) -> bool:
    """glibc's ``mallopt(param, value)`` unless the environment variable ``unless``
    (glibc's own knob for it) is set or this is not Linux/glibc."""
    if unless in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(param, value))
    except (OSError, AttributeError):
        return False


#: Seconds an idle keep-alive connection stays open (uvicorn's default is 5).
KEEP_ALIVE_S = 75


def worker_app() -> FastAPI:
    """The uvicorn factory run in each worker: JSON logs, capped malloc arenas, the app."""
    settings = _worker_settings if _worker_settings is not None else Settings.from_env()
    configure_logging(settings.log_level)
    limit_malloc_arenas()
    pinned = pin_mmap_threshold() or "MALLOC_MMAP_THRESHOLD_" in os.environ
    pin_trim_threshold()
    use_memory_pattern(pinned)  # pays under a pinned threshold only (see there)
    return create_app(settings)


class SettingsConfig(uvicorn.Config):
    """A uvicorn config that carries the facefuse :class:`Settings` to the workers."""

    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        super().__init__("facefuse.serving.run:worker_app", factory=True, **kwargs)
        self.facefuse_settings = settings

    def load(self) -> None:
        global _worker_settings
        _worker_settings = self.facefuse_settings
        super().load()


def serve(settings: Settings, host: str = "127.0.0.1", port: int = 8000,
          workers: int = 1) -> int:
    """Run the server under uvicorn until SIGINT/SIGTERM (``facefuse serve``).

    The API keys are parsed and the model manifest is opened first, so a malformed
    key or a missing model zoo fails here with its typed error instead of in every
    worker.
    """
    if workers < 1:
        raise InvalidArgumentError("--workers must be >= 1")
    configure_logging(settings.log_level)
    ApiKeys.from_settings(settings)
    Manifest.load(settings.model_dir)
    config = SettingsConfig(
        settings, host=host, port=port, workers=workers, log_config=None, access_log=False,
        server_header=False, timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
        lifespan="on", http=GuardedHttpProtocol,
        # Idle keep-alive connections close after this (below nginx's upstream
        # keepalive_timeout would race; see docs/operations.md, limits and budgets).
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    if workers > 1:
        # Each worker writes its counters, histograms and live gauges to files in
        # one directory; any worker's /metrics answers with their sums.
        with tempfile.TemporaryDirectory(prefix="facefuse-metrics-") as shared:
            os.environ[MULTIPROC_DIR_ENV] = shared
            try:
                Multiprocess(config, sockets=[config.bind_socket()]).run()
            finally:
                os.environ.pop(MULTIPROC_DIR_ENV, None)
        return 0
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else 3
