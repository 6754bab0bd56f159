"""Benchmark: facial hair and glasses as regions, three settings in one run.

On realistic variants of the sample photos (real scalp hair transplanted as a
beard, moustache or stubble; clear glasses of real darkened pixels with lens
reflections: ``facefuse.toolchain.synthetic``), fused at degree 100:

* target's hair / frames kept (share of their pixels unchanged; goal ≥ 0.95);
* source's hair leaked (goal ≤ 0.05): against a counterfactual, the clean source
  fused with the very source-occluder mask the hairy one was given (captured and
  replayed in the classic swapper, per-source memo off), so the two differ only by
  the hair's pixels (and what the source's tone, lighting and highlight fits read
  of them, which is leak too); the mean RGB difference of the two outputs where the
  hair lands over the mean the hair made on the source (0: none of it came along;
  1: all of it); and the darkening (grey levels) it leaves on the clean-shaven
  target's beard zone; the source's frames leaked (``occluder_leak``; goal ≤ 0.05).

Settings: "off" is the colour-outlier occluder mask alone (options `glasses`
off and `facial_hair="off"`); "target" glasses on both sides and the target's
facial hair only; "default" the defaults (facial hair on both sides too).

It also looks for regions on faces that have none: every sample native,
mirrored, tilted ±12° and relit, and the faces of side-by-side group photos of
three samples at 400-1200 px high, each at the classic swapper's working scale
(goal: 0 faces with a region); and times the facial-hair finder there (CPU
time per face).

    .venv/bin/python bench/regions.py [--sheets PREFIX]

Writes bench/results/regions.json and the "regions" section of BENCHMARKS.md;
``--sheets`` also writes, per pair, 1:1 crops of the target's face: top row the
target wearing a beard, stubble, metal glasses fused (off, default, both each);
bottom row the clean-shaven, glasses-free target fused with a source wearing
them (off, default, both each).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.swappers.classic import occlusion, regions
from facefuse.fusion.swappers.classic import swapper as classic
from facefuse.fusion.swappers.classic.swapper import WORK_EYE_PX
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import decode_image
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.samples import fetch_samples
from facefuse.toolchain.synthetic import (
    FACIAL_HAIR_KINDS,
    FRAME_KINDS,
    VARIANTS,
    FacialHairKind,
    facial_hair_alpha,
    paste_facial_hair,
    variant,
)
from facefuse.toolchain.trials import (
    Sample,
    facial_hair_leak_trial,
    facial_hair_survival_trial,
    fuse_sample,
    glasses_leak_trial,
    glasses_survival_trial,
)
from report import machine, machine_line, publish, write_json

#: (source, target, donor of the hair or frame pixels): every identity in each role;
#: the donors with scalp hair above the forehead (obama: short black, astronaut:
#: brown), each onto dark and light skin.
PAIRS = (("obama", "biden", "astronaut"), ("astronaut", "obama2", "obama"),
         ("biden", "astronaut", "obama"), ("obama2", "obama3", "astronaut"))


#: The classic swapper's occluders without the regions, the target's facial hair
#: only, and the defaults (facial hair rejected from the source too).
SETTINGS = {"off": FuseOptions(glasses=False, facial_hair="off"),
            "target": FuseOptions(facial_hair="target"), "default": FuseOptions()}
#: Side-by-side group photos (sample names, left to right) and their heights (px).
GROUPS = (("biden", "obama2", "obama3"), ("obama", "astronaut", "biden"),
          ("obama2", "obama", "obama3"))
GROUP_HEIGHTS = (400, 600, 800, 1000, 1200)
#: The classic swapper's working eye distance for targets (pixels).
WORK_EYE = WORK_EYE_PX


def crop(img: np.ndarray, s: Sample) -> np.ndarray:
    """The face's 1:1 crop (lower face and eyes; no resampling)."""
    lm = s.landmarks
    x0, y0 = lm[:, :2].min(0)
    x1, y1 = lm[:, :2].max(0)
    p = 0.1 * (x1 - x0)
    return img[int(max(0, y0 - p)):int(y1 + p), int(max(0, x0 - p)):int(x1 + p)]


