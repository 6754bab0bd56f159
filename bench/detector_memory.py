"""Benchmark: what loading YuNet beside BlazeFace costs in resident memory.

Under ``detector="auto"`` every analyser and server loads both detectors. Each
configuration runs in a fresh process: load the face models (``FaceAnalyser``),
then detect once on a 1280×720 synthetic group for every purpose; RSS (VmRSS)
after loading and peak RSS (VmHWM) after detecting, MB, median of ``--runs``
processes per configuration, interleaved.

    .venv/bin/python bench/detector_memory.py [--runs 3]

Prints a Markdown table (the figures are quoted in BENCHMARKS.md "groups").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys
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
for p in PURPOSES:
    an.detect(image, p)
print(json.dumps({"load": loaded - before, "rss": loaded, "peak": status("VmHWM")}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    configs = ("full", "auto")
    rows: dict[str, list[dict[str, float]]] = {c: [] for c in configs}
    for _ in range(args.runs):
        for c in configs:
            out = subprocess.run([sys.executable, "-c", CHILD, c], check=True,
                                 capture_output=True, text=True).stdout
            rows[c].append(json.loads(out.strip().splitlines()[-1]))
    print("| detector | models loaded, MB | RSS after loading, MB | peak RSS after detecting, MB |")
    print("|---|---:|---:|---:|")
    for c in configs:
        med = {k: statistics.median(r[k] for r in rows[c]) for k in ("load", "rss", "peak")}
        print(f"| {c} | {med['load']:.1f} | {med['rss']:.1f} | {med['peak']:.1f} |")


if __name__ == "__main__":
    main()
