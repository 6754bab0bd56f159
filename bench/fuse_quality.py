"""Fusion quality on every ordered pair of distinct identities among the samples.

For each pair: identity similarity of the output to the source at degrees
0/25/50/75/100, similarity to the target at 100, identity retrieval top-1 over
the sample identities, head-pose and openness differences, seam ratio.

Then, in the same run, "before" (relighting and both occluder masks off: the
engine as it was without them) against "after" (the defaults) at degree 100:
boundary tone ΔE and detail ratio on every pair, and on synthetic variants
(:mod:`facefuse.toolchain.synthetic`): occluder survival (an occluder over the target),
occluder leak (one over the source), the lighting gradient left (a source
relit by a known gradient) and background independence (the source's
background repainted flat).

    .venv/bin/python bench/fuse_quality.py

Writes bench/results/fuse_quality.json, the "fuse-quality" section of
BENCHMARKS.md, and before/after contact sheets out/fuse_quality_pairs.jpg
(every pair) and out/fuse_quality_variants.jpg (occluders and relit sources).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.faces.types import Face
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.geometry import head_pose
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.color import detail_energy
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.measures import boundary_delta_e
from facefuse.toolchain.samples import SAMPLES, fetch_samples, identity_of
from facefuse.toolchain.synthetic import OCCLUDER_KINDS
from facefuse.toolchain.trials import (
    AFTER,
    BEFORE,
    GRADIENT_STRENGTH,
    Sample,
    background_trial,
    leak_trial,
    lighting_trial,
    survival_trial,
)
from report import ROOT, machine, machine_line, parser, write_json, write_section

DEGREES = (0, 25, 50, 75, 100)
SETTINGS = {"before": BEFORE, "after": AFTER}
#: Pairs (source, target, donor of the occluder textures) shown on the variants sheet.
SHEET_PAIRS = (("obama", "biden", "astronaut"), ("astronaut", "obama2", "biden"),
               ("biden", "astronaut", "obama"))
SHEET = ROOT / "out"


def crop(image: np.ndarray, face: Face, size: int = 256) -> np.ndarray:
    """The face's neighbourhood of ``image``, square, ``size`` pixels."""
    x0, y0, x1, y1 = (int(v) for v in face.bbox)
    p = int(0.3 * (x1 - x0))
    c = image[max(0, y0 - p):y1 + p, max(0, x0 - p):x1 + p]
    return np.ascontiguousarray(cv2.resize(c, (size, size), interpolation=cv2.INTER_AREA))


def save_sheet(path: Path, rows: list[list[np.ndarray]]) -> None:
    width = max(len(r) for r in rows)
    blank = np.full_like(rows[0][0], 255)
    img = np.concatenate([np.concatenate(r + [blank] * (width - len(r)), 1) for r in rows], 0)
    path.parent.mkdir(exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 88])


def pair_row(fuser: FaceFuser, images: dict[str, np.ndarray], faces: dict[str, list[Face]],
             s: str, t: str, gallery: dict[str, np.ndarray], base: FuseOptions
             ) -> tuple[dict[str, Any], np.ndarray]:
    """One pair's identity sweep and degree-100 figures under ``base`` options."""
    an = fuser.analyser
    sims = [float(np.dot(faces[t][0].embedding, faces[s][0].embedding))]
    for d in DEGREES[1:]:
        r = fuser.fuse_faces(images[s], faces[s][0], images[t], faces[t], [0],
                             dataclasses.replace(base, degree=float(d)))
        sims.append(r.quality["id_sim_source"])
    q = r.quality
    emb = an.analyse(r.image)[0].embedding
    top1 = max(gallery, key=lambda i: float(np.dot(emb, gallery[i])))
    ff = r.fused[0]
    lm = ff.target_face.landmarks.astype(np.float64)
    # Boundary tone: the fused skin inside the blend edge against the target's just
    # outside; the unfused target measured the same way is the natural level.
    de = boundary_delta_e(r.image, images[t], ff.mask, ff.region, lm)
    own = boundary_delta_e(images[t], images[t], ff.mask, ff.region, lm)
    x0, y0, x1, y1 = ff.region
    inner = ff.mask >= 0.9
    detail = (detail_energy(r.image[y0:y1, x0:x1], inner)
              / max(1e-6, detail_energy(images[t][y0:y1, x0:x1], inner)))
    return {"source": s, "target": t, "id_sim_source": sims,
            "id_sim_target": q["id_sim_target"], "top1": top1,
            "top1_ok": top1 == identity_of(s),
            "pose_diff": max(q["yaw_diff"], q["pitch_diff"], q["roll_diff"]),
            "mouth_diff": q["mouth_diff"], "eye_diff": q["eye_diff"],
            "seam_ratio": q["seam_ratio"], "fuse_ms": r.timings_ms.get("fuse", 0.0),
            "boundary_de": de, "boundary_de_excess": abs(de - own),
            "detail_ratio": detail}, r.image


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def med_max(key: str) -> tuple[float, float]:
        vals = [r[key] for r in rows]
        return statistics.median(vals), max(vals)

    return {
        "nearer": sum(r["id_sim_source"][-1] > r["id_sim_target"] for r in rows),
        "monotone": sum(all(b >= a - 0.01 for a, b in itertools.pairwise(r["id_sim_source"]))
                        for r in rows),
        "top1": sum(r["top1_ok"] for r in rows),
        **{k: med_max(k) for k in ("pose_diff", "mouth_diff", "eye_diff", "seam_ratio",
                                   "boundary_de", "boundary_de_excess", "detail_ratio")},
    }


