"""Benchmark: the naive baseline (bench/naive_service.py) against ``facefuse serve``.

Both servers are up at once, on loopback, with the same models and FACEFUSE_HOME:

* ``facefuse``: ``facefuse serve`` on its defaults (ONNX Runtime, micro-batching,
  in-process L1/L2 caches, face-region fusion, admission by memory budget);
* ``naive ×N``: the same pipeline in PyTorch eager FP32, unbatched, uncached,
  whole-frame blending, one request at a time per worker, N uvicorn processes (one
  server per ``--naive-workers`` count, default 1 and 2), one torch thread each;
* with ``--arenas-variant``, ``naive ×1`` again with ``MALLOC_ARENA_MAX=2`` (glibc's
  arenas capped as facefuse caps them): how much of the naive's memory is the
  allocator rather than PyTorch or the whole-frame work.

For ``--rounds`` interleaved rounds, at each concurrency of ``--levels``, each server
in turn gets closed-loop ``POST /v1/fuse`` load for ``--duration`` s with distinct
portraits of about ``--megapixels`` (bench/serve.py's ``Inputs``, never the same
pixels twice on one server). Per level: req/s, p50/p95 latency (medians of the
rounds) and peak RSS: the VmHWM of the server's process tree, reset before each level
(``/proc/PID/clear_refs``), the largest over the rounds. Then the largest
concurrency that stays under ``--mem-limit-mb`` and a p95 of ``--sla-ms``.

Before the load, one fixed pair through both servers: their similarity headers and
the PSNR of the naive output against facefuse's (the same pipeline should give
nearly the same image).

    .venv/bin/python bench/naive_vs_facefuse.py [--rounds 3] [--duration 5] [--benchmarks]

Writes bench/results/naive_vs_facefuse.json, three PNG plots under bench/results/ and,
with ``--benchmarks``, the "naive" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.imaging.decode import decode_image
from report import RESULTS, arguments, load1, machine, machine_line, write_json, write_section
from serve import Inputs, Pool, Server, closed_loop, server

NAIVE = (str(Path(__file__).resolve().parent / "naive_service.py"),)
PLOTS = {"latency": "naive_latency.png", "rss": "naive_rss.png", "bars": "naive_bars.png"}


#: The naive server with glibc's malloc arenas capped as facefuse caps its own.
ARENAS_NAME = "naive ×1, 2 arenas"


def naive_name(workers: int) -> str:
    return f"naive ×{workers}"


def reset_peak(srv: Server) -> None:
    """Reset VmHWM of the server's processes to their current RSS (Linux clear_refs 5)."""
    for pid in srv.pids():
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/clear_refs").write_text("5")


def pss_mb(srv: Server) -> float:
    """Proportional set size of the server's process tree now, MiB: pages shared between
    its processes (libraries, a forked parent's) counted once in all, unlike summed RSS."""
    total = 0.0
    for pid in srv.pids():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) / 1024
    return total


def level(srv: Server, name: str, pool: Pool, c: int, duration: float) -> dict[str, Any]:
    """One closed-loop level of distinct fuses; peak RSS of this level only."""
    before = load1()
    reset_peak(srv)
    row = closed_loop(srv, "/v1/fuse", c, duration, pool.take(name, c, duration), seed=c)
    pool.used(name, row)
    row["load1_before"] = before
    row["pss_mb_after"] = round(pss_mb(srv), 1)
    row["rejected_503"] = row["statuses"].get("503", 0)
    print(name, c, {k: row[k] for k in ("throughput_rps", "p50_ms", "p95_ms", "peak_rss_mb",
                                        "statuses")}, flush=True)
    return row


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def same_pair(servers: dict[str, Server], pair: tuple[bytes, bytes]) -> dict[str, Any]:
    """One fixed pair through every server: similarity header, PSNR against the first."""
    out: dict[str, Any] = {}
    ref = None
    for name, srv in servers.items():
        r = httpx.post(srv.url + "/v1/fuse", timeout=120,
                       data={"degree": "80", "similarity": "true"},
                       files={"source": ("s.jpg", pair[0]), "target": ("t.jpg", pair[1])})
        r.raise_for_status()
        img = decode_image(r.content)
        ref = img if ref is None else ref
        out[name] = {"similarity": float(r.headers["x-facefuse-identity-similarity"]),
                     "psnr_vs_first_db": round(psnr(img, ref), 1)}
    return out


