"""Benchmark: open-loop load at fixed arrival rates, a base commit vs this checkout.

Closed-loop clients wait for each answer before sending the next request, so a slow
server is offered less load and its queueing never shows (coordinated omission).
Here requests are *scheduled* at a fixed rate — request ``i`` is due at
``start + i / rate`` — and sent from a large thread pool whatever the server does;
each latency runs from the request's **intended** send time to its answer, so time
spent waiting for a free sender counts too. Both servers (the base commit's ``src/``
on ``PYTHONPATH`` of one, as in bench/ab.py) are up at once and take turns at each
rate; distinct ~630–900 px portraits, ``POST /v1/fuse``. A ``503`` (admission
refused, ``Retry-After``) is counted apart from errors.

    .venv/bin/python bench/open_loop.py [--base REV] [--rates 2,4,6,8,10] [--duration 8]

Writes bench/results/open_loop.json, bench/results/open_loop.png (latency vs offered
load; needs matplotlib, in the ``bench`` extra) and the "open_loop" section of
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from report import (
    RESULTS,
    ROOT,
    export_src,
    machine,
    machine_line,
    short_rev,
    write_json,
    write_section,
)
from serve import Inputs, Pair, Server, closed_loop, percentile, server

#: Senders: enough that the pool is never what limits the offered rate.
SENDERS = 96


def open_loop(srv: Server, rate: float, duration: float, pairs: list[Pair]) -> dict[str, Any]:
    """``rate`` requests per second for ``duration`` s; latencies from intended send times."""
    n = int(rate * duration)
    local = threading.local()
    lock = threading.Lock()
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    def send(intended: float, pair: Pair) -> None:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client(base_url=srv.url, timeout=120)
        try:
            r = client.post("/v1/fuse", data={"degree": "80"},
                            files={"source": ("s.jpg", pair[0]), "target": ("t.jpg", pair[1])})
            status = r.status_code
        except httpx.HTTPError:
            status = 0
        done = time.perf_counter()
        with lock:
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                latencies.append((done - intended) * 1000.0)

    start = time.perf_counter() + 0.05
    with ThreadPoolExecutor(SENDERS) as pool:
        for i in range(n):
            intended = start + i / rate
            delay = intended - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(send, intended, pairs[i % len(pairs)])
    wall = time.perf_counter() - start
    ok = len(latencies)
    return {
        "rate": rate, "sent": n, "ok": ok, "achieved_rps": round(ok / wall, 2),
        "rejected_503": statuses.get(503, 0),
        "errors": sum(v for k, v in statuses.items() if k not in (200, 503)),
        "p50_ms": round(percentile(latencies, 50), 1),
        "p95_ms": round(percentile(latencies, 95), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "peak_rss_mb": round(srv.peak_rss_mb(), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD~1")
    ap.add_argument("--rates", default="2,4,6,8,10", help="offered requests per second")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per rate")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    base, head = short_rev(args.base), short_rev("HEAD")
    inputs = Inputs(Settings.from_env(), seed=21)
    log = Path(tempfile.gettempdir()) / "facefuse-bench-open-loop.log"
    rows: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        old_src = export_src(base, Path(tmp))
        servers = {"old": stack.enter_context(server({"PYTHONPATH": str(old_src)}, log)),
                   "new": stack.enter_context(server({"PYTHONPATH": str(ROOT / "src")}, log))}
        for srv in servers.values():
            closed_loop(srv, "/v1/fuse", 2, 2.0, inputs.pairs(30))
        for rate in rates:
            pairs = inputs.pairs(int(rate * args.duration))  # the same inputs for both
            for name, srv in servers.items():
                row = open_loop(srv, rate, args.duration, pairs)
                rows[name].append(row)
                print(name, row, flush=True)
                time.sleep(2.0)  # let the backlog of an overloaded level drain
    res = {"machine": machine(), "base": base, "head": head, "duration_s": args.duration,
           "senders": SENDERS, "rows": rows}
    write_json("open_loop", res)
    plotted = plot(res, RESULTS / "open_loop.png")
    write_section("open_loop", report(res, plotted))


def plot(res: dict[str, Any], path: Path) -> bool:
    """Latency (p50, p95) vs offered rate, before and after; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, style in (("old", "--"), ("new", "-")):
        rows = res["rows"][name]
        label = res["base"] if name == "old" else res["head"]
        rates = [r["rate"] for r in rows]
        ax.plot(rates, [r["p50_ms"] for r in rows], style, marker="o", label=f"{label} p50")
        ax.plot(rates, [r["p95_ms"] for r in rows], style, marker="^", label=f"{label} p95")
    ax.set_yscale("log")
    ax.set_xlabel("offered load, requests/s (open loop)")
    ax.set_ylabel("latency from intended send, ms")
    ax.set_title("POST /v1/fuse, distinct portraits, 2-core shared box")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def report(res: dict[str, Any], plotted: bool) -> str:
    lines = [
        "## Open-loop load (`bench/open_loop.py`)",
        "",
        machine_line(res["machine"]),
        f"Command: `.venv/bin/python bench/open_loop.py --base {res['base']} --rates "
        f"{','.join(format(r['rate'], 'g') for r in res['rows']['old'])} --duration "
        f"{res['duration_s']:g}`: servers of `{res['base']}` (before) and `{res['head']}` "
        "(after) up at once, taking turns at each fixed arrival rate; latency from each "
        f"request's intended send time ({res['senders']} senders), so queueing shows once "
        "the rate passes what the server sustains (the knee).",
        "",
        "| offered req/s | before: done req/s | p50 ms | p95 ms | 503 | after: done req/s | "
        "p50 ms | p95 ms | 503 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for old, new in zip(res["rows"]["old"], res["rows"]["new"], strict=True):
        lines.append(
            f"| {old['rate']:g} | {old['achieved_rps']:.2f} | {old['p50_ms']:.0f} | "
            f"{old['p95_ms']:.0f} | {old['rejected_503']} | {new['achieved_rps']:.2f} | "
            f"{new['p50_ms']:.0f} | {new['p95_ms']:.0f} | {new['rejected_503']} |")
    if plotted:
        lines += ["", "![latency vs offered load](bench/results/open_loop.png)"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