def variant_rows(fuser: FaceFuser, samples: dict[str, Sample], pairs: list[tuple[str, str]]
                 ) -> tuple[list[dict[str, Any]], list[list[np.ndarray]]]:
    """Occluder survival / leak and lighting on every pair, before and after;
    the sheet rows of :data:`SHEET_PAIRS`."""
    rows: list[dict[str, Any]] = []
    sheet: list[list[np.ndarray]] = []
    donors = {identity_of(n): n for n in SAMPLES}
    for s, t in pairs:
        donor = next(n for i, n in donors.items() if i not in (identity_of(s), identity_of(t)))
        on_sheet = any((s, t) == (a, b) for a, b, _ in SHEET_PAIRS)
        for kind in OCCLUDER_KINDS:
            row: dict[str, Any] = {"source": s, "target": t, "trial": kind}
            tiles_t, tiles_s = [], []
            for name, opts in SETTINGS.items():
                surv, out_t = survival_trial(fuser, samples[s], samples[t], kind,
                                             samples[donor], opts)
                leak, out_s = leak_trial(fuser, samples[s], samples[t], kind,
                                         samples[donor], opts)
                row[f"survival_{name}"], row[f"leak_{name}"] = surv, leak
                tiles_t.append(crop(out_t, samples[t].faces[0]))
                tiles_s.append(crop(out_s, samples[t].faces[0]))
            rows.append(row)
            if on_sheet:
                sheet += [tiles_t, tiles_s]
        row = {"source": s, "target": t, "trial": "background",
               "yaw_diff": abs(head_pose(samples[s].landmarks)[0]
                               - head_pose(samples[t].landmarks)[0])}
        for name, opts in SETTINGS.items():
            row[f"background_{name}"] = background_trial(fuser, samples[s], samples[t], opts)[0]
        rows.append(row)
        row = {"source": s, "target": t, "trial": "gradient"}
        tiles = []
        for name, opts in SETTINGS.items():
            res = lighting_trial(fuser, samples[s], samples[t], opts)
            row[f"gradient_left_{name}"] = res[0] if res else float("nan")
            if res:
                tiles.append(crop(res[1], samples[t].faces[0]))
        rows.append(row)
        if on_sheet and tiles:
            sheet.append(tiles)
    return rows, sheet