def summarise(rows: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per concurrency: medians over rounds of req/s, p50, p95; peak RSS of the first
    round (levels ascending: what serving up to this concurrency needs) and the largest
    of any round (after higher levels: what the process kept)."""
    out = {}
    for c, runs in rows.items():
        out[c] = {
            "rps": statistics.median(r["throughput_rps"] for r in runs),
            "p50_ms": statistics.median(r["p50_ms"] for r in runs),
            "p95_ms": statistics.median(r["p95_ms"] for r in runs),
            "peak_rss_mb": runs[0]["peak_rss_mb"],
            "peak_rss_mb_any_round": max(r["peak_rss_mb"] for r in runs),
            "pss_mb_after": runs[0]["pss_mb_after"],
            "rejected_503": sum(r["rejected_503"] for r in runs),
            "errors": sum(r["errors"] - r["rejected_503"] for r in runs),
            "requests": sum(r["requests"] for r in runs),
        }
    return out


def largest_ok(summary: dict[str, dict[str, float]], mem_mb: float, sla_ms: float) -> int | None:
    """The largest concurrency whose peak RSS and p95 are both within the limits, with no
    error (a 503 from admission is counted apart, as the server protecting itself)."""
    ok = [int(c) for c, s in summary.items()
          if s["peak_rss_mb"] <= mem_mb and s["p95_ms"] <= sla_ms and s["errors"] == 0]
    return max(ok) if ok else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per level")
    ap.add_argument("--levels", type=lambda s: [int(v) for v in s.split(",")],
                    default=[1, 4, 8, 16])
    ap.add_argument("--naive-workers", type=lambda s: [int(v) for v in s.split(",")],
                    default=[1, 2], help="one naive server per worker count")
    ap.add_argument("--arenas-variant", action="store_true",
                    help="also naive ×1 with MALLOC_ARENA_MAX=2 (how much is the allocator)")
    ap.add_argument("--megapixels", type=float, default=2.0,
                    help="portrait area before the per-image 0.7-1.0 rescale (so ~1-2 MP)")
    ap.add_argument("--mem-limit-mb", type=float, default=1200.0)
    ap.add_argument("--sla-ms", type=float, default=2000.0, help="p95 latency limit")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--benchmarks", action="store_true",
                    help="also write the 'naive' section of BENCHMARKS.md")
    ap.add_argument("--from-json", type=Path,
                    help="no load: redo the summary, plots and report of a saved run")
    args = ap.parse_args(argv)
    if args.from_json:
        res = json.loads(args.from_json.read_text())
        return finish(res, args.out, args.benchmarks)
    t_start = time.monotonic()
    inputs = Inputs(Settings.from_env(), seed=11, megapixels=args.megapixels)
    pool = Pool(inputs)
    log = Path(tempfile.gettempdir()) / "facefuse-bench-naive.log"
    log.write_text("")
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with contextlib.ExitStack() as stack:
        servers = {"facefuse": stack.enter_context(server({}, log))}
        for w in args.naive_workers:
            servers[naive_name(w)] = stack.enter_context(
                server({}, log, ("--workers", str(w)), command=NAIVE))
        if args.arenas_variant:
            servers[ARENAS_NAME] = stack.enter_context(
                server({"MALLOC_ARENA_MAX": "2"}, log, ("--workers", "1"), command=NAIVE))
        startup_rss = {n: round(s.peak_rss_mb(), 1) for n, s in servers.items()}
        check = same_pair(servers, inputs.pairs(1)[0])
        for srv in servers.values():  # warm up (allocators, first runs of every model)
            closed_loop(srv, "/v1/fuse", 2, 2.0, inputs.pairs(12))
        for r in range(args.rounds):
            for c in args.levels:
                order = list(servers.items())
                for name, srv in order[r % len(order):] + order[:r % len(order)]:
                    rows.setdefault(name, {}).setdefault(str(c), []).append(
                        level(srv, name, pool, c, args.duration))
    res: dict[str, Any] = {
        "machine": machine(), "args": arguments(args),
        "startup_rss_mb": startup_rss, "same_pair": check, "rows": rows,
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    return finish(res, args.out, args.benchmarks)


def finish(res: dict[str, Any], out: Path, benchmarks: bool) -> int:
    """Summary, limits, JSON, plots and the report of a run's ``rows``."""
    a = res["args"]
    res["summary"] = summary = {name: summarise(r) for name, r in res["rows"].items()}
    res["largest_ok"] = {n: largest_ok(s, a["mem_limit_mb"], a["sla_ms"])
                         for n, s in summary.items()}
    write_json("naive_vs_facefuse", res, out)
    plotted = plot(res, out)
    text = report(res, plotted)
    print(text)
    if benchmarks:
        write_section("naive", text)
    return 0


# --- plots and report ---------------------------------------------------------------------------


def plot(res: dict[str, Any], out: Path) -> bool:
    """Latency and peak RSS vs concurrency, and before/after bars; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    summary = res["summary"]
    names = list(summary)
    title = "POST /v1/fuse, distinct ~1-2 MP portraits, 2-core shared box"
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, name in enumerate(names):
        cs = [int(c) for c in summary[name]]
        ax.plot(cs, [summary[name][c]["p50_ms"] for c in summary[name]], "-o", color=f"C{i}",
                label=f"{name} p50")
        ax.plot(cs, [summary[name][c]["p95_ms"] for c in summary[name]], "--^", color=f"C{i}",
                label=f"{name} p95")
    ax.axhline(res["args"]["sla_ms"], color="grey", lw=1, ls=":", label="p95 SLA")
    ax.set_yscale("log")
    ax.set_xlabel("concurrent clients (closed loop)")
    ax.set_ylabel("latency, ms")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / PLOTS["latency"], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name in names:
        cs = [int(c) for c in summary[name]]
        ax.plot(cs, [summary[name][c]["peak_rss_mb"] for c in summary[name]], "-o", label=name)
    ax.axhline(res["args"]["mem_limit_mb"], color="grey", lw=1, ls=":", label="memory limit")
    ax.set_xlabel("concurrent clients (closed loop)")
    ax.set_ylabel("peak RSS of the process tree, MiB")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / PLOTS["rss"], dpi=110)
    plt.close(fig)

    c = str(max(int(k) for k in summary[names[0]]))
    metrics = (("peak_rss_mb", "peak RSS, MiB"), ("p50_ms", "p50, ms"), ("p95_ms", "p95, ms"),
               ("rps", "req/s"))
    fig, axes = plt.subplots(1, len(metrics), figsize=(10, 3.4))
    for ax, (key, label) in zip(axes, metrics, strict=True):
        vals = [summary[n][c][key] for n in names]
        ax.bar(names, vals, color=["#4c72b0" if n == "facefuse" else "#c44e52" for n in names])
        ax.set_title(label, fontsize=9)
        ax.tick_params(axis="x", labelsize=8, labelrotation=20)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center", va="bottom",
                    fontsize=8)
    fig.suptitle(f"naive baseline vs facefuse at {c} clients ({title})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / PLOTS["bars"], dpi=110)
    plt.close(fig)
    return True


def report(res: dict[str, Any], plotted: bool) -> str:
    a = res["args"]
    s = res["summary"]
    ff = s["facefuse"]
    naives = [n for n in s if n != "facefuse"]
    lines = [
        "## Naive baseline vs facefuse (`bench/naive_vs_facefuse.py`)", "",
        machine_line(res["machine"]) + " Shared with other work while measured; "
        f"load generator on the same cores. {res['wall_s']:.0f} s.", "",
        f"Command: `make bench-naive` (`python bench/naive_vs_facefuse.py --rounds {a['rounds']}"
        f" --duration {a['duration']:g}"
        f"{' --arenas-variant' if a.get('arenas_variant') else ''} --benchmarks`). "
        "Closed loop, distinct portraits of "
        f"~{a['megapixels'] * 0.49:.1f}–{a['megapixels']:.1f} MP (JPEG q90), never the same "
        f"pixels twice on one server; {a['rounds']} interleaved rounds × {a['duration']:g} s "
        "per level; latency and req/s are medians of the rounds. Peak RSS: VmHWM of the "
        "server's process tree, summed, reset before each level, in the first round "
        "(levels ascending: what serving up to that concurrency takes; the memory limit is "
        "checked on it); \"kept\": the largest of any round, i.e. after the higher levels "
        "had been served (memory the process did not give back). PSS after: the tree's "
        "proportional set size at the end of the first round's level (shared library "
        "pages counted once, which summed RSS counts per worker).", "",
        "* **facefuse**: `facefuse serve` on its defaults (ONNX Runtime, micro-batching, "
        "L1/L2 caches at their default bounds, face-region fusion, memory admission).",
        "* **naive ×N**: `bench/naive_service.py --workers N`: the same "
        "stages, selection, classic fusion, similarity (when asked: off by default in "
        "both, the load does not ask) and JPEG encoding (facefuse's own "
        "code), but the models converted with onnx2torch and run in PyTorch eager FP32 "
        "(1 torch thread per worker), no batching, no caches, the blend over the whole "
        "frame, one request at a time per worker (uvicorn workers, each with its own "
        "models); age/gender not loaded (facefuse loads them, /v1/fuse does not run them).",
        *([f"* **{ARENAS_NAME}**: naive ×1 with `MALLOC_ARENA_MAX=2` (facefuse caps "
           "glibc's malloc arenas at 2 itself; without the cap every thread of the thread "
           "pool that runs a request keeps an arena at its own high-water mark)."]
          if ARENAS_NAME in s else []),
        "",
        "| concurrency | server | req/s | p50 ms | p95 ms | peak RSS MiB | kept MiB "
        "| PSS after MiB | 503 | errors |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in s["facefuse"]:
        for name in s:
            r = s[name][c]
            lines.append(f"| {c} | {name} | {r['rps']:.2f} | {r['p50_ms']:.0f} | "
                         f"{r['p95_ms']:.0f} | {r['peak_rss_mb']:.0f} | "
                         f"{r['peak_rss_mb_any_round']:.0f} | "
                         f"{r['pss_mb_after']:.0f} | {r['rejected_503']} | {r['errors']} |")
    lines += ["", "| concurrency | facefuse / | req/s | p50 | p95 | peak RSS |",
              "|---|---|---|---|---|---|"]
    for c in ff:
        for n in naives:
            nv = s[n][c]
            lines.append(f"| {c} | {n} | {ff[c]['rps'] / nv['rps']:.2f}× | "
                         f"{ff[c]['p50_ms'] / nv['p50_ms']:.2f}× | "
                         f"{ff[c]['p95_ms'] / nv['p95_ms']:.2f}× | "
                         f"{ff[c]['peak_rss_mb'] / nv['peak_rss_mb']:.2f}× |")
    ok = res["largest_ok"]
    loads = [r["load1_before"] for levels in res["rows"].values() for runs in levels.values()
             for r in runs if r.get("load1_before") is not None]
    sp = res["same_pair"]
    lines += [
        "",
        f"Largest concurrency tested that stays under {a['mem_limit_mb']:.0f} MiB peak RSS "
        f"and a p95 of {a['sla_ms']:.0f} ms with no error: "
        + "; ".join(f"**{n}: {ok[n] if ok[n] is not None else 'none'}**" for n in ok)
        + f" (of {', '.join(str(c) for c in a['levels'])}).",
        "RSS after start-up, before any request: "
        + ", ".join(f"{n} {v:.0f} MiB" for n, v in res["startup_rss_mb"].items()) + ".",
        "Same pipeline check, one fixed pair through each server: similarity "
        + ", ".join(f"{n} {v['similarity']:.4f}" for n, v in sp.items())
        + "; naive outputs vs facefuse's: PSNR "
        + ", ".join(f"{n} {sp[n]['psnr_vs_first_db']} dB" for n in naives) + ".",
        "Machine load (1-minute load average before each level): "
        f"{min(loads):.1f}–{max(loads):.1f} on 2 cores.",
    ]
    if plotted:
        lines += ["", f"![latency vs concurrency](bench/results/{PLOTS['latency']})",
                  f"![peak RSS vs concurrency](bench/results/{PLOTS['rss']})",
                  f"![before/after](bench/results/{PLOTS['bars']})"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
