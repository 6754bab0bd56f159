"""nginx and Prometheus processes on loopback, from the configs shipped in deploy/.

:class:`Nginx` renders ``deploy/nginx/facefuse.conf.template`` with ports and paths
only, and runs the Debian ``nginx`` in the foreground. :class:`Prometheus` runs the
Debian ``prometheus`` with a scrape config for the given targets and the shipped
rule file, and answers PromQL through its HTTP API. Both are stopped by ``stop()``
(called from the tests' ``finally``/ExitStack even on failure).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from server_harness import free_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NGINX_TEMPLATE = DEPLOY / "nginx" / "facefuse.conf.template"
RULES = DEPLOY / "prometheus" / "facefuse-rules.yml"
DASHBOARD = DEPLOY / "grafana" / "facefuse.json"


def binary(name: str) -> str:
    path = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.exists()), None)
    if path is None:
        raise RuntimeError(f"{name} is not installed: run `bash scripts/install-system-deps.sh`")
    return path


def render_nginx(port: int, upstreams: Sequence[str], prefix: Path) -> str:
    """The shipped template with the three ${...} variables filled in, nothing else."""
    servers = "\n        ".join(
        f"server {u} max_fails=1 fail_timeout=5s;" for u in upstreams)
    values = {"NGINX_PORT": f"127.0.0.1:{port}", "UPSTREAM_SERVERS": servers,
              "NGINX_PREFIX": str(prefix)}
    text = NGINX_TEMPLATE.read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)\}", text))
    assert used == set(values), used
    for key, value in values.items():
        text = text.replace("${" + key + "}", value)
    return text


def _wait(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer {url} in {timeout}s")


class Nginx:
    """nginx in front of ``upstreams`` (host:port), listening on a free port."""

    def __init__(self, upstreams: Sequence[str]) -> None:
        self.port = free_port()
        # Workers run as an unprivileged user and write request bodies here, so the
        # prefix is a world-writable directory of its own (not under pytest's 0700 tmp).
        self.prefix = Path(tempfile.mkdtemp(prefix="facefuse-nginx-"))
        self.prefix.chmod(0o777)
        self.conf = self.prefix / "nginx.conf"
        self.conf.write_text(render_nginx(self.port, upstreams, self.prefix))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Nginx:
        nginx = binary("nginx")
        check = subprocess.run([nginx, "-t", "-c", str(self.conf), "-p", str(self.prefix)],
                               capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"nginx -t failed:\n{check.stderr}")
        self.proc = subprocess.Popen([nginx, "-c", str(self.conf), "-p", str(self.prefix)],
                                     stdin=subprocess.DEVNULL)
        # /metrics is blocked by the config with 404: an answer without an upstream.
        _wait(self.url + "/metrics", self.proc, "nginx", 15)
        return self

    def access_log(self) -> list[dict[str, Any]]:
        lines = (self.prefix / "access.log").read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def error_log(self, chars: int = 3000) -> str:
        path = self.prefix / "error.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: fast shutdown of master and workers
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.prefix, ignore_errors=True)


class Prometheus:
    """Prometheus scraping ``targets`` every second, with the shipped rules loaded."""

    def __init__(self, targets: Sequence[str], workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "facefuse", "scrape_timeout": "1s",
                                "static_configs": [{"targets": list(targets)}]}],
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(json.dumps(config))  # JSON is YAML
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [binary("prometheus"), f"--config.file={self.config}",
                 f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        _wait(self.url + "/-/ready", self.proc, "prometheus", 30)
        return self

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise AssertionError(f"{expr!r}: {body.get('error')}")
        return list(body["data"]["result"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
