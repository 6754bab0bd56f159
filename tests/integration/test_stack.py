"""The deployment topology, live on loopback: nginx → two replicas → one Redis cache
and one template-store Redis, and Prometheus scraping both, with the nginx config,
alert rules and dashboard shipped in deploy/.

One test walks through the stack's promises in order (starting five servers once is
most of the cost): load is spread over both replicas; a result computed by one is an
L2 hit on the other; a template registered through nginx is there on both replicas;
``kill -9`` of a replica under load loses no request and the
restarted replica takes traffic again; a SIGTERM rolling restart of both under load
loses no request; Prometheus scrapes both, and every expression of the alert rules
and of the Grafana dashboard returns data. Every process is stopped at the end, also
when an assertion fails.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from server_harness import ServerProcess, metric_values, photo_variants
from stack_harness import DASHBOARD, RULES, Nginx, Prometheus, binary

pytestmark = pytest.mark.slow

FUSE = '{method="POST",route="/v1/fuse",status="200"}'


def fuse_count(server: ServerProcess) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return metric_values(text, "facefuse_http_requests_total").get(FUSE, 0.0)


def fuse(client: httpx.Client, source: bytes, target: bytes,
         degree: int = 70) -> httpx.Response:
    return client.post("/v1/fuse", files={"source": ("s.jpg", source, "image/jpeg"),
                                          "target": ("t.jpg", target, "image/jpeg")},
                       data={"degree": str(degree)})


class Load:
    """``clients`` threads posting fuses through nginx until stopped; every status
    is recorded. Every request is new (photo pair × degree), so each is computed
    and keeps the replicas' model queues busy."""

    def __init__(self, url: str, pairs: list[tuple[bytes, bytes]], first_degree: int,
                 clients: int = 4) -> None:
        self.url, self.pairs, self.first_degree = url, pairs, first_degree
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]
        self._lock = threading.Lock()

    def _run(self, offset: int) -> None:
        i = offset
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self._stop.is_set():
                source, target = self.pairs[i % len(self.pairs)]
                degree = self.first_degree + (i // len(self.pairs)) % 20
                i += len(self._threads)
                try:
                    status = fuse(client, source, target, degree).status_code
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.errors.append(repr(exc))
                    continue
                with self._lock:
                    self.statuses.append(status)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(90)

    def wait_for(self, n: int, timeout: float = 60) -> None:
        """Until ``n`` more responses have arrived (bounded)."""
        want, end = len(self.statuses) + n, time.monotonic() + timeout
        while len(self.statuses) < want and time.monotonic() < end:
            time.sleep(0.05)


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"].replace("$__rate_interval", "1m")
            for panel in board["panels"] for t in panel["targets"]]


