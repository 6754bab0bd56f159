"""Benchmark: peak RSS and throughput of the server under a few settings, one server at a time.

Each variant is ``NAME`` or ``NAME:VAR=VALUE,VAR=VALUE`` (environment for that
server: ``FACEFUSE_*`` settings, ``MALLOC_ARENA_MAX``, ``PYTHONPATH=<an exported
src/>``...). Per variant: RSS right after readiness (VmRSS, its anonymous and
file-backed parts), after a short warm-up, then closed-loop ``POST /v1/fuse`` of
distinct portraits at 8 clients (throughput) and 32 clients (peak: the largest
anonymous RSS sampled every 50 ms, and VmHWM, everything held since start; and the
in-process caches' share of it, ``cache_mb_32``).
Prints one JSON line per variant; on a shared machine run each variant twice,
interleaved, and compare like with like.

    .venv/bin/python bench/memory.py default arena1:MALLOC_ARENA_MAX=1 \\
        default arena1:MALLOC_ARENA_MAX=1 [--duration 6] [--megapixels 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from serve import Inputs, Pool, closed_loop, parse_variant, server


def status_mb(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of ``pid`` in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) // 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds per level")
    ap.add_argument("--megapixels", type=float, default=None,
                    help="portraits of 0.5-1x this many megapixels (default: ~630-900 px)")
    args = ap.parse_args()
    inputs = Inputs(Settings.from_env(), megapixels=args.megapixels)
    pool = Pool(inputs)
    log = Path(tempfile.gettempdir()) / "facefuse-bench-memory.log"
    for k, text in enumerate(args.variants):
        name, env = parse_variant(text)
        with server(env, log) as srv:
            pid = srv.proc.pid
            ready = status_mb(pid)
            closed_loop(srv, "/v1/fuse", 2, 2.0, inputs.pairs(40))
            warm = status_mb(pid)
            tag = f"{name}#{k}"
            r8 = closed_loop(srv, "/v1/fuse", 8, args.duration,
                             pool.take(tag, 8, args.duration), seed=8)
            pool.used(tag, r8)  # the 32-client level gets inputs never sent before
            peak = [0]
            done = threading.Event()

            def sample(pid: int = pid, peak: list[int] = peak,
                       done: threading.Event = done) -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], status_mb(pid)["RssAnon"])
                    time.sleep(0.05)

            sampler = threading.Thread(target=sample)
            sampler.start()
            r32 = closed_loop(srv, "/v1/fuse", 32, args.duration,
                              pool.take(tag, 32, args.duration), seed=32)
            done.set()
            sampler.join()
            print(json.dumps({"variant": name, "env": env, "ready": ready, "warm": warm,
                              "after_32": status_mb(pid), "peak_anon_mb_32": peak[0],
                              "cache_mb_32": r32["cache_mb"],
                              "rps_8": r8["throughput_rps"], "p50_ms_8": r8["p50_ms"],
                              "rps_32": r32["throughput_rps"], "statuses_32": r32["statuses"]}),
                  flush=True)


if __name__ == "__main__":
    main()
