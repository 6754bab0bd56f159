"""Benchmark: background independence and visible area per yaw difference.

Turned pairs from the sample photos and their mirror images (a mirrored photo
turns the head the other way, so a source and a mirrored target of the same
yaw are that yaw apart twice): every ordered pair of different people, the
source an original photo, the target an original or a mirrored one. Per pair,
in one run:

* the background trial of :mod:`facefuse.toolchain.trials` (repaint everything of
  the source outside its face outline flat, fuse again: the share of the
  changed output pixels that change by more than 25 levels; 0 = nothing comes
  from beyond the source's face), before (relighting and occluder masks off)
  and after (defaults);
* ``visible_fraction`` (:mod:`facefuse.fusion.visibility`): the share of the
  target face's area the source shows well.

    .venv/bin/python bench/yaw_pairs.py

Writes bench/results/yaw_pairs.json and the "yaw-pairs" section of BENCHMARKS.md.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.geometry import relative_pose
from facefuse.fusion.visibility import visible_fraction
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.samples import fetch_samples, identity_of
from facefuse.toolchain.trials import AFTER, BEFORE, Sample, background_trial
from report import machine, machine_line, publish, write_json

#: Yaw-difference buckets (degrees, lower edges).
BUCKETS = (0.0, 10.0, 20.0)


def label(lo: float) -> str:
    """The bucket starting at ``lo``: ``10–20°``, or ``≥ 20°`` for the last."""
    hi = next((b for b in BUCKETS if b > lo), None)
    return f"{lo:.0f}–{hi:.0f}°" if hi is not None else f"≥ {lo:.0f}°"


def main() -> None:
    settings = Settings.from_env(threads=1, precision="fp32")
    fuser = FaceFuser(settings)
    photos = {n: decode_image(p) for n, p in
              fetch_samples(settings.samples_dir, settings.downloads_dir).items()}
    samples: dict[str, Sample] = {}
    for name, img in photos.items():
        for tag, im in ((name, img), (f"{name}-mirrored", np.ascontiguousarray(img[:, ::-1]))):
            faces = fuser.analyser.analyse(im, embed=False)
            if faces and faces[0].landmarks is not None:
                samples[tag] = Sample(im, faces)
    rows: list[dict[str, Any]] = []
    for s in photos:
        for t in samples:
            if identity_of(t.removesuffix("-mirrored")) == identity_of(s) or s not in samples:
                continue
            src, tgt = samples[s], samples[t]
            yaw = abs(relative_pose(src.landmarks, tgt.landmarks)[0])
            rows.append({
                "source": s, "target": t, "yaw_diff": yaw,
                "visible_fraction": visible_fraction(src.landmarks, tgt.landmarks),
                "background_before": background_trial(fuser, src, tgt, BEFORE)[0],
                "background_after": background_trial(fuser, src, tgt, AFTER)[0],
            })
    groups: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[max(b for b in BUCKETS if r["yaw_diff"] >= b)].append(r)
    m = machine()
    write_json("yaw_pairs", {"machine": m, "rows": rows})
    lines = [
        "## Background independence per yaw difference (`bench/yaw_pairs.py`)", "",
        "`.venv/bin/python bench/yaw_pairs.py`; every ordered pair of different people, "
        "source an original sample photo, target an original or a mirrored one "
        f"({len(rows)} pairs). Background: the share of the output's changed pixels that "
        "change by more than 25 levels when everything of the source outside its face "
        "outline is repainted flat (0 = nothing from beyond the source's face); before = "
        "relighting and occluder masks off, after = defaults. Visible: the share of the "
        "target face's area the source shows well. Cells: median / worst.", "",
        machine_line(m) + " Shared machine.", "",
        "| yaw difference | pairs | background before | background after | visible |",
        "|---|---|---|---|---|",
    ]
    for lo in sorted(groups):
        g = groups[lo]

        def fig(k: str, worst: str, g: list[dict[str, Any]] = g) -> str:
            v = [r[k] for r in g]
            w = max(v) if worst == "max" else min(v)
            return f"{float(np.median(v)):.4f} / {w:.4f}"
        lines.append(f"| {label(lo)} | {len(g)} | {fig('background_before', 'max')} | "
                     f"{fig('background_after', 'max')} | {fig('visible_fraction', 'min')} |")
    lines += ["", "The sample photos turn at most about 13°, so the largest differences "
              "available are about 25°; turned pairs beyond that need other photos."]
    publish("yaw-pairs", lines)


if __name__ == "__main__":
    main()
