"""Prometheus metrics of the service, on a registry of their own.

Each :class:`Metrics` owns a fresh :class:`~prometheus_client.CollectorRegistry`
(never the global one), so several apps in one test process do not collide.
``GET /metrics`` answers with :meth:`Metrics.render`.

Exported series (names operators already know from Triton / Ray Serve):

* ``facefuse_http_requests_total{route,method,status}`` — requests answered
* ``facefuse_http_request_duration_seconds{route,method,status}`` — latency histogram
* ``facefuse_http_requests_in_flight`` — ``/v1/*`` requests accepted and not yet
  answered (downloads and job submissions too), all workers
* ``facefuse_pipeline_requests`` — requests holding or waiting for one of the
  ``max_active`` pipeline slots (what costs CPU), all workers: the HPA signal
* ``facefuse_stage_duration_seconds{stage}`` — decode, detect, mesh, embed, fuse, encode
* ``facefuse_batch_size{model}`` — items per model call (histogram)
* ``facefuse_queue_wait_seconds{model}`` — submit -> batch start, per item
* ``facefuse_queue_depth_per_model{model}`` — items queued now, per model
* ``facefuse_queue_depth`` — items queued now, all models
* ``facefuse_cache_requests_total{level,result}`` — level l1|l2, result hit|miss
* ``facefuse_cache_evictions_total{level}`` — LRU evictions (l2 in Redis: 0, Redis evicts)
* ``facefuse_cache_hit_ratio{level}`` — hits / lookups since start
* ``facefuse_cache_bytes{level}`` — bytes held (in-process caches)
* ``facefuse_cache_healthy{level}`` — 1, or 0 while the L2 backend is down
* ``facefuse_template_store_durable`` — 1 when the template store keeps what it
  acknowledged (never evicts, persists), 0 when not, at its last health check
* ``facefuse_template_store_incidents_total{kind}`` — templates ``lost`` (record gone,
  store wiped) or ``damaged`` (quarantined), seen by this process
* ``facefuse_live_sessions`` — live sessions open now, all workers: the live
  deployment's scaling signal
* ``facefuse_live_frames_total{kind}`` — live camera frames ``in`` (received), ``out``
  (fused and sent), ``dropped`` (never fused: a newer frame came first)
* ``facefuse_live_frame_latency_seconds`` — a live frame's time from received to
  its fused frame handed to the encoder
* ``facefuse_live_sessions_ended_total{reason}`` — ``deleted``, ``idle``,
  ``disconnected``, ``camera_ended``, ``shutdown``, ``failed``, ``closed``
* ``facefuse_process_resident_memory_bytes`` — VmRSS, read at scrape time
* ``facefuse_process_peak_resident_memory_bytes`` — VmHWM (peak RSS), read at scrape time
* ``facefuse_model_info{name,version,precision,provider}`` — 1 per model the stages
  run (``provider`` empty for one that loads on its first run, until the model
  watcher sees it loaded)

Label ``route`` must be the route *template* (``/v1/fuse``), never the raw path,
so a scanner cannot blow up the series count.

Several worker processes (``facefuse serve --workers N``) share one directory named
by ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode; ``serve``
sets it before the workers start): counters, histograms, the queue-depth, in-flight
and pipeline gauges of every worker are written there, and any worker's
``/metrics`` answers with their sums, whichever worker a scrape reaches. The values
read at scrape time (process memory, cache figures) are those of the worker that
answered.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from facefuse.serving.cache.lru import CacheStats

__all__ = [
    "BATCH_SIZE_BUCKETS",
    "LATENCY_BUCKETS",
    "LIVE_LATENCY_BUCKETS",
    "MULTIPROC_DIR_ENV",
    "QUEUE_WAIT_BUCKETS",
    "STAGES",
    "HasCacheStats",
    "Metrics",
    "ModelInfo",
    "read_process_memory",
]

#: prometheus_client's variable naming the directory worker processes share.
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: The stage label values of ``facefuse_stage_duration_seconds``.
STAGES = ("decode", "detect", "mesh", "embed", "fuse", "encode")

#: Request and stage latency buckets, seconds (1 ms .. 10 s).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: Why live sessions end (``facefuse_live_sessions_ended_total{reason}``).
LIVE_END_REASONS = ("deleted", "idle", "disconnected", "camera_ended", "shutdown", "failed",
                    "closed")
#: Live frame latency buckets, seconds (5 ms .. 2 s).
LIVE_LATENCY_BUCKETS = (
    0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
)  # fmt: skip
#: Items per batch (upper bounds; ``le="8"`` counts batches of 1..8).
BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
#: Queue wait buckets, seconds (0.1 ms .. 1 s).
QUEUE_WAIT_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


class HasCacheStats(Protocol):
    """Anything with a ``stats()`` snapshot: ByteLRU, InProcessResultCache, RedisResultCache."""

    def stats(self) -> CacheStats: ...


class HasTemplateHealth(Protocol):
    """What the metrics read of a template store."""

    @property
    def incidents(self) -> dict[str, int]: ...

    @property
    def last_health(self) -> Any: ...


class ModelInfo(Protocol):
    """What ``facefuse_model_info`` shows of one model (any object with these fields)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def provider(self) -> str: ...


