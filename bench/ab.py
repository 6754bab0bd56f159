"""Benchmark: this checkout's server against an older commit's, side by side in one run.

The base commit's ``src/`` is exported (``git archive``) into a temporary directory
and put first on ``PYTHONPATH`` of one ``facefuse serve``; the other runs this
checkout. Both use the same virtual environment and, unless ``--base-home`` gives
the base its own (models built by its own converters), the same ``FACEFUSE_HOME``;
embedded defaults (batching on, in-process caches), and are up at once. For
``--rounds`` interleaved rounds, each server in turn gets closed-loop
``POST /v1/fuse`` load with distinct inputs (bench/serve.py's portraits, never the
same pixels twice):

* 1 client: p50 latency;
* 8 clients: throughput.

Then, once per server: 32 clients (peak RSS: the process's VmHWM, everything it
ever held since start, models and caches included) and 64 clients (errors;
a ``503`` with ``Retry-After`` from admission is counted apart, as allowed).
Medians of the rounds and their ratios new/old; the goals checked against them.
With ``--workers2`` a third server, this checkout with ``--workers 2``, takes its
turn in every round too.

    .venv/bin/python bench/ab.py [--base REV] [--base-home DIR] [--megapixels MP]
                                 [--rounds 5] [--duration 6] [--workers2]

Writes bench/results/ab.json and the "ab" section of BENCHMARKS.md.
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
from facefuse.config import Settings
from report import (
    ROOT,
    export_src,
    load1,
    machine,
    machine_line,
    short_rev,
    write_json,
    write_section,
)
from serve import Inputs, Pool, closed_loop, server

#: Goals on this machine: p50 at 1 client, req/s at 8, peak RSS MB at 32 clients.
GOAL_P50_MS = 45.0
GOAL_RPS_8 = 30.0
GOAL_RSS_MB = 300.0


def level(srv: Any, name: str, pool: Pool, c: int, duration: float) -> dict[str, Any]:
    """One closed-loop level of distinct fuses, with 503s counted apart."""
    before = load1()
    row = closed_loop(srv, "/v1/fuse", c, duration, pool.take(name, c, duration), seed=c)
    pool.used(name, row)
    row["rejected_503"] = row["statuses"].get("503", 0)
    row["other_errors"] = row["errors"] - row["rejected_503"]
    row["load1_before"] = before
    print(name, c, {k: row[k] for k in ("throughput_rps", "p50_ms", "p95_ms", "peak_rss_mb",
                                        "statuses")}, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD~1", help="the commit to compare against")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=6.0, help="seconds per level")
    ap.add_argument("--workers2", action="store_true",
                    help="also this checkout with --workers 2 (RSS summed over the workers)")
    add_input_options(ap)
    args = ap.parse_args()
    base, head = short_rev(args.base), short_rev("HEAD")
    inputs = Inputs(Settings.from_env(), megapixels=args.megapixels)
    pool = Pool(inputs)
    log = Path(tempfile.gettempdir()) / "facefuse-bench-ab.log"
    log.write_text("")
    t_start = time.monotonic()
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        old_src = export_src(base, Path(tmp))
        new_env = {"PYTHONPATH": str(ROOT / "src")}
        servers = {"old": stack.enter_context(server(base_env(old_src, args.base_home), log)),
                   "new": stack.enter_context(server(new_env, log))}
        if args.workers2:
            servers["new, 2 workers"] = stack.enter_context(
                server(new_env, log, ("--workers", "2")))
        for srv in servers.values():  # warm up (allocator, ORT first runs)
            closed_loop(srv, "/v1/fuse", 2, 2.0, inputs.pairs(40))
        for _ in range(args.rounds):
            for c in (1, 8):
                for name, srv in servers.items():
                    rows.setdefault(name, {}).setdefault(str(c), []).append(
                        level(srv, name, pool, c, args.duration))
        for c in (32, 64):
            for name, srv in servers.items():
                rows[name][str(c)] = [level(srv, name, pool, c, args.duration)]
    res: dict[str, Any] = {"machine": machine(), "base": base, "head": head,
                           "rounds": args.rounds, "duration_s": args.duration, "rows": rows,
                           "megapixels": args.megapixels,
                           "base_home": str(args.base_home) if args.base_home else None,
                           "wall_s": round(time.monotonic() - t_start, 1)}
    res["summary"] = {name: summary(r) for name, r in rows.items()}
    write_json("ab", res)
    write_section("ab", report(res))
    print(res["summary"], flush=True)


def add_input_options(ap: argparse.ArgumentParser) -> None:
    """``--base-home`` and ``--megapixels``, shared with bench/stage_timing.py."""
    ap.add_argument("--base-home", type=Path, default=None,
                    help="FACEFUSE_HOME of the base server (its own converters' models)")
    ap.add_argument("--megapixels", type=float, default=None,
                    help="portrait area in MP (default: long side ~900 px)")


def base_env(old_src: Path, base_home: Path | None) -> dict[str, str]:
    """Environment of the base commit's server."""
    env = {"PYTHONPATH": str(old_src)}
    if base_home is not None:
        env["FACEFUSE_HOME"] = str(base_home)
    return env


def input_flags(res: dict[str, Any]) -> str:
    """The ``--base-home``/``--megapixels`` part of a report's command line."""
    mp = res.get("megapixels")
    return (f"{' --base-home DIR' if res.get('base_home') else ''}"
            f"{f' --megapixels {mp:g}' if mp else ''}")


def inputs_phrase(res: dict[str, Any]) -> str:
    """How the inputs and the base's models are described in a report."""
    mp = res.get("megapixels")
    size = "~630–900 px portraits" if mp is None else f"~{mp:g} MP portraits"
    home = (" (the base on its own models, built by its own converters)"
            if res.get("base_home") else "")
    return size + home


