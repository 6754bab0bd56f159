"""Benchmark: group photos and faces at the frame's edge, found and fused, per detector.

Over the reproducible sets of :mod:`facefuse.toolchain.detection_sets` that hold
hard faces (``group``: six portraits at face widths 20–200 px; ``edge``: a face up
to a third outside each border; ``large``: the face filling the frame) and the
lineup with one face deliberately below the size limit, for each detector
(BlazeFace full-range, and BlazeFace on the image padded with a grey border, an
experiment kept here only; YuNet; ``auto``, the default, which runs YuNet where
every face is wanted and BlazeFace where only the largest is):

* recall: faces found / faces present (false positives);
* fused: ``mode="many"`` from the astronaut photo, faces fused that are true
  faces; "before" counts them as the engine did before per-face skipping (one
  unusable face failed the whole request, so none of its faces were fused);
* skipped faces by reason code.

It also draws a contact sheet of the group results (target with boxes: green
fused, red skipped; the fused output) for a person to look at.

    .venv/bin/python bench/groups.py

Writes bench/results/groups.json, bench/results/groups_sheet.jpg and the
"groups" section of BENCHMARKS.md.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.errors import FaceError
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.detectors import Purpose
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.types import FuseOptions, FusionResult
from facefuse.imaging.encode import encode_image
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.detection_sets import (
    Case,
    detection_cases,
    lineup,
    match,
    pairs,
)
from report import RESULTS, detection_photos, machine, machine_line, parser, publish, write_json

KINDS = ("group", "edge", "large", "face-free")
#: The lineup: two faces above the default size limit, one (about 35 px between the
#: outer eye corners) below it.
LINEUP = (("obama", 110.0), ("biden", 100.0), ("obama3", 60.0))
#: Settings.detector of each fusion run, and its label (auto: the default policy).
FUSED = (("full", "BlazeFace full-range"), ("yunet", "YuNet"), ("auto", "auto (default)"))
#: Grey border added on every side, as a fraction of the long side (experiment).
PAD_FRACTION = 0.15


def padded(detect: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """``detect`` run on the image with a grey border, boxes mapped back and clipped."""
    def run(img: np.ndarray) -> np.ndarray:
        h, w = img.shape[:2]
        p = int(PAD_FRACTION * max(h, w))
        big = cv2.copyMakeBorder(img, p, p, p, p, cv2.BORDER_CONSTANT, value=(128, 128, 128))
        b = detect(big) - p
        b[:, [0, 2]] = b[:, [0, 2]].clip(0, w)
        b[:, [1, 3]] = b[:, [1, 3]].clip(0, h)
        keep = (b[:, 2] - b[:, 0] > 4) & (b[:, 3] - b[:, 1] > 4)
        return b[keep]
    return run


def boxes_of(an: FaceAnalyser, purpose: Purpose = "largest"
             ) -> Callable[[np.ndarray], np.ndarray]:
    return lambda img: np.array([d.bbox for d in an.detect(img, purpose)],
                                np.float64).reshape(-1, 4)


def recall(detect: Callable[[np.ndarray], np.ndarray], cases: list[Case]) -> dict[str, list[int]]:
    per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for c in cases:
        hit, fp = match(detect(c.image), c.faces)
        row = per_kind[c.kind]
        row[0] += hit
        row[1] += len(c.faces)
        row[2] += fp
    return dict(per_kind)


def fused_truth(result: FusionResult, case: Case) -> int:
    """How many of the fused faces are true faces of ``case``."""
    boxes = np.array([f.target_face.bbox for f in result.fused], np.float64).reshape(-1, 4)
    return len(pairs(boxes, case.faces))


def fusion(fuser: FaceFuser, source: np.ndarray, cases: list[Case]
           ) -> tuple[dict[str, Any], dict[str, FusionResult]]:
    """Per kind: faces present, fused now, fused before; skipped reasons."""
    per_kind: dict[str, dict[str, int]] = defaultdict(
        lambda: {"present": 0, "fused": 0, "fused_before": 0, "failed": 0, "failed_before": 0})
    reasons: Counter[str] = Counter()
    results: dict[str, FusionResult] = {}
    for c in cases:
        if not len(c.faces):
            continue
        row = per_kind[c.kind]
        row["present"] += len(c.faces)
        try:
            r = fuser.fuse(source, c.image, FuseOptions(mode="many", evaluate=False))
        except FaceError as exc:
            row["failed"] += 1
            row["failed_before"] += 1
            reasons[exc.code + " (request)"] += 1
            continue
        results[c.name] = r
        n = fused_truth(r, c)
        row["fused"] += n
        reasons.update(s.reason for s in r.skipped)
        if r.skipped:  # one unusable face failed the whole request before
            row["failed_before"] += 1
        else:
            row["fused_before"] += n
    return dict(per_kind), {"skipped": dict(reasons), "results": results}


def sheet_row(case: Case, result: FusionResult, height: int = 300) -> np.ndarray:
    marked = np.ascontiguousarray(case.image.copy())
    t = max(2, round(case.image.shape[0] / 250))
    for f in result.fused:
        x0, y0, x1, y1 = (int(v) for v in f.target_face.bbox[:4])
        cv2.rectangle(marked, (x0, y0), (x1, y1), (0, 200, 0), t)
    for s in result.skipped:
        x0, y0, x1, y1 = (int(v) for v in s.box)
        cv2.rectangle(marked, (x0, y0), (x1, y1), (230, 0, 0), t)
    scale = height / case.image.shape[0]
    size = (round(case.image.shape[1] * scale), height)
    gap = np.full((height, 8, 3), 255, np.uint8)
    return np.concatenate([cv2.resize(marked, size, interpolation=cv2.INTER_AREA), gap,
                           cv2.resize(result.image, size, interpolation=cv2.INTER_AREA)],
                          axis=1)


def contact_sheet(rows: list[np.ndarray]) -> np.ndarray:
    width = max(r.shape[1] for r in rows)
    padded_rows = [np.pad(r, ((0, 8), (0, width - r.shape[1]), (0, 0)), constant_values=255)
                   for r in rows]
    return np.concatenate(padded_rows, axis=0)


def main() -> None:
    parser(__doc__).parse_args()
    base = Settings.from_env(threads=1, precision="fp32")
    photos, face_free = detection_photos(base)
    cases = [c for c in detection_cases(photos, face_free) if c.kind in KINDS]
    cases.append(lineup(photos, LINEUP, height=280))
    registry = ModelRegistry(base)
    m = machine()
    out: dict[str, Any] = {"machine": m, "cases": len(cases)}
    analysers = {d: FaceAnalyser(base.replace(detector=d), registry)
                 for d in ("full", "yunet", "auto")}
    out["recall"] = {
        "BlazeFace full-range": recall(boxes_of(analysers["full"]), cases),
        f"BlazeFace, {PAD_FRACTION:.0%} grey border": recall(
            padded(boxes_of(analysers["full"])), cases),
        "YuNet": recall(boxes_of(analysers["yunet"]), cases),
        # Every face of the image is wanted: the detector "auto" runs for that.
        "auto (default), every face": recall(boxes_of(analysers["auto"], "all"), cases),
    }
    source = photos["astronaut"]
    sheets: list[np.ndarray] = []
    for d, label in FUSED:
        fuser = FaceFuser(base.replace(detector=d), analysers[d])
        per_kind, extra = fusion(fuser, source, cases)
        out.setdefault("fusion", {})[label] = {"per_kind": per_kind, "skipped": extra["skipped"]}
        if d == "auto":
            sheets = [sheet_row(c, extra["results"][c.name]) for c in cases
                      if c.kind == "group" and c.name in extra["results"]]
    write_json("groups", out)
    if sheets:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "groups_sheet.jpg").write_bytes(encode_image(contact_sheet(sheets), "jpeg", 85))

    lines = [
        "## Group photos and faces at the frame's edge (`bench/groups.py`)", "",
        "`.venv/bin/python bench/groups.py`; sets from `facefuse.toolchain.detection_sets` "
        f"({len(cases)} images: 3 synthetic groups of six, 40 faces cut by a border, 10 "
        "frame-filling faces, 5 face-free photos, and a lineup of three with one face "
        "35 px between the eyes, under the limit of 40).", "",
        machine_line(m) + " Shared machine.", "",
        "Recall: faces found / present (false positives).", "",
        "| set | " + " | ".join(out["recall"]) + " |", "|---|" + "---|" * len(out["recall"]),
    ]
    for kind in KINDS:
        def cell(r: dict[str, list[int]], kind: str = kind) -> str:
            found, total, fp = r.get(kind, [0, 0, 0])
            return f"{fp} false" if kind == "face-free" else f"{found}/{total} ({fp} false)"
        lines.append(f"| {kind} | " + " | ".join(cell(r) for r in out["recall"].values()) + " |")
    lines += [
        "", "Fused in `mode=many` (astronaut as source): true faces fused / present, and "
        "requests failed; *before* = one unusable face fails the whole request, as the "
        "engine did before per-face skipping.", "",
        "| detector | set | fused now | fused before | requests failed now | before |",
        "|---|---|---|---|---|---|",
    ]
    for label, f in out["fusion"].items():
        for kind, row in f["per_kind"].items():
            lines.append(f"| {label} | {kind} | {row['fused']}/{row['present']} | "
                         f"{row['fused_before']}/{row['present']} | {row['failed']} | "
                         f"{row['failed_before']} |")
    for label, f in out["fusion"].items():
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(f["skipped"].items())) or "none"
        lines.append(f"\nSkipped, {label}: {reasons}.")
    lines += ["", "`auto` (the default `FACEFUSE_DETECTOR`) runs YuNet on a `mode=many` "
              "target and for face listings, BlazeFace full-range where only the largest "
              "face is used (sources, `mode=one`); its recall column is the every-face "
              "detector's.", "",
              "Contact sheet (auto, the default; target with fused faces green, skipped red "
              "| output): `bench/results/groups_sheet.jpg`."]
    publish("groups", lines)


if __name__ == "__main__":
    main()