@contextmanager
def replayed_source_mask() -> Iterator[dict[str, Any]]:
    """While open, the classic swapper's source-side occluder masks are kept
    (``state["mode"] = "capture"``) or handed back in place of a new search
    (``"replay"``); anything else searches as usual."""
    real = classic._occluders
    state: dict[str, Any] = {"mode": None, "mask": None}

    def occluders(image: np.ndarray, landmarks: np.ndarray, options: FuseOptions,
                  scale: float = 1.0, rim_grow: float = 0.0, source: bool = False) -> np.ndarray:
        if source and state["mode"] == "replay":
            return np.array(state["mask"])
        m = real(image, landmarks, options, scale=scale, rim_grow=rim_grow, source=source)
        if source and state["mode"] == "capture":
            state["mask"] = m.copy()
        return m

    classic._occluders = occluders
    try:
        yield state
    finally:
        classic._occluders = real


def hair_leak(fuser: FaceFuser, src: Sample, tgt: Sample, kind: FacialHairKind, donor: Sample,
              options: FuseOptions) -> float:
    """The share of a source's pasted facial hair that reaches the output (see the
    module doc); ``fuser`` without its per-source memo (the replayed mask must be
    the one used)."""
    hairy, fp = paste_facial_hair(src.image, src.landmarks, kind, donor.image, donor.landmarks, 0)
    lands = facial_hair_alpha(tgt.landmarks, tgt.image.shape[:2], kind) > 0.5
    if not fp.any() or not lands.any():
        return 0.0
    applied = float(np.linalg.norm(hairy[fp].astype(np.float32)
                                   - src.image[fp].astype(np.float32), axis=-1).mean())
    if not applied > 0:
        return 0.0
    with replayed_source_mask() as state:
        state["mode"] = "capture"
        out = fuse_sample(fuser, Sample(hairy, src.faces), tgt, options)
        state["mode"] = "replay"
        ref = fuse_sample(fuser, src, tgt, options)
    moved = np.linalg.norm(out.astype(np.float32) - ref.astype(np.float32), axis=-1)
    return min(1.0, float(moved[lands].mean()) / applied)


def run(fuser: FaceFuser, samples: dict[str, Sample], sheets: Path | None,
        memo_free: FaceFuser) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for src, tgt, donor in PAIRS:
        s, t, dn = samples[src], samples[tgt], samples[donor]
        kept_row: list[np.ndarray] = []
        leak_row: list[np.ndarray] = []
        for kind in FACIAL_HAIR_KINDS:
            res: dict[str, Any] = {}
            for label, opts in SETTINGS.items():
                kept, out_k = facial_hair_survival_trial(fuser, s, t, kind, dn, opts)
                _, dark, against, out_l = facial_hair_leak_trial(fuser, s, t, kind, dn, opts)
                leak = hair_leak(memo_free, s, t, kind, dn, opts)
                res[label] = {"kept": kept, "leaked": leak, "darkening": dark,
                              "darker_than_target": against}
                if kind != "moustache":
                    kept_row.append(crop(out_k, t))
                    leak_row.append(crop(out_l, t))
            rows[f"{src}->{tgt} {kind} ({donor})"] = res
        for frame in FRAME_KINDS:
            res = {}
            for label, opts in SETTINGS.items():
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


def group_photo(images: dict[str, np.ndarray], names: tuple[str, ...],
                height: int) -> tuple[np.ndarray, np.ndarray]:
    """The named samples side by side at one ``height`` and the right edge (px) of each."""
    tiles = [cv2.resize(images[n], (round(images[n].shape[1] * height / images[n].shape[0]),
                                    height), interpolation=cv2.INTER_AREA) for n in names]
    return (np.ascontiguousarray(np.concatenate(tiles, axis=1)),
            np.cumsum([x.shape[1] for x in tiles]))


