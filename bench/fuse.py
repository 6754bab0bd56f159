"""Benchmark: fusion cost against target size, 1 and 2 threads.

For targets resized to 512, 1024, 2048 and 4096 px on the long side: the median
time of the fusion stage alone (faces already analysed: ``FaceFuser.fuse_faces``
without evaluation) and of the whole ``fuse()`` (decode of arrays, analysis of
source and target, fusion; evaluation off), over several source→target pairs.

    .venv/bin/python bench/fuse.py [--repeat 5] [--base REV] [--rounds 3]
    .venv/bin/python bench/fuse.py --masks [--repeat 9]
    .venv/bin/python bench/fuse.py --profile [--size 900]

Writes bench/results/fuse.json and the "fuse" section of BENCHMARKS.md. With
``--base REV`` the fusion stage of that commit (its ``src/`` exported and run in
a second process) is timed too, round by round alternating with this checkout's
own process, and the section gets a before/after table. With ``--masks``: only
the fusion stage at 1024 px, without and with relighting and the occluder masks,
interleaved pair by pair so both see the same machine load; writes
bench/results/fuse_masks.json and the "fuse-masks" section. With ``--profile``:
cProfile of the fusion stage (1 thread, targets at ``--size`` px), printed only.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import statistics
import sys
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.errors import FacefuseError
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.select import check_usable
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.samples import fetch_samples
from facefuse.toolchain.trials import AFTER, BEFORE
from report import (
    ROOT,
    answer_requests,
    ask,
    export_src,
    machine,
    machine_line,
    median_ms,
    short_rev,
    worker_at,
    write_json,
    write_section,
)

SIZES = (512, 1024, 2048, 4096)
PAIRS = (("obama", "biden"), ("biden", "astronaut"), ("astronaut", "obama2"))


def resize_long(img: np.ndarray, long_side: int) -> np.ndarray:
    scale = long_side / max(img.shape[:2])
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
    out = cv2.resize(img, None, fx=scale, fy=scale, interpolation=interp)
    return np.ascontiguousarray(out)


def compare_masks(repeat: int) -> None:
    """Fusion stage at 1024 px: the engine without relighting and occluder masks
    against the defaults, 1 and 2 threads, interleaved."""
    base = Settings.from_env()
    paths = fetch_samples(base.samples_dir, base.downloads_dir)
    images = {n: decode_image(p) for n, p in paths.items()}
    settings = {"before": dataclasses.replace(BEFORE, evaluate=False),
                "after": dataclasses.replace(AFTER, evaluate=False)}
    rows: dict[str, Any] = {}
    for threads in (1, 2):
        cv2.setNumThreads(threads)
        fuser = FaceFuser(base.replace(threads=threads))
        an = fuser.analyser
        per: dict[str, list[float]] = {k: [] for k in settings}
        for s, t in PAIRS:
            src, tgt = images[s], resize_long(images[t], 1024)
            sf, tf = an.analyse(src)[0], an.analyse(tgt)
            for name, opts in settings.items():
                per[name].append(median_ms(
                    lambda fz=fuser, src=src, sf=sf, tgt=tgt, tf=tf, o=opts: fz.fuse_faces(
                        src, sf, tgt, tf, [0], o), repeat))
        rows[f"{threads}t"] = {"threads": threads, **{k: statistics.median(v)
                                                       for k, v in per.items()},
                               "per_pair": per}
        print(rows[f"{threads}t"])
    m = machine()
    write_json("fuse_masks", {"machine": m, "repeat": repeat, "pairs": PAIRS, "rows": rows})
    lines = [
        "## Fusion stage with relighting and occluder masks (`bench/fuse.py --masks`)", "",
        machine_line(m),
        f"Command: `.venv/bin/python bench/fuse.py --masks --repeat {repeat}`. Fusion stage "
        "only (`FaceFuser.fuse_faces`, evaluation off), targets at 1024 px long side, median "
        f"over the pairs {', '.join(f'{s}→{t}' for s, t in PAIRS)} of each pair's median; "
        "before = `relight`, `reject_source_occluders`, `keep_target_occluders` off, after = "
        "the defaults, timed pair by pair in the same run (on a shared machine the absolute "
        "figures move from run to run; the ratio is the figure to read).",
        "",
        "| threads | before (ms) | after (ms) | after / before |",
        "|---:|---:|---:|---:|",
    ]
    for r in rows.values():
        lines.append(f"| {r['threads']} | {r['before']:.1f} | {r['after']:.1f} | "
                     f"{r['after'] / r['before']:.2f} |")
    write_section("fuse-masks", "\n".join(lines))
    print("\n".join(lines))


class StageTimer:
    """The fusion stage on analysed sample pairs, at a given thread count and target size."""

    def __init__(self) -> None:
        base = Settings.from_env()
        paths = fetch_samples(base.samples_dir, base.downloads_dir)
        self.images = {n: decode_image(p) for n, p in paths.items()}
        self.base = base
        self.fusers: dict[int, FaceFuser] = {}
        self.faces: dict[tuple[int, str, int], Any] = {}

    def fuser(self, threads: int) -> FaceFuser:
        cv2.setNumThreads(threads)
        if threads not in self.fusers:
            self.fusers[threads] = FaceFuser(self.base.replace(threads=threads))
        return self.fusers[threads]

    def stage_ms(self, threads: int, size: int, repeat: int,
                 opts: FuseOptions) -> list[float | None]:
        """Per pair of :data:`PAIRS`: the stage's median ms (None: target unusable)."""
        fz = self.fuser(threads)
        out: list[float | None] = []
        for s, t in PAIRS:
            src, tgt = self.images[s], resize_long(self.images[t], size)
            key = (threads, t, size)
            if key not in self.faces:
                self.faces[key] = (fz.analyser.analyse(src)[0], fz.analyser.analyse(tgt))
            sf, tf = self.faces[key]
            try:
                check_usable(tf[0], "target")
            except FacefuseError:
                out.append(None)
                continue
            out.append(median_ms(lambda fz=fz, src=src, sf=sf, tgt=tgt, tf=tf: fz.fuse_faces(
                src, sf, tgt, tf, [0], opts), repeat))
        return out


