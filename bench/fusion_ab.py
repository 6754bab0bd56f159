"""The fusion stage's CPU and wall time on several commits, interleaved job by job.

Each commit's ``src/`` renders in its own worker process (the same virtual
environment and models); every worker analyses the same four pairs of sample
photos (obama → biden, biden → obama3, obama2 → astronaut, astronaut → obama)
with each target resized to 0.5, 1.5 and 4 MP, then times ``fuse_faces`` (degree
100, one face, every job a new source: the per-source memo off) job by job in
turn, the order reversed every round. The figures are medians of the per-job
ratios to the first commit (a shared host's speed drifts: a ratio of jobs run
side by side holds better than a ratio of medians).

    .venv/bin/python bench/fusion_ab.py --base a3de810 [--also 14c9652] [--rounds 4]

Prints the table and writes bench/results/fusion_ab.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

PAIRS = [("obama", "biden"), ("biden", "obama3"), ("obama2", "astronaut"),
         ("astronaut", "obama")]
SIZES_MP = (0.5, 1.5, 4.0)
#: Fuses timed per job (after one untimed).
PER_JOB = 2


def worker() -> None:
    """Answer one JSON line per request ``{"s", "t", "mp"}``: wall and CPU ms per fuse."""
    from facefuse.fusion.types import FuseOptions
    from realism import memo_free_fuser, resize_mp

    fuser, photos = memo_free_fuser()
    jobs: dict[tuple[str, str, float], Any] = {}
    options = FuseOptions(degree=100, evaluate=False)
    print("ready", flush=True)
    for line in sys.stdin:
        q = json.loads(line)
        key = (q["s"], q["t"], q["mp"])
        if key not in jobs:
            src, tgt = photos[q["s"]], resize_mp(photos[q["t"]], q["mp"])
            jobs[key] = (src, fuser.analyser.analyse(src)[0], tgt, fuser.analyser.analyse(tgt))
        src, sf, tgt, tf = jobs[key]
        fuser.fuse_faces(src, sf, tgt, tf, [0], options)
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(PER_JOB):
            fuser.fuse_faces(src, sf, tgt, tf, [0], options)
        print(json.dumps({"wall": (time.perf_counter() - w0) * 1000 / PER_JOB,
                          "cpu": (time.process_time() - c0) * 1000 / PER_JOB}), flush=True)


def main() -> None:
    from report import rev_arguments

    ap = rev_arguments(__doc__, 4)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    from ab import rev_workers, short_rev
    from report import machine, machine_line, write_json

    revs = [short_rev(args.base), *(short_rev(r) for r in args.also), "checkout"]
    times: dict[str, dict[float, dict[str, list[float]]]] = {
        r: {mp: {"wall": [], "cpu": []} for mp in SIZES_MP} for r in revs}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workers = rev_workers(__file__, revs, Path(tmp), stack)
        for mp in SIZES_MP:
            for i in range(args.rounds):
                for s, t in PAIRS:
                    for r in (revs if i % 2 == 0 else revs[::-1]):
                        w, out = workers[r]
                        w.write(json.dumps({"s": s, "t": t, "mp": mp}) + "\n")
                        w.flush()
                        got = json.loads(out.readline())
                        for k in ("wall", "cpu"):
                            times[r][mp][k].append(got[k])
    base = revs[0]
    lines = [machine_line(machine()),
             f"Command: `.venv/bin/python bench/fusion_ab.py --base {args.base}"
             + "".join(f" --also {a}" for a in args.also) + f" --rounds {args.rounds}`.", "",
             "| target | " + " | ".join(f"{r} CPU ms" for r in revs) + " | "
             + " | ".join(f"{r} / {base} (CPU, wall)" for r in revs[1:]) + " |",
             "|---:|" + "---:|" * (2 * len(revs) - 1)]
    result: dict[str, Any] = {"revs": revs, "rounds": args.rounds, "rows": []}
    for mp in SIZES_MP:
        b = times[base][mp]
        ratios = {r: {k: statistics.median(x / y for x, y in zip(times[r][mp][k], b[k],
                                                                 strict=True))
                      for k in ("cpu", "wall")} for r in revs[1:]}
        cpu = {r: statistics.median(times[r][mp]["cpu"]) for r in revs}
        lines.append(f"| {mp:g} MP | " + " | ".join(f"{cpu[r]:.1f}" for r in revs) + " | "
                     + " | ".join(f"{ratios[r]['cpu']:.2f}, {ratios[r]['wall']:.2f}"
                                  for r in revs[1:]) + " |")
        result["rows"].append({"mp": mp, "cpu_ms": cpu, "ratios": ratios})
    write_json("fusion_ab", result)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
