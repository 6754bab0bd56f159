"""Benchmark: where one ``/v1/fuse`` spends its time, a base commit vs this checkout.

Both servers up at once (as in bench/ab.py: the base commit's ``src/`` on
``PYTHONPATH`` of one of them, ``--base-home`` its own models), one client,
distinct portraits (~630–900 px, or ``--megapixels``); the
requests alternate between the servers. Per stage, the median of the
``Server-Timing`` header (milliseconds; the source's and the target's stages run
concurrently and are summed), the client-side wall time and the server process's
CPU time per request (user + system, all its threads: on a shared machine the
figure that other load moves least).

    .venv/bin/python bench/stage_timing.py [--base REV] [--requests 40]

Writes bench/results/stage_timing.json and the "stage_timing" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import add_input_options, base_env, input_flags, inputs_phrase
from facefuse.config import Settings
from report import (
    ROOT,
    export_src,
    machine,
    machine_line,
    short_rev,
    write_json,
    write_section,
)
from serve import Inputs, process_cpu_s, server

STAGES = ("decode", "detect", "mesh", "embed", "fuse", "evaluate", "encode", "total")


def server_timing(header: str) -> dict[str, float]:
    """``Server-Timing: a;dur=1.2, b;dur=3`` → ``{"a": 1.2, "b": 3.0}``."""
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out[name] = float(dur)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD~1")
    ap.add_argument("--requests", type=int, default=40, help="per server")
    add_input_options(ap)
    args = ap.parse_args()
    base, head = short_rev(args.base), short_rev("HEAD")
    inputs = Inputs(Settings.from_env(), seed=11, megapixels=args.megapixels)
    pairs = inputs.pairs(args.requests + 3)
    log = Path(tempfile.gettempdir()) / "facefuse-bench-stage-timing.log"
    stages: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        old_src = export_src(base, Path(tmp))
        servers = {"old": stack.enter_context(server(base_env(old_src, args.base_home), log)),
                   "new": stack.enter_context(server({"PYTHONPATH": str(ROOT / "src")}, log))}
        with httpx.Client(timeout=120) as client:
            for i, (src, tgt) in enumerate(pairs):
                for name, srv in servers.items():
                    c0, t0 = sum(process_cpu_s(srv.pids())), time.perf_counter()
                    r = client.post(srv.url + "/v1/fuse", data={"degree": "80"},
                                    files={"source": ("s.jpg", src), "target": ("t.jpg", tgt)})
                    wall = (time.perf_counter() - t0) * 1000.0
                    r.raise_for_status()
                    # The response is sent: the work is done.
                    cpu = (sum(process_cpu_s(srv.pids())) - c0) * 1000.0
                    if i < 3:  # warm-up
                        continue
                    timing = server_timing(r.headers.get("server-timing", ""))
                    timing["wall"] = wall
                    timing["server_cpu"] = cpu
                    for k, v in timing.items():
                        stages[name].setdefault(k, []).append(v)
    med = {name: {k: round(statistics.median(v), 1) for k, v in s.items()}
           for name, s in stages.items()}
    res = {"machine": machine(), "base": base, "head": head, "requests": args.requests,
           "load_after": [round(x, 2) for x in os.getloadavg()],
           "megapixels": args.megapixels,
           "base_home": str(args.base_home) if args.base_home else None, "median_ms": med}
    write_json("stage_timing", res)
    write_section("stage_timing", report(res))
    print(med, flush=True)


def report(res: dict[str, Any]) -> str:
    old, new = res["median_ms"]["old"], res["median_ms"]["new"]
    lines = [
        "## Where a fuse spends its time (`bench/stage_timing.py`)",
        "",
        machine_line(res["machine"]),
        f"Command: `.venv/bin/python bench/stage_timing.py --base {res['base']} --requests "
        f"{res['requests']}{input_flags(res)}`: servers of `{res['base']}` and "
        f"`{res['head']}` up at once, one client, {inputs_phrase(res)}, the requests "
        "alternating between them (degree 80, each side's defaults: "
        "a stage a side does not run shows 0); medians of the `Server-Timing` "
        "stages (source and target stages overlap and are summed) and of the client's wall "
        "time, and the server process's CPU time per request (user + system, all "
        "threads; 10 ms ticks), ms.",
        "",
        "| stage | before | after | after / before |",
        "|---|---:|---:|---:|",
    ]
    for k in (*STAGES, "wall", "server_cpu"):
        if k in old or k in new:
            a, b = old.get(k, 0.0), new.get(k, 0.0)
            ratio = f"{b / a:.2f}×" if a else "–"
            lines.append(f"| {k} | {a:.1f} | {b:.1f} | {ratio} |")
    if "load_after" in res:
        lines += ["", f"Load average (1/5/15 min) at the end: {res['load_after']}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