def main() -> None:
    parser(__doc__).parse_args()
    settings = Settings.from_env(precision="fp32")
    paths = fetch_samples(settings.samples_dir, settings.downloads_dir)
    fuser = FaceFuser(settings)
    an = fuser.analyser
    images = {n: decode_image(p) for n, p in paths.items()}
    faces = {n: an.analyse(img) for n, img in images.items()}
    ids = sorted({identity_of(n) for n in SAMPLES})
    gallery = {i: np.mean([faces[n][0].embedding for n in SAMPLES if identity_of(n) == i], 0)
               for i in ids}
    pairs = [(s, t) for s, t in itertools.permutations(SAMPLES, 2)
             if identity_of(s) != identity_of(t)]
    by_setting: dict[str, list[dict[str, Any]]] = {k: [] for k in SETTINGS}
    sheet: list[list[np.ndarray]] = []
    for s, t in pairs:
        tiles = [crop(images[s], faces[s][0]), crop(images[t], faces[t][0])]
        for name, opts in SETTINGS.items():
            row, out = pair_row(fuser, images, faces, s, t, gallery, opts)
            by_setting[name].append(row)
            tiles.append(crop(out, faces[t][0]))
        sheet.append(tiles)
    save_sheet(SHEET / "fuse_quality_pairs.jpg", sheet)
    samples = {n: Sample(images[n], faces[n]) for n in SAMPLES}
    variants, vsheet = variant_rows(fuser, samples, pairs)
    save_sheet(SHEET / "fuse_quality_variants.jpg", vsheet)
    rows = by_setting["after"]
    m = machine()
    write_json("fuse_quality", {"machine": m, "rows": rows, "rows_before": by_setting["before"],
                                "variants": variants})
    sums = {k: summary(v) for k, v in by_setting.items()}

    lines = [
        "## Fusion quality (`bench/fuse_quality.py`)", "", machine_line(m),
        "Command: `.venv/bin/python bench/fuse_quality.py`. Every ordered pair of distinct "
        f"identities among the samples ({len(rows)} pairs), classic swapper, multi-band blend, "
        "default options (relighting and both occluder masks on); per-pair table below.",
        "",
        "| source → target | id sim to source at 0 / 25 / 50 / 75 / 100 | to target at 100 | "
        "top-1 | pose Δ° | mouth Δ | eye Δ | seam ratio | boundary ΔE | detail ratio |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        sims = " / ".join(f"{v:.3f}" for v in r["id_sim_source"])
        lines.append(f"| {r['source']} → {r['target']} | {sims} | {r['id_sim_target']:.3f} | "
                     f"{r['top1']} | {r['pose_diff']:.1f} | {r['mouth_diff']:.3f} | "
                     f"{r['eye_diff']:.3f} | {r['seam_ratio']:.2f} | {r['boundary_de']:.1f} | "
                     f"{r['detail_ratio']:.2f} |")
    n = len(rows)
    lines += [
        "",
        "Before → after, in the same run (before = `relight`, `reject_source_occluders` and "
        "`keep_target_occluders` off):",
        "",
        "| figure | before | after |",
        "|---|---:|---:|",
        f"| identity non-decreasing with degree (tolerance 0.01) | {sums['before']['monotone']}/{n}"
        f" | {sums['after']['monotone']}/{n} |",
        f"| output nearer the source than the target at 100 | {sums['before']['nearer']}/{n} | "
        f"{sums['after']['nearer']}/{n} |",
        f"| ID retrieval top-1 | {sums['before']['top1']}/{n} | {sums['after']['top1']}/{n} |",
    ]
    for key, label, fmt in (("pose_diff", "pose Δ° (median / worst)", ".1f"),
                            ("mouth_diff", "mouth openness Δ", ".3f"),
                            ("eye_diff", "eye openness Δ", ".3f"),
                            ("seam_ratio", "seam ratio", ".2f"),
                            ("boundary_de", "boundary tone ΔE (L*a*b*, inside vs outside "
                             "the blend edge)", ".1f"),
                            ("boundary_de_excess", "boundary ΔE away from the target's own "
                             "(same rings on the unfused target)", ".1f"),
                            ("detail_ratio", "detail energy, output / target face", ".2f")):
        b, a = sums["before"][key], sums["after"][key]
        lines.append(f"| {label} | {b[0]:{fmt}} / {b[1]:{fmt}} | {a[0]:{fmt}} / {a[1]:{fmt}} |")
    lines += [
        "",
        "Synthetic variants (`facefuse.toolchain.synthetic`, `facefuse.toolchain.trials`), "
        "degree 100, every "
        "pair, occluder textures from the third identity's photo (bar and sunglasses: away "
        "from its face; hand: its cheek skin). Survival: share of the occluder's pixels over "
        "the target's face unchanged within 8 levels (goal ≥ 0.95). Leak: share of a source "
        "occluder found in the output (goal ≤ 0.05). Gradient left: share of a known "
        f"horizontal lighting gradient (gain slope {GRADIENT_STRENGTH} per eye distance) on "
        "the source that is left on the output face.",
        "",
        "| trial | before: median / worst | after: median / worst | after: pairs meeting "
        "the goal |",
        "|---|---:|---:|---:|",
    ]
    for kind in OCCLUDER_KINDS:
        vs = [v for v in variants if v["trial"] == kind]
        for fig, worst, goal in (("survival", min, lambda x: x >= 0.95),
                                 ("leak", max, lambda x: x <= 0.05)):
            b = [v[f"{fig}_before"] for v in vs]
            a = [v[f"{fig}_after"] for v in vs]
            lines.append(f"| {kind}: {fig} | {statistics.median(b):.3f} / {worst(b):.3f} | "
                         f"{statistics.median(a):.3f} / {worst(a):.3f} | "
                         f"{sum(goal(x) for x in a)}/{len(a)} |")
    gs = [v for v in variants if v["trial"] == "gradient"]
    b = [abs(v["gradient_left_before"]) for v in gs]
    a = [abs(v["gradient_left_after"]) for v in gs]
    lines.append(f"| lighting: gradient left (absolute) | {statistics.median(b):.3f} / "
                 f"{max(b):.3f} | {statistics.median(a):.3f} / {max(a):.3f} | |")
    bg = sorted((v for v in variants if v["trial"] == "background"), key=lambda v: v["yaw_diff"])
    b = [v["background_before"] for v in bg]
    a = [v["background_after"] for v in bg]
    lines.append(f"| background repainted flat: share of the changed output pixels that change "
                 f"by > 25 | {statistics.median(b):.4f} / {max(b):.4f} | "
                 f"{statistics.median(a):.4f} / {max(a):.4f} | "
                 f"{sum(x <= 0.002 for x in a)}/{len(a)} (≤ 0.002) |")
    lines += ["", "Background independence by head-yaw difference (source vs target, degrees; "
              "before → after): " + ", ".join(
                  f"{v['source']}→{v['target']} {v['yaw_diff']:.0f}°: "
                  f"{v['background_before']:.4f} → {v['background_after']:.4f}" for v in bg) + "."]
    lines += ["", "Contact sheets (before | after): `out/fuse_quality_pairs.jpg` (source, "
              "target, before, after for every pair), `out/fuse_quality_variants.jpg` "
              "(per pair of the sheet: occluder over the target, then over the source, for bar, "
              "sunglasses, hand; then the relit source)."]
    write_section("fuse-quality", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