def cache_total(cache_mb: dict[str, float] | None) -> float | None:
    """L1 + L2 MB of a level's row (None: not known, see ``Server.cache_mb``)."""
    return round(sum(cache_mb.values()), 1) if cache_mb else None


def summary(r: dict[str, list[dict[str, Any]]]) -> dict[str, float | None]:
    """Medians over rounds of p50 at 1 client and req/s at 8; RSS at 32; errors at 64."""
    return {
        "p50_ms_c1": statistics.median(x["p50_ms"] for x in r["1"]),
        "rps_c8": statistics.median(x["throughput_rps"] for x in r["8"]),
        "p95_ms_c8": statistics.median(x["p95_ms"] for x in r["8"]),
        "peak_rss_mb_c32": r["32"][0]["peak_rss_mb"],
        "cache_mb_c32": cache_total(r["32"][0].get("cache_mb")),
        "rps_c32": r["32"][0]["throughput_rps"],
        "errors_c64": r["64"][0]["other_errors"],
        "rejected_503_c64": r["64"][0]["rejected_503"],
        "rps_c64": r["64"][0]["throughput_rps"],
    }


def report(res: dict[str, Any]) -> str:
    old, new = res["summary"]["old"], res["summary"]["new"]

    def row(label: str, key: str, fmt: str, better_low: bool) -> str:
        a, b = old[key], new[key]
        if a is None or b is None:
            shown = [("n/a" if v is None else f"{v:{fmt}}") for v in (a, b)]
            return f"| {label} | {shown[0]} | {shown[1]} | |"
        ratio = b / a if a else float("nan")
        arrow = "lower is better" if better_low else "higher is better"
        return f"| {label} | {a:{fmt}} | {b:{fmt}} | {ratio:.2f}× ({arrow}) |"

    met = {
        f"p50 ≤ {GOAL_P50_MS:g} ms at 1 client": new["p50_ms_c1"] <= GOAL_P50_MS,
        f"≥ {GOAL_RPS_8:g} req/s at 8 clients": new["rps_c8"] >= GOAL_RPS_8,
        f"peak RSS ≤ {GOAL_RSS_MB:g} MB at 32 clients": new["peak_rss_mb_c32"] <= GOAL_RSS_MB,
        "no error up to 64 clients (503 allowed)": new["errors_c64"] == 0,
    }
    return "\n".join([
        "## Before / after, one run (`bench/ab.py`)",
        "",
        machine_line(res["machine"]),
        f"Command: `.venv/bin/python bench/ab.py --base {res['base']} --rounds "
        f"{res['rounds']} --duration {res['duration_s']:g}"
        f"{' --workers2' if 'new, 2 workers' in res['summary'] else ''}{input_flags(res)}` "
        f"({res['wall_s']:.0f} s): the "
        f"base commit `{res['base']}` and this checkout `{res['head']}` served side by side "
        "(same venv, embedded defaults, batching on), closed-loop "
        f"`POST /v1/fuse` of distinct {inputs_phrase(res)} (degree 80, JPEG out, each "
        "side's default for `similarity`: off since the recogniser left the default path). "
        f"Latency and throughput are medians of {res['rounds']} "
        "interleaved rounds; peak RSS is the server's VmHWM after the 32-client level "
        "(the caches' share: `facefuse_cache_bytes` then, bounded by "
        "`FACEFUSE_L1_CACHE_BYTES` + `FACEFUSE_L2_CACHE_BYTES`); "
        "the 2 cores are shared with the load generator and with other work.",
        "",
        "| figure | before | after | after / before |",
        "|---|---:|---:|---:|",
        row("p50 ms, 1 client", "p50_ms_c1", ".1f", True),
        row("req/s, 8 clients", "rps_c8", ".2f", False),
        row("p95 ms, 8 clients", "p95_ms_c8", ".0f", True),
        row("req/s, 32 clients", "rps_c32", ".2f", False),
        row("peak RSS MB, 32 clients", "peak_rss_mb_c32", ".0f", True),
        row("of which in-process caches (L1 + L2) MB, after 32 clients", "cache_mb_c32",
            ".0f", True),
        f"| errors at 64 clients (503 rejected) | {old['errors_c64']} "
        f"({old['rejected_503_c64']}) | {new['errors_c64']} ({new['rejected_503_c64']}) | |",
        "",
        "Every round (1 client p50 ms; 8 clients req/s): " + "; ".join(
            f"{name}: {', '.join(str(x['p50_ms']) for x in r['1'])}; "
            f"{', '.join(str(x['throughput_rps']) for x in r['8'])}"
            for name, r in res["rows"].items()) + ".",
        "",
        "Goals: " + "; ".join(f"{k}: **{'met' if v else 'not met'}**" for k, v in met.items())
        + ".",
        "",
        *workers_lines(res),
    ])


def workers_lines(res: dict[str, Any]) -> list[str]:
    """This checkout with one worker process vs two, from the same interleaved run."""
    two = res["summary"].get("new, 2 workers")
    if two is None:
        return []
    one = res["summary"]["new"]
    return [
        "This checkout, `--workers 1` vs `--workers 2` (same rounds; RSS summed over the "
        "processes): "
        f"p50 at 1 client {one['p50_ms_c1']:.0f} vs {two['p50_ms_c1']:.0f} ms; "
        f"{one['rps_c8']:.2f} vs {two['rps_c8']:.2f} req/s at 8 clients; "
        f"{one['rps_c32']:.2f} vs {two['rps_c32']:.2f} req/s and peak RSS "
        f"{one['peak_rss_mb_c32']:.0f} vs {two['peak_rss_mb_c32']:.0f} MB at 32 clients.",
        "",
    ]


if __name__ == "__main__":
    main()
