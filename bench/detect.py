"""Benchmark: face detection recall, false positives, cost and mesh landing, BlazeFace vs YuNet.

Both detectors in one run, each with the rotation retry (turned copies tried
when nothing is found upright), over the reproducible sets of
:mod:`facefuse.toolchain.detection_sets`: the sample photos, rotated, downscaled,
synthetic groups, faces cut by the frame, frame-filling faces, and face-free
photos (every detection there is a false positive).

Mesh landing: the 5 mesh points (:data:`facefuse.faces.types.MESH_FIVE_POINTS`)
after each detector → mesh path, against dlib's 5-point shape predictor on the
upright photo (placed into every image by the case's map), as error /
inter-ocular distance over the faces each detector found.

Cost: median detect time per image at a 640-pixel long side (upright faces,
so one pass), and on a face-free 640-pixel photo (all four turns).

    .venv/bin/python bench/detect.py [--repeat 15]

Writes bench/results/detect.json and the "detect" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.types import MESH_FIVE_POINTS
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.detection_sets import (
    Case,
    apply,
    detection_cases,
    match,
    pairs,
)
from facefuse.toolchain.sources import DLIB_MODELS, materialise
from report import detection_photos, machine, machine_line, median_ms, write_json, write_section

DETECTORS = {"full": "BlazeFace full-range", "yunet": "YuNet"}
KINDS = ("sample", "rotated", "downscaled", "large", "edge", "group", "face-free")


def recall(an: FaceAnalyser, cases: list[Case]) -> dict[str, Any]:
    per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    missed: list[str] = []
    for c in cases:
        found = an.detect(c.image)
        boxes = np.array([d.bbox for d in found], np.float64).reshape(-1, 4)
        hit, fp = match(boxes, c.faces)
        row = per_kind[c.kind]
        row[0] += hit
        row[1] += len(c.faces)
        row[2] += fp
        if hit < len(c.faces) or fp:
            missed.append(f"{c.name} ({hit}/{len(c.faces)} found, {fp} false)")
    return {"per_kind": dict(per_kind), "missed": missed}


def dlib_points(settings: Settings, photos: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """dlib's 5 points on each upright sample (HOG box, upsampled once if needed)."""
    import dlib  # bench-only reference

    member = "face_recognition_models/models/shape_predictor_5_face_landmarks.dat"
    path = materialise(DLIB_MODELS, member,
                       settings.home / "sources" / DLIB_MODELS.requirement / Path(member).name,
                       settings.downloads_dir)
    hog, predictor = dlib.get_frontal_face_detector(), dlib.shape_predictor(str(path))
    out: dict[str, np.ndarray] = {}
    for name, rgb in photos.items():
        img = np.ascontiguousarray(rgb)
        dets = hog(img, 0) or hog(img, 1)
        det = max(dets, key=lambda r: r.area())
        out[name] = np.array([[p.x, p.y] for p in predictor(img, det).parts()], np.float64)
    return out


def landing(an: FaceAnalyser, cases: list[Case],
            ref: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Per kind: mean 5-point mesh error / inter-ocular distance over the faces found,
    against dlib's points on the upright photo placed by each case's map."""
    errs: dict[str, list[float]] = defaultdict(list)
    for c in cases:
        if not len(c.faces):
            continue
        faces = an.analyse(c.image, embed=False)
        boxes = np.array([f.bbox for f in faces], np.float64).reshape(-1, 4)
        for i, j in pairs(boxes, c.faces):
            lm = faces[i].landmarks
            if lm is None:
                continue
            want = apply(c.maps[j], ref[c.sources[j]])
            got = lm[list(MESH_FIVE_POINTS), :2].astype(np.float64)
            iod = np.linalg.norm(want[0:2].mean(0) - want[2:4].mean(0))
            errs[c.kind].append(float(np.linalg.norm(got - want, axis=1).mean() / iod))
    return {k: {"mean": float(np.mean(v)), "median": float(np.median(v)),
                "worst": float(np.max(v)), "faces": len(v)} for k, v in errs.items()}


def cost(an: FaceAnalyser, photos: dict[str, np.ndarray], free: np.ndarray,
         repeat: int) -> dict[str, float]:
    def at640(img: np.ndarray) -> np.ndarray:
        s = 640 / max(img.shape[:2])
        return cv2.resize(img, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)

    small = [at640(p) for p in photos.values()]
    times = [median_ms(lambda i=i: an.models.detector.detect(i), repeat) for i in small]
    empty = at640(free)
    return {
        "faces_640_ms": float(np.median(times)),
        # The analyser's detect stage tries every turn the settings allow on a face-free photo.
        "face_free_640_all_turns_ms": median_ms(lambda: an.detect(empty), repeat),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    base = Settings.from_env(threads=1, precision="fp32")
    photos, face_free = detection_photos(base)
    cases = detection_cases(photos, face_free)
    ref = dlib_points(base, photos)
    registry = ModelRegistry(base)
    m = machine()
    result: dict[str, Any] = {"machine": m, "repeat": args.repeat, "cases": len(cases)}
    for det in DETECTORS:
        an = FaceAnalyser(base.replace(detector=det), registry)
        result[det] = {
            **recall(an, cases),
            "landing": landing(an, cases, ref),
            "cost": cost(an, photos, face_free["coffee"], args.repeat),
        }
    write_json("detect", result)

    def cell(det: str, kind: str) -> str:
        found, total, fp = result[det]["per_kind"].get(kind, [0, 0, 0])
        return f"{fp} false" if kind == "face-free" else f"{found}/{total} ({fp} false)"

    lines = [
        "## Face detection (`bench/detect.py`)", "",
        f"`.venv/bin/python bench/detect.py --repeat {args.repeat}`; both detectors in the same "
        "run, each with the rotation retry, at their default thresholds (BlazeFace 0.5, "
        "YuNet 0.8). Sets from `facefuse.toolchain.detection_sets` "
        f"({len(cases)} images). Cells: faces found / present (false positives).",
        "", machine_line(m) + " Shared machine: timings are noisy, compare within the table.",
        "", "| set | " + " | ".join(DETECTORS.values()) + " |",
        "|---|" + "---|" * len(DETECTORS),
    ]
    lines += [f"| {k} | " + " | ".join(cell(d, k) for d in DETECTORS) + " |" for k in KINDS]
    for key, label in (("faces_640_ms", "detect, 640 px photo with a face (median ms)"),
                       ("face_free_640_all_turns_ms",
                        "detect, 640 px face-free photo, 4 turns (median ms)")):
        lines.append(f"| {label} | " + " | ".join(
            f"{result[d]['cost'][key]:.1f}" for d in DETECTORS) + " |")
    lines += [
        "", "Mesh landing after each detector: 5 mesh points against dlib's 5-point predictor "
        "on the upright photo (placed into each image), error / inter-ocular distance over "
        "the faces each detector found: mean, median, worst (faces).", "",
        "| set | " + " | ".join(DETECTORS.values()) + " |",
        "|---|" + "---|" * len(DETECTORS),
    ]
    for kind in KINDS[:-1]:
        def fig(d: str, kind: str = kind) -> str:
            e = result[d]["landing"].get(kind)
            if e is None:
                return "–"
            return f"{e['mean']:.3f}, {e['median']:.3f}, {e['worst']:.3f} ({e['faces']})"
        lines.append(f"| {kind} | " + " | ".join(fig(d) for d in DETECTORS) + " |")
    lines += ["", "Missed or false, per detector:", ""]
    for d, label in DETECTORS.items():
        lines.append(f"- {label}: " + (", ".join(result[d]["missed"]) or "none"))
    write_section("detect", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
