"""Benchmark: fusion cost against target size, 1 and 2 threads.

For targets resized to 512, 1024, 2048 and 4096 px on the long side: the median
time of the fusion stage alone (faces already analysed: ``FaceFuser.fuse_faces``
without evaluation) and of the whole ``fuse()`` (decode of arrays, analysis of
source and target, fusion; evaluation off), over several source→target pairs.

    .venv/bin/python bench/fuse.py [--repeat 5]
    .venv/bin/python bench/fuse.py --masks [--repeat 9]

Writes bench/results/fuse.json and the "fuse" section of BENCHMARKS.md. With
``--masks``: only the fusion stage at 1024 px, without and with relighting and
the occluder masks, interleaved pair by pair so both see the same machine load;
writes bench/results/fuse_masks.json and the "fuse-masks" section.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path
from typing import Any

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
from report import machine, machine_line, median_ms, write_json, write_section

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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--masks", action="store_true",
                    help="only compare the fusion stage without and with the masks")
    args = ap.parse_args()
    if args.masks:
        compare_masks(args.repeat)
        return
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
    write_json("fuse", {"machine": m, "repeat": args.repeat, "pairs": PAIRS, "rows": rows})
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
    write_section("fuse", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
