"""Benchmark: what the ``auto`` detector policy costs against BlazeFace alone.

Under ``detector="auto"`` every analyser and server loads both detectors, and
runs YuNet where every face is wanted. Each configuration runs in a fresh
process: load the face models (``FaceAnalyser``), then detect on a 1280×720
synthetic group for each purpose (``largest``: sources and ``mode=one``;
``all``: ``mode=many``, listings). Figures: RSS (VmRSS) the models add, RSS
after loading and peak RSS (VmHWM) after detecting, MB; median detect ms per
purpose (``--repeat`` runs each); medians over ``--runs`` processes per
configuration, interleaved.

    .venv/bin/python bench/detector_policy.py [--runs 3] [--repeat 9]

Writes the "detector_policy" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import machine, machine_line, publish

CHILD = r"""
import json, statistics, sys, time
from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.detectors import PURPOSES
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.detection_sets import fetch_face_free, group_photo
from facefuse.toolchain.samples import fetch_samples

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) / 1024.0
    raise KeyError(field)

s = Settings.from_env(threads=1, precision="fp32", detector=sys.argv[1])
photos = {n: decode_image(p) for n, p in fetch_samples(s.samples_dir, s.downloads_dir).items()}
free_paths = fetch_face_free(s.home / "face-free", s.downloads_dir)
free = {n: decode_image(p) for n, p in free_paths.items()}
image = group_photo(photos, free, seed=1).image
before = status("VmRSS")
an = FaceAnalyser(s)
loaded = status("VmRSS")
ms = {}
for p in PURPOSES:
    an.detect(image, p)
    runs = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter()
        an.detect(image, p)
        runs.append((time.perf_counter() - t) * 1000.0)
    ms[p] = statistics.median(runs)
print(json.dumps({"load": loaded - before, "rss": loaded, "peak": status("VmHWM"),
                  "largest": ms["largest"], "all": ms["all"]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    configs = ("full", "auto")
    rows: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    for _ in range(args.runs):
        for c in configs:
            out = subprocess.run([sys.executable, "-c", CHILD, c, str(args.repeat)], check=True,
                                 capture_output=True, text=True).stdout
            rows[c].append(json.loads(out.strip().splitlines()[-1]))
    keys = ("load", "rss", "peak", "largest", "all")
    med = {c: {k: statistics.median(r[k] for r in rows[c]) for k in keys} for c in configs}
    lines = [
        "## The detector policy: memory and detect time (`bench/detector_policy.py`)", "",
        f"`.venv/bin/python bench/detector_policy.py --runs {args.runs} --repeat "
        f"{args.repeat}`: each setting in a fresh process, {args.runs} processes each, "
        "interleaved; 1280×720 synthetic group (`group_photo`, seed 1), FP32, 1 thread. "
        "`largest` = the detector a source or a `mode=one` target runs, `all` = the one "
        "a `mode=many` target or `/v1/faces` runs.", "",
        machine_line(machine()) + " Shared machine: compare the rows, not the absolute "
        "figures.", "",
        "| `FACEFUSE_DETECTOR` | RSS the face models add, MB | RSS after loading, MB | "
        "peak RSS after detecting, MB | detect ms, `largest` | detect ms, `all` |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in configs:
        m = med[c]
        lines.append(f"| {c} | {m['load']:.1f} | {m['rss']:.1f} | {m['peak']:.1f} | "
                     f"{m['largest']:.1f} | {m['all']:.1f} |")
    extra = {k: med["auto"][k] - med["full"][k] for k in ("load", "peak")}
    lines += ["", f"`auto` loads YuNet beside BlazeFace: +{extra['load']:.1f} MB resident "
              f"after loading, +{extra['peak']:.1f} MB "
              "peak once YuNet has run (its activations; a lazy load would not avoid that "
              "either). The `largest` path runs the same BlazeFace as `full`."]
    publish("detector_policy", lines)


if __name__ == "__main__":
    main()
