"""Metrics: names, labels and values as Prometheus parses them from render()."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from facefuse.serving.batching import MicroBatcher
from facefuse.serving.cache.lru import ByteLRU
from facefuse.serving.cache.results import CachedResult, InProcessResultCache
from facefuse.serving.metrics import Metrics, read_process_memory


def samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of render() as {(name, labels): value}."""
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return samples(metrics)[(name, frozenset(labels.items()))]


def test_two_instances_do_not_collide() -> None:
    a, b = Metrics(), Metrics()
    a.observe_request("/v1/fuse", "post", 200, 0.01)
    assert (
        value(a, "facefuse_http_requests_total", route="/v1/fuse", method="POST", status="200") == 1
    )
    assert (
        "facefuse_http_requests_total",
        frozenset({("route", "/v1/fuse"), ("method", "POST"), ("status", "200")}),
    ) not in samples(b)


def test_requests_and_latency_by_route_method_status() -> None:
    m = Metrics()
    m.observe_request("/v1/fuse", "POST", 200, 0.02)
    m.observe_request("/v1/fuse", "POST", 200, 0.2)
    m.observe_request("/v1/fuse", "POST", 413, 0.001)
    labels = {"route": "/v1/fuse", "method": "POST", "status": "200"}
    assert value(m, "facefuse_http_requests_total", **labels) == 2
    assert value(m, "facefuse_http_requests_total", **{**labels, "status": "413"}) == 1
    assert value(m, "facefuse_http_request_duration_seconds_count", **labels) == 2
    assert value(m, "facefuse_http_request_duration_seconds_sum", **labels) == pytest.approx(0.22)
    assert value(m, "facefuse_http_request_duration_seconds_bucket", **labels, le="0.025") == 1


def test_stage_histogram_accepts_only_known_stages() -> None:
    m = Metrics()
    for stage in ("decode", "detect", "mesh", "embed", "fuse", "encode"):
        m.observe_stage(stage, 0.003)
    assert value(m, "facefuse_stage_duration_seconds_count", stage="mesh") == 1
    with pytest.raises(ValueError, match="unknown stage"):
        m.observe_stage("warp", 0.1)


def test_queue_depth_total_sums_models() -> None:
    m = Metrics()
    m.set_queue_depth("recognizer", 5)
    m.set_queue_depth("mesh", 3)
    m.set_queue_depth("recognizer", 2)
    assert value(m, "facefuse_queue_depth") == 5
    assert value(m, "facefuse_queue_depth_per_model", model="recognizer") == 2
    assert value(m, "facefuse_queue_depth_per_model", model="mesh") == 3


@pytest.mark.anyio
async def test_batcher_reports_batch_sizes_and_queue_waits() -> None:
    m = Metrics()
    with ThreadPoolExecutor(1) as pool:
        b = MicroBatcher("recognizer", lambda x: x + 1, executor=pool, max_batch_size=4, metrics=m)
        await asyncio.gather(*(b.submit(np.full(3, i, np.float32)) for i in range(10)))
        await b.drain(10)
    assert value(m, "facefuse_batch_size_sum", model="recognizer") == 10
    batches = value(m, "facefuse_batch_size_count", model="recognizer")
    assert batches == b.batches_run
    assert batches < 10  # average batch size > 1
    assert value(m, "facefuse_queue_wait_seconds_count", model="recognizer") == 10
    assert value(m, "facefuse_queue_depth") == 0


@pytest.mark.anyio
async def test_cache_counters_evictions_and_hit_ratio_per_level() -> None:
    m = Metrics()
    l1: ByteLRU[str, bytes] = ByteLRU(100, len)
    l2 = InProcessResultCache(10_000)
    m.register_cache("l1", l1)
    m.register_cache("l2", l2)
    m.register_cache("l2", l2)  # idempotent
    l1.put("a", b"x" * 60)
    l1.put("b", b"x" * 60)  # evicts a
    assert l1.get("a") is None
    assert l1.get("b") is not None
    assert l1.get("b") is not None
    await l2.put("k", CachedResult(b"png", "image/png"))
    assert await l2.get("k") is not None
    assert await l2.get("other") is None

    assert value(m, "facefuse_cache_requests_total", level="l1", result="hit") == 2
    assert value(m, "facefuse_cache_requests_total", level="l1", result="miss") == 1
    assert value(m, "facefuse_cache_evictions_total", level="l1") == 1
    assert value(m, "facefuse_cache_hit_ratio", level="l1") == pytest.approx(2 / 3)
    assert value(m, "facefuse_cache_bytes", level="l1") == 60
    assert value(m, "facefuse_cache_requests_total", level="l2", result="hit") == 1
    assert value(m, "facefuse_cache_hit_ratio", level="l2") == pytest.approx(0.5)
    assert value(m, "facefuse_cache_healthy", level="l2") == 1
    m.unregister_cache("l2", l2)
    assert value(m, "facefuse_cache_requests_total", level="l2", result="hit") == 0


def test_process_memory_is_read_at_scrape_time(tmp_path: Path) -> None:
    real = read_process_memory()
    assert real["rss"] > 10 * 1024 * 1024  # a Python process with numpy loaded
    assert real["peak_rss"] >= real["rss"]

    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n")
    m = Metrics(proc_status_path=status)
    assert value(m, "facefuse_process_resident_memory_bytes") == 1024 * 1024
    assert value(m, "facefuse_process_peak_resident_memory_bytes") == 2048 * 1024
    status.write_text("VmHWM:\t4096 kB\nVmRSS:\t3000 kB\n")
    assert value(m, "facefuse_process_peak_resident_memory_bytes") == 4096 * 1024


@dataclass(frozen=True)
class Info:
    name: str
    version: str
    precision: str
    provider: str


def test_model_info_is_replaced_on_reload() -> None:
    m = Metrics()
    m.set_models([Info("recognizer", "1.0", "fp32", "CPUExecutionProvider")])
    m.set_models(
        [
            Info("recognizer", "1.1", "int8", "CPUExecutionProvider"),
            Info("mesh", "0.6.0", "fp32", "CPUExecutionProvider"),
        ]
    )
    info = {k: v for k, v in samples(m).items() if k[0] == "facefuse_model_info"}
    assert len(info) == 2
    assert (
        info[
            (
                "facefuse_model_info",
                frozenset(
                    {
                        ("name", "recognizer"),
                        ("version", "1.1"),
                        ("precision", "int8"),
                        ("provider", "CPUExecutionProvider"),
                    }
                ),
            )
        ]
        == 1
    )
