"""Benchmark: one replica as the Kubernetes base runs it — cold start and memory.

The server gets exactly the ``FACEFUSE_*`` settings of deploy/k8s/base/configmap.yaml
(the models directory aside: the local zoo), one uvicorn worker, as in the pod.

* **Cold start**: process start to ``/readyz`` 200 (models loaded and warmed),
  ``--starts`` times each way: with Python's bytecode cached (a venv install) and
  with none (an empty ``PYTHONPYCACHEPREFIX`` and ``PYTHONDONTWRITEBYTECODE``: every
  imported module compiled at start, as the slim image does, which ships no
  bytecode and cannot write any).
* **Memory**: RSS at readiness, then VmHWM (the peak since start: what the memory
  limit must hold) after closed-loop ``POST /v1/fuse`` of distinct ~900 px portraits at
  1, 8 and 32 clients, then of distinct 12 MP photos at 8 clients; with the memory
  budget the pod's limit gives the server (90 % of 768 MiB, read from the cgroup in
  the pod; set explicitly here).

Writes bench/results/replica.json and prints a markdown table (docs/deploy.md quotes
it). On a shared machine the start times are upper bounds.

    .venv/bin/python bench/replica.py [--starts 3] [--duration 6]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.serving.budget import CGROUP_SHARE
from memory import status_mb
from report import ROOT, load1, machine, machine_line, write_json
from serve import Inputs, Pool, free_port, run, server

CONFIGMAP = ROOT / "deploy" / "k8s" / "base" / "configmap.yaml"
#: The pod's memory limit (deploy/k8s/base/deployment.yaml), MiB.
LIMIT_MIB = 768


def pod_settings() -> dict[str, str]:
    """The base ConfigMap's settings, less the in-image model directory, plus the
    memory budget the pod's cgroup limit gives (no limit here to read it from)."""
    data = dict(yaml.safe_load(CONFIGMAP.read_text())["data"])
    data.pop("FACEFUSE_MODELS_DIR", None)
    data["FACEFUSE_MEMORY_BUDGET_MB"] = str(int(LIMIT_MIB * CGROUP_SHARE))
    return {k: str(v) for k, v in data.items()}


def cold_start(env: dict[str, str], log: Path) -> tuple[float, int]:
    """Seconds from process start to /readyz 200, and VmRSS then (MiB)."""
    port = free_port()
    full = {k: v for k, v in os.environ.items()
            if not k.startswith("FACEFUSE_") or k == "FACEFUSE_HOME"}
    full.update(env)
    with log.open("ab") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "facefuse.cli", "serve", "--port",
                                 str(port), "--workers", "1"], env=full, stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited ({proc.returncode}); see {log}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    return time.perf_counter() - t0, status_mb(proc.pid)["VmRSS"]
            time.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=3, help="cold starts of each kind")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds per load level")
    ap.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                    help="run the load levels (--no-memory: cold starts only)")
    args = ap.parse_args()
    env = pod_settings()
    log = Path(tempfile.gettempdir()) / "facefuse-bench-replica.log"
    starts: dict[str, list[tuple[float, int]]] = {"bytecode": [], "no_bytecode": []}
    for _ in range(args.starts):  # interleaved, so a busy moment hits both alike
        starts["bytecode"].append(cold_start(env, log))
        with tempfile.TemporaryDirectory() as empty:
            starts["no_bytecode"].append(cold_start(
                {**env, "PYTHONPYCACHEPREFIX": empty, "PYTHONDONTWRITEBYTECODE": "1"}, log))

    ready: dict[str, int] = {}
    levels: list[dict[str, Any]] = []
    if args.memory:
        ready, levels = memory(env, log, args.duration)
    result = {"machine": machine(), "load1": load1(),
              "settings": env, "starts": starts, "ready": ready,
              "levels": levels, "limit_mib": LIMIT_MIB, "command": " ".join(sys.argv)}
    write_json("replica" if args.memory and args.starts else "replica-partial", result)
    print(report(result))


def memory(env: dict[str, str], log: Path, duration: float
           ) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """RSS at readiness, and one row per load level (see the module docstring)."""
    settings = Settings.from_env()
    small, large = Pool(Inputs(settings)), Pool(Inputs(settings, seed=1, megapixels=12.0))
    large.best_rps = 2.0  # a 12 MP fusion takes seconds: make fewer of them
    levels: list[dict[str, Any]] = []
    with server(env, log, ("--workers", "1")) as srv:
        ready = status_mb(srv.proc.pid)
        for label, pool, clients in (("900 px", small, 1), ("900 px", small, 8),
                                     ("900 px", small, 32), ("12 MP", large, 8)):
            row = run(srv, "replica", pool, "/v1/fuse", clients, duration)
            levels.append({"images": label, "clients": clients,
                           "rps": row["throughput_rps"], "p95_ms": row["p95_ms"],
                           "statuses": row["statuses"],
                           "vmhwm_mib": status_mb(srv.proc.pid)["VmHWM"],
                           "rss_mib": status_mb(srv.proc.pid)["VmRSS"]})
    return ready, levels


def report(r: dict[str, Any]) -> str:
    def med(kind: str) -> str:
        secs = [s for s, _ in r["starts"][kind]]
        return (f"{statistics.median(secs):.1f} s (runs: "
                + ", ".join(f"{s:.1f}" for s in secs) + ")")

    lines = [f"{machine_line(r['machine'])} Load average {r['load1']}.", ""]
    if r["starts"]["bytecode"]:
        lines += ["| cold start to /readyz 200 | median |", "|---|---|",
                  f"| bytecode cached (venv) | {med('bytecode')} |",
                  f"| no bytecode (as the slim image) | {med('no_bytecode')} |", ""]
    if not r["levels"]:
        return "\n".join(lines)
    lines += [f"RSS at readiness: {r['ready']['VmRSS']} MiB "
              f"(anonymous {r['ready']['RssAnon']}, file-backed {r['ready']['RssFile']}).", "",
              "| load (distinct images) | req/s | p95 ms | statuses | peak RSS (VmHWM) | "
              f"of the {r['limit_mib']} MiB limit |", "|---|---|---|---|---|---|"]
    for lv in r["levels"]:
        lines.append(f"| {lv['clients']} clients, {lv['images']} | {lv['rps']} | {lv['p95_ms']} "
                     f"| {lv['statuses']} | {lv['vmhwm_mib']} MiB | "
                     f"{100 * lv['vmhwm_mib'] / r['limit_mib']:.0f}% |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
