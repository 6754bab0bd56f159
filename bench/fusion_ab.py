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

import statistics
import tempfile
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
    from report import answer_requests, wall_cpu_ms

    fuser, photos = memo_free_fuser()
    jobs: dict[tuple[str, str, float], Any] = {}
    options = FuseOptions(degree=100, evaluate=False)

    def handle(q: dict[str, Any]) -> dict[str, float]:
        key = (q["s"], q["t"], q["mp"])
        if key not in jobs:
            src, tgt = photos[q["s"]], resize_mp(photos[q["t"]], q["mp"])
            jobs[key] = (src, fuser.analyser.analyse(src)[0], tgt, fuser.analyser.analyse(tgt))
        src, sf, tgt, tf = jobs[key]
        fuser.fuse_faces(src, sf, tgt, tf, [0], options)
        return wall_cpu_ms(lambda: fuser.fuse_faces(src, sf, tgt, tf, [0], options), PER_JOB)

    answer_requests(handle)


def main() -> None:
    from report import rev_arguments

    ap = rev_arguments(__doc__, 4)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    from report import (
        alternate,
        ask,
        machine,
        machine_line,
        paired_ratio,
        rev_workers,
        revs_to_time,
        write_json,
    )

    revs = revs_to_time(args.base, args.also)
    times: dict[str, dict[float, dict[str, list[float]]]] = {
        r: {mp: {"wall": [], "cpu": []} for mp in SIZES_MP} for r in revs}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        workers = rev_workers(__file__, revs, Path(tmp), stack)
        for mp in SIZES_MP:
            for i in range(args.rounds):
                for s, t in PAIRS:
                    for r in alternate(revs, i):
                        got = ask(workers[r], {"s": s, "t": t, "mp": mp})
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
        ratios = {r: {k: paired_ratio(times[r][mp][k], b[k]) for k in ("cpu", "wall")}
                  for r in revs[1:]}
        cpu = {r: statistics.median(times[r][mp]["cpu"]) for r in revs}
        lines.append(f"| {mp:g} MP | " + " | ".join(f"{cpu[r]:.1f}" for r in revs) + " | "
                     + " | ".join(f"{ratios[r]['cpu']:.2f}, {ratios[r]['wall']:.2f}"
                                  for r in revs[1:]) + " |")
        result["rows"].append({"mp": mp, "cpu_ms": cpu, "ratios": ratios})
    write_json("fusion_ab", result)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