def stage_worker() -> None:
    """Answer one JSON line per request line ``{"threads", "size", "repeat"}`` on stdin
    with the per-pair stage medians (the other side of ``--base``)."""
    timer = StageTimer()
    opts = FuseOptions(degree=100, evaluate=False)
    answer_requests(lambda q: timer.stage_ms(q["threads"], q["size"], q["repeat"], opts),
                    ready=False)


def stage_worker_at(src: Path) -> AbstractContextManager[tuple[IO[str], IO[str]]]:
    """A ``--stage-worker`` process importing facefuse from ``src``."""
    return worker_at(__file__, "--stage-worker", src)


def compare_base(rev: str, repeat: int, rounds: int) -> dict[str, Any]:
    """Fusion stage of ``rev`` and of this checkout, each in its own process, the two
    alternating size by size in every round; medians over rounds of the per-pair
    median over pairs."""
    per: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp, \
            stage_worker_at(export_src(rev, Path(tmp))) as old, \
            stage_worker_at(ROOT / "src") as new:
        for _ in range(rounds):
            for threads in (1, 2):
                for size in SIZES:
                    for side, worker in (("before", old), ("after", new)):
                        got = [v for v in ask(worker, {"threads": threads, "size": size,
                                                       "repeat": repeat}) if v is not None]
                        if got:
                            per[side].setdefault(f"{threads}t_{size}", []).append(
                                statistics.median(got))
    rows = {k: {"before_ms": statistics.median(per["before"][k]),
                "after_ms": statistics.median(per["after"][k]),
                "rounds_before": per["before"][k], "rounds_after": per["after"][k]}
            for k in per["after"] if k in per["before"]}
    return {"base": short_rev(rev), "rounds": rounds, "rows": rows}


