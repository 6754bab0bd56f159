"""Benchmark: facial hair and glasses as regions, before/after in one run.

On realistic variants of the sample photos (real scalp hair transplanted as a
beard, moustache or stubble; clear glasses of real darkened pixels with lens
reflections: ``facefuse.toolchain.synthetic``), fused at degree 100:

* target's hair / frames kept (share of their pixels unchanged; goal ≥ 0.95);
* source's hair leaked (share of its luma change reaching the output; goal ≤ 0.05)
  and the darkening (grey levels) it leaves on the clean-shaven target's beard
  zone; the source's frames leaked (``occluder_leak``; goal ≤ 0.05).

"Before" is the colour-outlier occluder mask alone (options `glasses` and
`facial_hair` off), "after" the occluder mask with both regions.

    .venv/bin/python bench/regions.py [--sheets PREFIX]

Writes bench/results/regions.json and the "regions" section of BENCHMARKS.md;
``--sheets`` also writes, per pair, 1:1 crops of the target's face: top row the
target wearing a beard, stubble, metal glasses fused (before, after each);
bottom row the clean-shaven, glasses-free target fused with a source wearing
them (before, after each).
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
from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import decode_image
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.samples import fetch_samples
from facefuse.toolchain.synthetic import FACIAL_HAIR_KINDS, FRAME_KINDS
from facefuse.toolchain.trials import (
    REGIONS,
    Sample,
    facial_hair_leak_trial,
    facial_hair_survival_trial,
    glasses_leak_trial,
    glasses_survival_trial,
)
from report import machine, machine_line, publish, write_json

#: (source, target, donor of the hair or frame pixels): every identity in each role;
#: the donors with scalp hair above the forehead (obama: short black, astronaut:
#: brown), each onto dark and light skin.
PAIRS = (("obama", "biden", "astronaut"), ("astronaut", "obama2", "obama"),
         ("biden", "astronaut", "obama"), ("obama2", "obama3", "astronaut"))


#: The classic swapper's occluders without the regions (the "before").
NO_REGIONS = FuseOptions(glasses=False, facial_hair="off")


def crop(img: np.ndarray, s: Sample) -> np.ndarray:
    """The face's 1:1 crop (lower face and eyes; no resampling)."""
    lm = s.landmarks
    x0, y0 = lm[:, :2].min(0)
    x1, y1 = lm[:, :2].max(0)
    p = 0.1 * (x1 - x0)
    return img[int(max(0, y0 - p)):int(y1 + p), int(max(0, x0 - p)):int(x1 + p)]


def run(fuser: FaceFuser, samples: dict[str, Sample], sheets: Path | None) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for src, tgt, donor in PAIRS:
        s, t, dn = samples[src], samples[tgt], samples[donor]
        kept_row: list[np.ndarray] = []
        leak_row: list[np.ndarray] = []
        for kind in FACIAL_HAIR_KINDS:
            res: dict[str, Any] = {}
            for label, opts in (("before", NO_REGIONS), ("after", REGIONS)):
                kept, out_k = facial_hair_survival_trial(fuser, s, t, kind, dn, opts)
                leak, dark, against, out_l = facial_hair_leak_trial(fuser, s, t, kind, dn, opts)
                res[label] = {"kept": kept, "leaked": leak, "darkening": dark,
                              "darker_than_target": against}
                if kind != "moustache":
                    kept_row.append(crop(out_k, t))
                    leak_row.append(crop(out_l, t))
            rows[f"{src}->{tgt} {kind} ({donor})"] = res
        for frame in FRAME_KINDS:
            res = {}
            for label, opts in (("before", NO_REGIONS), ("after", REGIONS)):
                kept, out_k = glasses_survival_trial(fuser, s, t, frame, dn, opts)
                leak, out_l = glasses_leak_trial(fuser, s, t, frame, dn, opts)
                res[label] = {"kept": kept, "leaked": leak}
                if frame == "metal":
                    kept_row.append(crop(out_k, t))
                    leak_row.append(crop(out_l, t))
            rows[f"{src}->{tgt} {frame} glasses ({donor})"] = res
        if sheets is not None:
            path = sheets.parent / f"{sheets.name}_{src}_{tgt}.png"
            cv2.imwrite(str(path), cv2.cvtColor(_sheet([kept_row, leak_row]), cv2.COLOR_RGB2BGR))
        print(src, tgt, "done", flush=True)
    return rows


def _sheet(rows: list[list[np.ndarray]]) -> np.ndarray:
    """Tiles side by side, rows stacked, padded black (no resampling)."""
    lines = []
    for tiles in rows:
        h = max(x.shape[0] for x in tiles)
        lines.append(np.hstack([np.pad(x, ((0, h - x.shape[0]), (0, 4), (0, 0))) for x in tiles]))
    w = max(x.shape[1] for x in lines)
    return np.vstack([np.pad(x, ((0, 4), (0, w - x.shape[1]), (0, 0))) for x in lines])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sheets", type=Path, default=None,
                    help="path prefix: writes PREFIX_<source>_<target>.png")
    args = ap.parse_args()
    settings = Settings.from_env(threads=1, precision="fp32")
    paths = fetch_samples(settings.samples_dir, settings.downloads_dir)
    analyser = FaceAnalyser(settings, ModelRegistry(settings))
    fuser = FaceFuser(settings, analyser)
    samples = {n: Sample(img, analyser.analyse(img, embed=False))
               for n, img in ((n, decode_image(p)) for n, p in paths.items())}
    rows = run(fuser, samples, args.sheets)
    write_json("regions", {"machine": machine(), "rows": rows})
    lines = ["## regions", "",
             "Facial hair and clear glasses on realistic variants (real scalp hair as a beard,",
             "moustache or stubble; frames of real darkened pixels with lens reflections), degree",
             "100. Before: the colour-outlier occluder mask alone; after: with the regions.",
             "kept: share of the target's hair/frame pixels unchanged (goal ≥ 0.95); leaked:",
             "share of the source's that reaches the output (goal ≤ 0.05); dark: grey levels the",
             "source's hair takes off the clean-shaven target's beard zone (against fusing the",
             "clean source); vs target: grey levels that zone ends darker than the target's own.",
             "",
             f"Machine: {machine_line(machine())} (shared with other work).", "",
             "| trial | kept before | kept after | leaked before | leaked after "
             "| dark before | dark after | vs target before | vs target after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        b, a = r["before"], r["after"]
        dark = (f"{b['darkening']:.1f} | {a['darkening']:.1f} | "
                f"{b['darker_than_target']:.1f} | {a['darker_than_target']:.1f}"
                if "darkening" in b else "– | – | – | –")
        lines.append(f"| {name} | {b['kept']:.2f} | {a['kept']:.2f} | {b['leaked']:.3f} "
                     f"| {a['leaked']:.3f} | {dark} |")
    for label in ("before", "after"):
        kept = [r[label]["kept"] for r in rows.values()]
        leak = [r[label]["leaked"] for r in rows.values()]
        lines.append(f"\n{label}: kept median {statistics.median(kept):.2f} worst {min(kept):.2f};"
                     f" leaked median {statistics.median(leak):.3f} worst {max(leak):.3f}")
    publish("regions", lines)


if __name__ == "__main__":
    main()
