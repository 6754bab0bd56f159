"""Several worker processes behind one port: /metrics counts all of them."""

from __future__ import annotations

from pathlib import Path

import httpx
from server_harness import ServerProcess, metric_values, running

from facefuse.config import Settings

REQUESTS = 24
SCRAPES = 8


def test_metrics_are_the_sum_over_workers(
    settings: Settings, model_dir: Path, tmp_path: Path
) -> None:
    """Each request on a new connection (the kernel hands connections to either
    worker); every scrape, whichever worker answers it, counts all of them."""
    server = ServerProcess(settings.home, tmp_path, name="workers", args=("--workers", "2"))
    with running(server):
        for _ in range(REQUESTS):
            assert httpx.get(server.url + "/healthz", timeout=30).status_code == 200
        counts = []
        for _ in range(SCRAPES):
            text = httpx.get(server.url + "/metrics", timeout=30).text
            values = metric_values(text, "facefuse_http_requests_total")
            counts.append(sum(v for k, v in values.items()
                              if 'route="/healthz"' in k and 'status="200"' in k))
            # Live sums over the workers, not one series per worker.
            assert metric_values(text, "facefuse_queue_depth") == {"": 0.0}
            assert metric_values(text, "facefuse_http_requests_in_flight") == {"": 0.0}
            assert metric_values(text, "facefuse_pipeline_requests") == {"": 0.0}
    assert counts == [float(REQUESTS)] * SCRAPES