def rule_exprs() -> list[str]:
    """Recording rules as written; alerts without their threshold comparison, so the
    quantity they compare is checked (an alert that is not firing returns nothing)."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    out = []
    for rule in (r for g in groups for r in g["rules"]):
        expr = rule["expr"].strip()
        if "alert" in rule:
            expr = re.sub(r"\s*[<>]=?\s*[0-9.e-]+$", "", expr)
        out.append(expr)
    return out


def wait_serving(server: ServerProcess, load: Load, timeout: float = 30) -> None:
    """Until ``server`` has answered fuses from the load through nginx: back in the
    balancer (nginx skips a replica for fail_timeout after an error)."""
    before, end = fuse_count(server), time.monotonic() + timeout
    while fuse_count(server) == before and time.monotonic() < end:
        load.wait_for(1)
    assert fuse_count(server) > before, f"{server.name} takes no traffic after its restart"


@pytest.fixture
def stack(redis_server: Any, redis_factory: Any, sample_images: dict[str, np.ndarray],
          settings: Any, model_dir: Path, tmp_path: Path
          ) -> Iterator[tuple[Nginx, list[ServerProcess], Prometheus]]:
    # As deploy/compose: a cache Redis, and a template store Redis of its own.
    templates = redis_factory("--maxmemory-policy", "noeviction", "--appendonly", "yes")
    env = {"FACEFUSE_REDIS_URL": redis_server.url, "FACEFUSE_SHUTDOWN_GRACE_S": "20",
           "FACEFUSE_MODELS_DIR": str(model_dir), "FACEFUSE_RELOAD_POLL_S": "0",
           "FACEFUSE_TEMPLATES_BACKEND": "redis", "FACEFUSE_TEMPLATES_REDIS_URL": templates.url,
           "FACEFUSE_ADMIN_OPEN": "true"}
    replicas = [ServerProcess(settings.home, tmp_path, env, name=f"replica{i}") for i in (1, 2)]
    with ExitStack() as stack:
        for server in replicas:
            stack.callback(server.kill)
        starters = [threading.Thread(target=s.start) for s in replicas]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        for server in replicas:
            assert server.proc is not None and server.proc.poll() is None, server.log_tail()
        nginx = Nginx([f"127.0.0.1:{s.port}" for s in replicas])
        stack.callback(nginx.stop)
        nginx.start()
        prom = Prometheus([f"127.0.0.1:{s.port}" for s in replicas], tmp_path)
        stack.callback(prom.stop)
        prom.start()
        yield nginx, replicas, prom


def test_stack(stack: tuple[Nginx, list[ServerProcess], Prometheus],
               sample_images: dict[str, np.ndarray]) -> None:
    nginx, (a, b), prom = stack
    photos = photo_variants(sample_images, 48, seed=11)
    pairs = [(photos[i], photos[(i + 1) % len(photos)]) for i in range(len(photos))]

    with httpx.Client(base_url=nginx.url, timeout=60) as client:
        # 1. Spread: sequential requests with nobody else in flight go round the ring.
        for source, target in pairs[:6]:
            r = fuse(client, source, target)
            assert r.status_code == 200, r.text
        assert fuse_count(a) > 0 and fuse_count(b) > 0
        # The request id is propagated: the client's is answered back, or nginx makes one.
        r = client.get("/readyz", headers={"X-Request-ID": "stack-test-42"})
        assert r.headers["x-request-id"] == "stack-test-42"
        assert re.fullmatch(r"[0-9a-f]{32}", client.get("/readyz").headers["x-request-id"])
        # Bodies above the server's limit stop at nginx.
        assert client.post("/v1/fuse", content=b"x" * (11 << 20)).status_code == 413

    # 2. L2 across replicas: computed on one, a hit on the other.
    source, target = pairs[10]
    with a.client() as ca, b.client() as cb:
        first = fuse(ca, source, target)
        second = fuse(cb, source, target)
    assert first.headers["x-facefuse-cache"] == "miss"
    assert second.headers["x-facefuse-cache"] == "hit"
    assert first.content == second.content

    # 2b. Templates through nginx: registered on one replica, there on both.
    with httpx.Client(base_url=nginx.url, timeout=60) as client:
        r = client.post("/v1/templates", files={"image": ("t.jpg", photos[0], "image/jpeg")})
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        assert all(client.get(f"/v1/templates/{tid}").status_code == 200 for _ in range(6))
    for server in (a, b):
        assert httpx.get(f"{server.url}/v1/templates/{tid}", timeout=30).status_code == 200
        assert httpx.get(f"{server.url}/readyz", timeout=30).json()["checks"][
            "templates_durable"] is True

    # 3. kill -9 of a replica under load: nginx retries on the other, nothing is lost.
    with Load(nginx.url, pairs[12:], first_degree=20) as load:
        load.wait_for(6)
        assert a.proc is not None
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(10)
        load.wait_for(10)
    assert load.errors == [] and set(load.statuses) == {200}, (
        load.statuses, load.errors, nginx.error_log())
    assert len(load.statuses) >= 16

    # ... and the restarted replica takes traffic again, once nginx's fail_timeout
    # (5 s in the shipped upstream lines) has passed.
    a.start()
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=nginx.url, timeout=60) as client:
        while fuse_count(a) == 0 and time.monotonic() < deadline:
            for source, target in pairs[:4]:  # L2 hits now: fast, still served by a replica
                assert fuse(client, source, target).status_code == 200
            time.sleep(0.5)
    assert fuse_count(a) > 0

    # 4. Rolling restart with SIGTERM (drain) under load: one replica after the other,
    # the next only once the previous one is back in the balancer.
    with Load(nginx.url, pairs, first_degree=40) as load:
        load.wait_for(4)
        for server in (a, b):
            server.terminate()
            server.wait(60)
            server.start()
            wait_serving(server, load)
    assert load.errors == [] and set(load.statuses) == {200}, (
        load.statuses, load.errors, nginx.error_log())
    served = [e for e in nginx.access_log() if e["uri"] == "/v1/fuse"]
    assert {e["upstream"].split(", ")[-1] for e in served} >= {f"127.0.0.1:{a.port}",
                                                                f"127.0.0.1:{b.port}"}

    # 5. A bad upload is a typed 4xx through the proxy too (and feeds the error panel:
    # sent now, after the restarts, so the replica that counts it is still running).
    with httpx.Client(base_url=nginx.url, timeout=60) as client:
        for _ in range(2):  # least_conn alternates: one per replica
            bad = client.post("/v1/fuse", files={
                "source": ("s.jpg", b"not an image", "image/jpeg"),
                "target": ("t.jpg", b"nor this", "image/jpeg")})
            assert 400 <= bad.status_code < 500 and "code" in bad.text

    # 6. Prometheus: both targets up, then every shipped expression has data.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        up = prom.query('up{job="facefuse"} == 1')
        if len(up) == 2:
            break
        time.sleep(0.5)
    assert len(up) == 2, up
    # Two more scrapes (rates need two samples) and two rule evaluations (1 s each).
    time.sleep(3)
    empty = [e for e in dashboard_exprs() + rule_exprs() if not prom.query(e)]
    assert empty == [], empty


def test_promtool_accepts_the_rules() -> None:
    promtool = binary("promtool")
    proc = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
