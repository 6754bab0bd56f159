"""Benchmark: fusing into a stored template vs a plain fuse of the same target.

One real ``facefuse serve`` (uvicorn on loopback, the file template store in a
temporary directory, the L1 analysis cache off so no request reuses another's
analysis). The target — a sample portrait scaled to a 900 px long side — is
registered once as a template. Then ``--rounds`` interleaved pairs of requests,
each with a new source photo (distinct pixels): ``POST /v1/templates/{id}/fuse``
(the template's faces come from the store) and ``POST /v1/fuse`` with the target
uploaded (its faces are detected, meshed and embedded again). Reported: medians
of the client-side latency and of the server's analysis time (Server-Timing
detect + mesh + embed) and detector items per request (from /metrics).

    .venv/bin/python bench/templates.py [--rounds 20]

Writes bench/results/templates.json and the "templates" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from report import machine, machine_line, write_json, write_section
from serve import Inputs, server

ANALYSIS_STAGES = ("detect", "mesh", "embed")


def stages(header: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out[name] = out.get(name, 0.0) + float(dur)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    settings = Settings.from_env()
    inputs = Inputs(settings, seed=3)
    target = inputs.image()
    rows: dict[str, list[dict[str, float]]] = {"template": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp, server(
            {"FACEFUSE_TEMPLATES_DIR": tmp, "FACEFUSE_L1_CACHE_BYTES": "0",
             "FACEFUSE_RELOAD_POLL_S": "0", "FACEFUSE_ADMIN_OPEN": "true"},
            Path(tmp) / "server.log") as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as c:
        tid = c.post("/v1/templates", files={"image": ("t.jpg", target)}).json()["id"]
        for kind in ("template", "plain"):  # warm both paths once
            _fuse(c, kind, tid, inputs.image(), target)
        for _ in range(args.rounds):
            for kind in ("template", "plain"):
                before = srv.batch_stats()["blazeface_full"][0]
                t0 = time.perf_counter()
                r = _fuse(c, kind, tid, inputs.image(), target)
                ms = (time.perf_counter() - t0) * 1000
                st = stages(r.headers["server-timing"])
                rows[kind].append({
                    "latency_ms": ms,
                    "analysis_ms": sum(st.get(s, 0.0) for s in ANALYSIS_STAGES),
                    "detector_items": srv.batch_stats()["blazeface_full"][0] - before})
    summary = {k: {f: round(statistics.median(r[f] for r in v), 1) for f in v[0]}
               for k, v in rows.items()}
    result = {"machine": machine(), "rounds": args.rounds, "median": summary,
              "latency_ratio": round(summary["template"]["latency_ms"]
                                     / summary["plain"]["latency_ms"], 3)}
    write_json("templates", result)
    write_section("templates", report(result, args))
    print(report(result, args))


def _fuse(c: httpx.Client, kind: str, tid: str, source: bytes, target: bytes) -> httpx.Response:
    if kind == "template":
        r = c.post(f"/v1/templates/{tid}/fuse", files={"source": ("s.jpg", source)})
    else:
        r = c.post("/v1/fuse", files={"source": ("s.jpg", source), "target": ("t.jpg", target)})
    r.raise_for_status()
    return r


def report(res: dict[str, Any], args: argparse.Namespace) -> str:
    m = res["median"]
    lines = [
        "## Templates (`bench/templates.py`)",
        "",
        f"`.venv/bin/python bench/templates.py --rounds {args.rounds}` — "
        f"{machine_line(res['machine'])} "
        "The machine was shared with other work, so compare the two rows (interleaved, "
        "medians), not absolute figures. L1 off; every request has a new source photo.",
        "",
        "| request | latency p50 (ms) | analysis p50 (ms, detect+mesh+embed) "
        "| detector items / request |",
        "|---|---:|---:|---:|",
    ]
    for kind, label in (("template", "`POST /v1/templates/{id}/fuse`"),
                        ("plain", "`POST /v1/fuse` (target uploaded)")):
        lines.append(f"| {label} | {m[kind]['latency_ms']:.0f} | {m[kind]['analysis_ms']:.0f} "
                     f"| {m[kind]['detector_items']:.0f} |")
    lines += ["", f"Template fuse / plain fuse latency: {res['latency_ratio']:.2f}."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
