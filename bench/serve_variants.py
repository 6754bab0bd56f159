"""Benchmark: this checkout's server under a few environments, side by side in one run.

Each variant is ``NAME`` or ``NAME:VAR=VALUE,VAR=VALUE`` (the environment of that
server: ``FACEFUSE_*`` settings, ``OPENCV_FOR_THREADS_NUM``, ``MALLOC_ARENA_MAX``...).
All servers are up at once (an idle one costs no CPU); for ``--rounds`` interleaved
rounds each in turn gets closed-loop ``POST /v1/fuse`` load of distinct portraits
(bench/serve.py's, never the same pixels twice) at 1 client (p50 latency) and at 8
(throughput), as in bench/ab.py. Beside latency and throughput, the server's CPU
time per answered request (user + system of its processes, ``/proc/PID/stat``, and
the system part alone) and its peak RSS (VmHWM summed over its processes): on a
shared machine the other work changes wall times far more than the CPU a request
costs, and at 8 clients on 2 saturated cores throughput is ~2 s / that cost. Medians
of the rounds, and each variant's ratio to the first.

    .venv/bin/python bench/serve_variants.py default cv1:OPENCV_FOR_THREADS_NUM=1 \\
        ort2:FACEFUSE_THREADS=2 "w2:ARGS=--workers 2" [--rounds 4] [--duration 5] \\
        [--megapixels 2] [--name NAME]

Writes bench/results/NAME.json (default serve_variants; no BENCHMARKS.md section:
cite the figures where they decide something).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import level
from facefuse.config import Settings
from report import ROOT, load1, machine, write_json
from serve import Inputs, Pool, closed_loop, parse_variant, process_cpu_s, server


def measured(srv: Any, name: str, pool: Pool, c: int, duration: float) -> dict[str, Any]:
    """One level (bench/ab.py's), with the server's CPU milliseconds per answer (all
    of it, and the system part)."""
    user0, sys0 = process_cpu_s(srv.pids())
    row = level(srv, name, pool, c, duration)
    user1, sys1 = process_cpu_s(srv.pids())
    n = max(1, row["requests"])
    row["cpu_ms_per_req"] = round(1000 * (user1 + sys1 - user0 - sys0) / n, 1)
    row["sys_ms_per_req"] = round(1000 * (sys1 - sys0) / n, 1)
    print(name, c, "cpu ms/request", row["cpu_ms_per_req"], "system", row["sys_ms_per_req"],
          flush=True)
    return row


#: A variant's key for arguments to ``facefuse serve`` (split on spaces), not the
#: environment: ``ARGS=--workers 2``.
ARGS_KEY = "ARGS"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per level")
    ap.add_argument("--megapixels", type=float, default=None,
                    help="portrait area in MP (default: long side ~900 px)")
    ap.add_argument("--name", default="serve_variants", help="results file name")
    args = ap.parse_args()
    variants = dict(parse_variant(v) for v in args.variants)
    inputs = Inputs(Settings.from_env(), megapixels=args.megapixels)
    pool = Pool(inputs)
    log = Path(tempfile.gettempdir()) / "facefuse-bench-variants.log"
    log.write_text("")
    t_start = time.monotonic()
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    loads = [load1()]
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(server(
            {"PYTHONPATH": str(ROOT / "src"), **{k: v for k, v in env.items() if k != ARGS_KEY}},
            log, tuple(env.get(ARGS_KEY, "").split()))) for name, env in variants.items()}
        for srv in servers.values():  # warm up (allocator, ORT first runs)
            closed_loop(srv, "/v1/fuse", 2, 2.0, inputs.pairs(30))
        for _ in range(args.rounds):
            for c in (1, 8):
                for name, srv in servers.items():
                    rows.setdefault(name, {}).setdefault(str(c), []).append(
                        measured(srv, name, pool, c, args.duration))
            loads.append(load1())
    summary = {name: {"p50_ms_c1": statistics.median(x["p50_ms"] for x in r["1"]),
                      "rps_c8": statistics.median(x["throughput_rps"] for x in r["8"]),
                      "p95_ms_c8": statistics.median(x["p95_ms"] for x in r["8"]),
                      "cpu_ms_c1": statistics.median(x["cpu_ms_per_req"] for x in r["1"]),
                      "cpu_ms_c8": statistics.median(x["cpu_ms_per_req"] for x in r["8"]),
                      "sys_ms_c1": statistics.median(x["sys_ms_per_req"] for x in r["1"]),
                      "sys_ms_c8": statistics.median(x["sys_ms_per_req"] for x in r["8"]),
                      "peak_rss_mb": max(x["peak_rss_mb"] for c in r.values() for x in c),
                      "errors": sum(x["other_errors"] for c in r.values() for x in c)}
               for name, r in rows.items()}
    first = summary[next(iter(summary))]
    for s in summary.values():
        s["p50_ratio"] = round(s["p50_ms_c1"] / first["p50_ms_c1"], 3)
        s["rps_ratio"] = round(s["rps_c8"] / first["rps_c8"], 3)
        s["cpu_c8_ratio"] = round(s["cpu_ms_c8"] / first["cpu_ms_c8"], 3)
    res = {"machine": machine(), "variants": variants, "rounds": args.rounds,
           "duration_s": args.duration, "megapixels": args.megapixels, "load1": loads,
           "rows": rows, "summary": summary, "wall_s": round(time.monotonic() - t_start, 1)}
    write_json(args.name, res)
    for name, s in summary.items():
        print(name, s, flush=True)


if __name__ == "__main__":
    main()
