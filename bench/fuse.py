"""Benchmark: fusion cost against target size, 1 and 2 threads.

For targets resized to 512, 1024, 2048 and 4096 px on the long side: the median
time of the fusion stage alone (faces already analysed: ``FaceFuser.fuse_faces``
without evaluation) and of the whole ``fuse()`` (decode of arrays, analysis of
source and target, fusion; evaluation off), over several source→target pairs.

    .venv/bin/python bench/fuse.py [--repeat 5]

Writes bench/results/fuse.json and the "fuse" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
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
from report import machine, machine_line, median_ms, write_json, write_section

SIZES = (512, 1024, 2048, 4096)
PAIRS = (("obama", "biden"), ("biden", "astronaut"), ("astronaut", "obama2"))


def resize_long(img: np.ndarray, long_side: int) -> np.ndarray:
    scale = long_side / max(img.shape[:2])
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
    out = cv2.resize(img, None, fx=scale, fy=scale, interpolation=interp)
    return np.ascontiguousarray(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
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