def clean_faces(analyser: FaceAnalyser,
                images: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(label, image, landmarks) of every face without a beard or glasses: each
    sample's variants and the group photos' faces, each cropped round the face and
    at the swapper's working scale."""
    out = []
    for name, img in images.items():
        for v in VARIANTS:
            im = variant(img, v)
            lm = analyser.analyse(im, embed=False)[0].landmarks
            out.append((f"{name} {v}", *_working(im, lm)))
    for names in GROUPS:
        for height in GROUP_HEIGHTS:
            im, edges = group_photo(images, names, height)
            for f in analyser.analyse(im, embed=False):
                who = names[int(np.searchsorted(edges, f.landmarks[:, 0].mean()))]
                out.append((f"group {'/'.join(names)} at {height} px: {who}",
                            *_working(im, f.landmarks)))
    return out


def _working(image: np.ndarray, lm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The face's neighbourhood at the swapper's working scale, and its mesh there."""
    pad = 0.4 * float(np.ptp(lm[:, 0]))
    x0, y0 = np.maximum(0, np.floor(lm[:, :2].min(0) - pad)).astype(int)
    x1, y1 = np.ceil(lm[:, :2].max(0) + pad).astype(int)
    crop = np.ascontiguousarray(image[y0:y1, x0:x1])
    s = min(1.0, WORK_EYE / eye_distance(lm))
    small = cv2.resize(crop, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)
    local = lm - np.array([x0, y0, 0.0])
    local[:, :3] *= s
    return small, local


def false_regions(faces: list[tuple[str, np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """Faces where a region is found though none is worn, and the facial-hair
    finder's CPU time per face (ms, median over three calls each)."""
    hair, glasses, ms = [], [], []
    for label, img, lm in faces:
        times = []
        for _ in range(3):
            t0 = time.process_time()
            found = occlusion.on_face_crop(img, lm, regions.facial_hair_mask)
            times.append(time.process_time() - t0)
        ms.append(1000.0 * statistics.median(times))
        if found.any():
            hair.append(label)
        if occlusion.on_face_crop(img, lm, regions.glasses_mask).any():
            glasses.append(label)
    return {"faces": len(faces), "hair": hair, "glasses": glasses,
            "hair_ms_median": statistics.median(ms), "hair_ms_max": max(ms)}


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
    memo_free = FaceFuser(settings, analyser)
    for swapper in memo_free.swappers.values():
        if isinstance(swapper, classic.ClassicSwapper):
            swapper.sources = None
    samples = {n: Sample(img, analyser.analyse(img, embed=False))
               for n, img in ((n, decode_image(p)) for n, p in paths.items())}
    clean = false_regions(clean_faces(analyser, {n: s.image for n, s in samples.items()}))
    rows = run(fuser, samples, args.sheets, memo_free)
    write_json("regions", {"machine": machine(), "rows": rows, "clean": clean})
    labels = list(SETTINGS)
    lines = ["## regions", "",
             "Facial hair and clear glasses on realistic variants (real scalp hair as a beard,",
             "moustache or stubble; frames of real darkened pixels with lens reflections), degree",
             "100, three settings: off (the colour-outlier occluder mask alone), target (glasses",
             "on both sides, the target's facial hair only), default (facial hair rejected from",
             "the source too). kept: share of the target's hair/frame pixels unchanged (goal ≥",
             "0.95); leaked: share of the source's that reaches the output (goal ≤ 0.05; for",
             "hair, against the clean source fused with the hairy one's own source mask; with",
             "target a source's facial hair is carried); dark: grey levels the source's hair",
             "takes off the clean-shaven target's beard zone (against fusing the clean source);",
             "vs target: grey levels that zone ends darker than the target's own.",
             "",
             f"{machine_line(machine())} (shared with other work).", "",
             "| trial | kept " + " / ".join(labels) + " | leaked " + " / ".join(labels)
             + " | dark " + " / ".join(labels) + " | vs target " + " / ".join(labels) + " |",
             "|---|---|---|---|---|"]
    for name, r in rows.items():
        kept = " / ".join(f"{r[k]['kept']:.2f}" for k in labels)
        leak = " / ".join(f"{r[k]['leaked']:.3f}" for k in labels)
        dark = " | ".join(" / ".join(f"{r[k][m]:.1f}" for k in labels)
                          for m in ("darkening", "darker_than_target")
                          ) if "darkening" in r["off"] else "– | –"
        lines.append(f"| {name} | {kept} | {leak} | {dark} |")
    lines.append("")
    for label in labels:
        for what, pick in (("facial hair", lambda n: "glasses" not in n),
                           ("glasses", lambda n: "glasses" in n)):
            sel = [r[label] for n, r in rows.items() if pick(n)]
            kept = [x["kept"] for x in sel]
            leak = [x["leaked"] for x in sel]
            lines.append(f"- {label}, {what}: kept median {statistics.median(kept):.2f} worst "
                         f"{min(kept):.2f}; leaked median {statistics.median(leak):.3f} worst "
                         f"{max(leak):.3f}")
    lines += ["", f"Faces without a beard or glasses ({clean['faces']}: the samples native, "
              "mirrored, tilted ±12° and relit, and the faces of side-by-side group photos of "
              "three at 400-1200 px), at the working scale: facial hair found on "
              f"{len(clean['hair'])} ({', '.join(clean['hair']) or 'none'}), glasses on "
              f"{len(clean['glasses'])} ({', '.join(clean['glasses']) or 'none'}). The "
              f"facial-hair finder takes {clean['hair_ms_median']:.1f} ms CPU time per face "
              f"(median; at most {clean['hair_ms_max']:.1f})."]
    publish("regions", lines)


if __name__ == "__main__":
    main()
