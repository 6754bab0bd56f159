"""The compose stack refers to files that exist and agrees with the other configs.

(Containers cannot run on the project's machines; the same topology runs from plain
processes in tests/integration/test_stack.py.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "compose"


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
    svc = load("compose.yaml")["services"]["worker"]
    assert svc["entrypoint"] == ["facefuse", "worker"]
    grace = int(svc["stop_grace_period"].rstrip("s"))
    assert grace >= int(svc["environment"]["FACEFUSE_SHUTDOWN_GRACE_S"]) + 30
    assert svc["environment"]["FACEFUSE_REDIS_URL"].startswith("redis://redis:")