def read_process_memory(status_path: Path = Path("/proc/self/status")) -> dict[str, int]:
    """``{"rss": bytes, "peak_rss": bytes}`` from VmRSS / VmHWM; empty off Linux."""
    try:
        text = status_path.read_text()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        field, _, rest = line.partition(":")
        if field in ("VmRSS", "VmHWM"):
            parts = rest.split()
            if parts and parts[0].isdigit():
                unit = parts[1].lower() if len(parts) > 1 else "kb"
                scale = 1024 if unit == "kb" else 1
                out["rss" if field == "VmRSS" else "peak_rss"] = int(parts[0]) * scale
    return out


class _ScrapeCollector(Collector):
    """Values read when Prometheus scrapes: process memory and cache counters."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        mem = read_process_memory(self._metrics.proc_status_path)
        if "rss" in mem:
            yield GaugeMetricFamily(
                "facefuse_process_resident_memory_bytes",
                "Resident set size of this server process (VmRSS), bytes.",
                value=mem["rss"],
            )
        if "peak_rss" in mem:
            yield GaugeMetricFamily(
                "facefuse_process_peak_resident_memory_bytes",
                "Peak resident set size of this server process (VmHWM), bytes.",
                value=mem["peak_rss"],
            )
        requests = CounterMetricFamily(
            "facefuse_cache_requests",
            "Cache lookups by level (l1 analysis, l2 results) and result (hit, miss).",
            labels=["level", "result"],
        )
        evictions = CounterMetricFamily(
            "facefuse_cache_evictions",
            "Entries evicted to stay under the byte bound, by level.",
            labels=["level"],
        )
        ratio = GaugeMetricFamily(
            "facefuse_cache_hit_ratio",
            "Hits / lookups since the process started, by level.",
            labels=["level"],
        )
        size = GaugeMetricFamily(
            "facefuse_cache_bytes", "Bytes held by in-process caches, by level.", labels=["level"]
        )
        healthy = GaugeMetricFamily(
            "facefuse_cache_healthy",
            "1 when the cache backend is reachable, 0 while degraded.",
            labels=["level"],
        )
        for level, caches in self._metrics.caches().items():
            hits = misses = evicted = held = 0
            ok = 1
            for cache in caches:
                s = cache.stats()
                hits += s.hits
                misses += s.misses
                evicted += s.evictions
                held += s.bytes
                if getattr(cache, "healthy", True) is False:
                    ok = 0
            requests.add_metric([level, "hit"], hits)
            requests.add_metric([level, "miss"], misses)
            evictions.add_metric([level], evicted)
            ratio.add_metric([level], hits / (hits + misses) if hits + misses else 0.0)
            size.add_metric([level], held)
            healthy.add_metric([level], ok)
        yield from (requests, evictions, ratio, size, healthy)
        store = self._metrics.templates
        if store is not None:
            health = store.last_health
            if health is not None and health.durable is not None:
                yield GaugeMetricFamily(
                    "facefuse_template_store_durable",
                    "1 when the template store never evicts and persists, else 0.",
                    value=1 if health.durable else 0)
            incidents = CounterMetricFamily(
                "facefuse_template_store_incidents",
                "Templates lost (record gone, store wiped) or damaged (quarantined).",
                labels=["kind"])
            for kind in ("lost", "damaged"):
                incidents.add_metric([kind], store.incidents.get(kind, 0))
            yield incidents


class Metrics:
    """Every metric of one server, on its own registry.

    Implements :class:`facefuse.serving.batching.BatchObserver`, so it can be passed
    as ``metrics=`` to every :class:`~facefuse.serving.batching.MicroBatcher`.

    Args:
        proc_status_path: where VmRSS/VmHWM are read (tests point it elsewhere).
    """

    def __init__(self, *, proc_status_path: Path = Path("/proc/self/status")) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.proc_status_path = proc_status_path
        r = self.registry
        self.http_requests = Counter(
            "facefuse_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self.http_duration = Histogram(
            "facefuse_http_request_duration_seconds",
            "HTTP request latency from first byte in to last byte out, seconds.",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = self._live_sum(
            "facefuse_http_requests_in_flight",
            "/v1/* requests accepted and not yet answered.")
        self.pipeline_requests = self._live_sum(
            "facefuse_pipeline_requests",
            "Requests holding or waiting for a pipeline slot (max_active): scale out on this.")
        self.stage_duration = Histogram(
            "facefuse_stage_duration_seconds",
            "Time spent per pipeline stage (decode, detect, mesh, embed, fuse, encode).",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "facefuse_batch_size",
            "Items per batched model call.",
            ["model"],
            buckets=BATCH_SIZE_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "facefuse_queue_wait_seconds",
            "Time an item waited in a batcher queue before its batch started, seconds.",
            ["model"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=r,
        )
        self.queue_depth_per_model = self._live_sum(
            "facefuse_queue_depth_per_model",
            "Items queued (not yet started) per model.", ["model"])
        self.queue_depth = self._live_sum(
            "facefuse_queue_depth", "Items queued (not yet started) over all models.")
        self.model_info = Gauge(
            "facefuse_model_info",
            "Loaded models (value 1): name, version, precision, provider.",
            ["name", "version", "precision", "provider"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.live_sessions = self._live_sum(
            "facefuse_live_sessions", "Live sessions open now: scale the live deployment on this.")
        self.live_frames = Counter(
            "facefuse_live_frames",
            "Live camera frames: in (received), out (fused, sent), dropped (a newer came first).",
            ["kind"], registry=r)
        self.live_latency = Histogram(
            "facefuse_live_frame_latency_seconds",
            "Live frame received -> its fused frame handed to the encoder, seconds.",
            buckets=LIVE_LATENCY_BUCKETS, registry=r)
        self.live_ended = Counter(
            "facefuse_live_sessions_ended", "Live sessions ended, by reason.", ["reason"],
            registry=r)
        for kind in ("in", "out", "dropped"):  # every series there from the start, at 0
            self.live_frames.labels(kind)
        for reason in LIVE_END_REASONS:
            self.live_ended.labels(reason)
        self._depths: dict[str, int] = {}
        #: The template store whose health and incidents are exported (None: none).
        self.templates: HasTemplateHealth | None = None
        self._caches: dict[str, list[HasCacheStats]] = {}
        self._lock = threading.Lock()
        self._scrape = _ScrapeCollector(self)
        r.register(self._scrape)
        #: The directory shared with the other worker processes (None: one process).
        self.multiprocess_dir = os.environ.get(MULTIPROC_DIR_ENV) or None

    # --- HTTP and stages -----------------------------------------------------------

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One answered request; ``route`` is the template (e.g. ``/v1/fuse``)."""
        labels = (route, method.upper(), str(status))
        self.http_requests.labels(*labels).inc()
        self.http_duration.labels(*labels).observe(seconds)

    def observe_stage(self, stage: str, seconds: float) -> None:
        """Time spent in one pipeline stage (one of :data:`STAGES`)."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
        self.stage_duration.labels(stage).observe(seconds)

    # --- batchers (BatchObserver) ----------------------------------------------------

    def observe_batch_size(self, model: str, size: int) -> None:
        self.batch_size.labels(model).observe(size)

    def observe_queue_wait(self, model: str, seconds: float) -> None:
        self.queue_wait.labels(model).observe(seconds)

    def _live_sum(self, name: str, documentation: str, labels: Iterable[str] = ()) -> Gauge:
        """A gauge of this registry that ``--workers N`` sums over the live workers."""
        return Gauge(name, documentation, list(labels), registry=self.registry,
                     multiprocess_mode="livesum")

    def set_pipeline_requests(self, count: int) -> None:
        """Requests now holding or waiting for a pipeline slot (this worker's)."""
        self.pipeline_requests.set(count)

    def set_queue_depth(self, model: str, depth: int) -> None:
        with self._lock:
            self._depths[model] = depth
            total = sum(self._depths.values())
        self.queue_depth_per_model.labels(model).set(depth)
        self.queue_depth.set(total)

    # --- live sessions (facefuse.live's observer) -----------------------------------

    def observe_live_frame(self, kind: str, count: int = 1) -> None:
        """Live frames ``in``, ``out`` or ``dropped``."""
        self.live_frames.labels(kind).inc(count)

    def observe_live_latency(self, seconds: float) -> None:
        self.live_latency.observe(seconds)

    def set_live_sessions(self, count: int) -> None:
        self.live_sessions.set(count)

    def observe_live_ended(self, reason: str) -> None:
        self.live_ended.labels(reason).inc()

    # --- caches and models -----------------------------------------------------------

    def register_cache(self, level: str, cache: HasCacheStats) -> None:
        """Report ``cache.stats()`` under ``level`` (``l1`` or ``l2``) at every scrape.

        Several caches on one level are summed; re-registering the same object is a
        no-op. Use :meth:`unregister_cache` when a cache is replaced.
        """
        with self._lock:
            held = self._caches.setdefault(level, [])
            if not any(c is cache for c in held):
                held.append(cache)

    def unregister_cache(self, level: str, cache: HasCacheStats) -> None:
        with self._lock:
            self._caches[level] = [c for c in self._caches.get(level, []) if c is not cache]

    def caches(self) -> dict[str, list[HasCacheStats]]:
        """A snapshot of the registered caches by level."""
        with self._lock:
            return {level: list(cs) for level, cs in self._caches.items()}

    def set_models(self, models: Iterable[ModelInfo]) -> None:
        """Replace the ``facefuse_model_info`` series (call after every (re)load)."""
        rows = [(m.name, m.version, m.precision, m.provider) for m in models]
        with self._lock:
            self.model_info.clear()
            for row in rows:
                self.model_info.labels(*row).set(1)

    # --- exposition --------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its content type, for ``GET /metrics``: with
        worker processes, the sums over all of them (plus this worker's scrape-time
        values)."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        merged = CollectorRegistry(auto_describe=True)
        MultiProcessCollector(merged, path=self.multiprocess_dir)
        merged.register(self._scrape)
        return generate_latest(merged), CONTENT_TYPE_LATEST