def profile(size: int, repeat: int) -> None:
    """cProfile of the fusion stage at 1 thread, targets at ``size`` px (long side)."""
    timer = StageTimer()
    opts = FuseOptions(degree=80, evaluate=False)
    timer.stage_ms(1, size, 1, opts)  # analyse and warm up
    prof = cProfile.Profile()
    prof.enable()
    timer.stage_ms(1, size, repeat, opts)
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--masks", action="store_true",
                    help="only compare the fusion stage without and with the masks")
    ap.add_argument("--base", help="also time the fusion stage of this commit, side by side")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds with --base")
    ap.add_argument("--profile", action="store_true", help="cProfile the fusion stage")
    ap.add_argument("--size", type=int, default=900, help="target long side with --profile")
    ap.add_argument("--stage-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stage_worker:
        stage_worker()
        return
    if args.profile:
        profile(args.size, args.repeat)
        return
    if args.masks:
        compare_masks(args.repeat)
        return
    side_by_side = compare_base(args.base, args.repeat, args.rounds) if args.base else None
    base = Settings.from_env()
    paths = fetch_samples(base.samples_dir, base.downloads_dir)
    images = {n: decode_image(p) for n, p in paths.items()}
    opts = FuseOptions(degree=100, evaluate=False)
    rows: dict[str, Any] = {}
    for threads in (1, 2):
        cv2.setNumThreads(threads)
        fuser = FaceFuser(base.replace(threads=threads))
        an = fuser.analyser
        for size in SIZES:
            stage, whole, face_px = [], [], []
            for s, t in PAIRS:
                src = images[s]
                tgt = resize_long(images[t], size)
                sf, tf = an.analyse(src)[0], an.analyse(tgt)
                try:
                    check_usable(tf[0], "target")
                except FacefuseError:
                    continue  # too small at this size: fuse() refuses it, nothing to time
                face_px.append(tf[0].width)
                stage.append(median_ms(
                    lambda fz=fuser, src=src, sf=sf, tgt=tgt, tf=tf: fz.fuse_faces(
                        src, sf, tgt, tf, [0], opts), args.repeat))
                whole.append(median_ms(
                    lambda fz=fuser, src=src, tgt=tgt: fz.fuse(src, tgt, opts), args.repeat))
            rows[f"{threads}t_{size}"] = {
                "threads": threads, "long_side": size,
                "pairs_timed": len(stage),
                "fusion_stage_ms": statistics.median(stage), "fuse_ms": statistics.median(whole),
                "face_width_px": statistics.median(face_px),
                "per_pair_stage_ms": stage, "per_pair_fuse_ms": whole,
            }
            print(rows[f"{threads}t_{size}"])
    m = machine()
    write_json("fuse", {"machine": m, "repeat": args.repeat, "pairs": PAIRS, "rows": rows,
                        "side_by_side": side_by_side})
    lines = [
        "## Fusion (`bench/fuse.py`)", "", machine_line(m),
        f"Command: `.venv/bin/python bench/fuse.py --repeat {args.repeat}`. Median over the "
        f"pairs {', '.join(f'{s}→{t}' for s, t in PAIRS)} of each pair's median; source photos "
        "at their own size, targets resized to the long side shown; degree 100, evaluation off.",
        "",
        "| threads | target long side | face width (px) | fusion stage (ms) | whole fuse() (ms) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in rows.values():
        lines.append(f"| {r['threads']} | {r['long_side']} | {r['face_width_px']:.0f} | "
                     f"{r['fusion_stage_ms']:.1f} | {r['fuse_ms']:.1f} |")
    if side_by_side is not None:
        lines += base_lines(side_by_side, args.repeat)
    write_section("fuse", "\n".join(lines))
    print("\n".join(lines))


def base_lines(res: dict[str, Any], repeat: int) -> list[str]:
    """The before/after table of :func:`compare_base`."""
    lines = [
        "", f"Fusion stage before (`{res['base']}`) and after (this checkout), side by side: "
        f"`.venv/bin/python bench/fuse.py --repeat {repeat} --base {res['base']} --rounds "
        f"{res['rounds']}`. Each side in its own process, the two alternating size by size "
        f"in each of {res['rounds']} rounds; median over rounds of the median over pairs "
        "(degree 100, evaluation off). On a shared machine the absolute figures move; "
        "the ratio is the figure to read.", "",
        "| threads | target long side | before (ms) | after (ms) | after / before |",
        "|---:|---:|---:|---:|---:|",
    ]
    for key, r in res["rows"].items():
        threads, size = key.split("_")
        lines.append(f"| {threads[:-1]} | {size} | {r['before_ms']:.1f} | {r['after_ms']:.1f} | "
                     f"{r['after_ms'] / r['before_ms']:.2f} |")
    return lines


if __name__ == "__main__":
    main()
