"""Benchmark: faces at the frame's edge found by the every-face detector, before/after.

"Before" is YuNet asking the same score (0.8) of every detection; "after" is the
default, where a detection cut by the image frame needs only
:data:`facefuse.faces.borders.EDGE_SCORE_THRESHOLD` (and pieces of a confident
face are dropped). Both in one run over the reproducible sets of
:mod:`facefuse.toolchain.detection_sets`:

* ``cut``: each sample photo cropped so 20, 30 or 40 % of its face is outside the
  left/right/top/bottom edge, the face filling the frame (1.3×) or not (2×);
* ``corner``: 0.9 and 2.1 MP groups with a face cut at each corner by 0, 20 or
  35 % of its size on both axes (50, 90, 160 px wide), three whole faces inside;
* the ``edge``, ``group``, ``large`` and ``face-free`` sets of ``detect.py``, for
  false positives.

Also: ``mode=many`` fusion (astronaut as source) of the cut and corner sets,
true faces fused / present; and the detect cost on the 0.9 and 2.1 MP corner
photos (every-face YuNet before/after, and the largest-face BlazeFace path,
which this change does not touch), medians of interleaved runs.

    .venv/bin/python bench/edge_recall.py [--repeat 7]

Writes bench/results/edge_recall.json, bench/results/edge_recall_sheet.jpg and the
"edge_recall" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.errors import FaceError
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.borders import EDGE_SCORE_THRESHOLD
from facefuse.faces.yunet import YuNetDetector
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.encode import encode_image
from facefuse.toolchain.detection_sets import (
    Case,
    corner_cases,
    detection_cases,
    frame_cut_cases,
    pairs,
)
from report import RESULTS, detection_photos, machine, machine_line, publish, write_json

CONTROL_KINDS = ("edge", "group", "large", "face-free")
SIDES = ("before", "after")


def boxes(an: FaceAnalyser, img: np.ndarray) -> np.ndarray:
    return np.array([d.bbox for d in an.detect(img, "all")], np.float64).reshape(-1, 4)


def row_key(c: Case) -> str:
    """The table row of a case: its kind, and the cut fraction for cut/corner sets."""
    if c.kind in ("cut", "corner"):
        return f"{c.kind} {c.name.rsplit('-', 1)[-1].removeprefix('cut')}"
    return c.kind


def recall(an: FaceAnalyser, cases: list[Case]) -> dict[str, list[int]]:
    """Row -> [faces found, present, false positives]; corner rows count the four
    corner faces only (the whole faces inside are counted in ``corner inside``)."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for c in cases:
        found = boxes(an, c.image)
        pr = pairs(found, c.faces)
        row = out[row_key(c)]
        row[2] += len(found) - len(pr)
        if c.kind == "corner":
            row[0] += sum(1 for _, j in pr if j < 4)
            row[1] += 4
            inside = out["corner inside"]
            inside[0] += sum(1 for _, j in pr if j >= 4)
            inside[1] += len(c.faces) - 4
        else:
            row[0] += len(pr)
            row[1] += len(c.faces)
    return dict(out)


def fused(fuser: FaceFuser, source: np.ndarray, cases: list[Case]) -> dict[str, list[int]]:
    """Kind -> [true faces fused, present] in ``mode=many``."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for c in cases:
        row = out[c.kind]
        row[1] += len(c.faces)
        try:
            r = fuser.fuse(source, c.image, FuseOptions(mode="many", evaluate=False))
        except FaceError:
            continue
        got = np.array([f.target_face.bbox for f in r.fused], np.float64).reshape(-1, 4)
        row[0] += len(pairs(got, c.faces))
    return dict(out)


def detect_ms(fns: dict[str, Any], img: np.ndarray, repeat: int) -> dict[str, float]:
    """Median ms of each ``fn(img)``, runs interleaved round-robin after a warm-up."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn(img)
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn(img)
            times[k].append((time.perf_counter() - t0) * 1000.0)
    return {k: statistics.median(v) for k, v in times.items()}


def postprocess_ms(old: YuNetDetector, new: YuNetDetector, img: np.ndarray,
                   repeat: int = 200) -> dict[str, float]:
    """Median ms of the decode + merge of one image's model outputs (run once),
    before and after, interleaved: the only code the change touches."""
    items = new.preprocess(img)
    regs, scores = new.run(np.stack([t for t, _ in items]))
    boxes_ = [b for _, b in items]
    times: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(repeat):
        for k, d in (("before", old), ("after", new)):
            t0 = time.perf_counter()
            d.postprocess(regs, scores, boxes_)
            times[k].append((time.perf_counter() - t0) * 1000.0)
    return {k: statistics.median(v) for k, v in times.items()}


def sheet(an: dict[str, FaceAnalyser], cases: list[Case], height: int = 270) -> np.ndarray:
    """Each case: found before (red) and after (green) boxes, true faces thin white."""
    rows = []
    for c in cases:
        img = np.ascontiguousarray(c.image.copy())
        t = max(2, round(img.shape[0] / 200))
        for b in c.faces:
            cv2.rectangle(img, (int(b[0]), int(b[1])), (int(b[2]), int(b[3])), (255, 255, 255), 1)
        for side, colour, w in (("before", (230, 0, 0), 2 * t), ("after", (0, 220, 0), t)):
            for b in boxes(an[side], c.image):
                cv2.rectangle(img, (int(b[0]), int(b[1])), (int(b[2]), int(b[3])), colour, w)
        s = height / img.shape[0]
        rows.append(cv2.resize(img, (round(img.shape[1] * s), height),
                               interpolation=cv2.INTER_AREA))
    width = max(r.shape[1] for r in rows)
    return np.concatenate([np.pad(r, ((0, 6), (0, width - r.shape[1]), (0, 0)),
                                  constant_values=255) for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    base = Settings.from_env(threads=1, precision="fp32")
    photos, face_free = detection_photos(base)
    cut, corners = frame_cut_cases(photos), corner_cases(photos, face_free)
    control = [c for c in detection_cases(photos, face_free) if c.kind in CONTROL_KINDS]
    after = FaceAnalyser(base)
    before = FaceAnalyser(base, after.registry)
    yunet = after.models.detectors["all"]
    assert isinstance(yunet, YuNetDetector)
    old = YuNetDetector(yunet.model, score_threshold=yunet.score_threshold,
                        edge_score_threshold=yunet.score_threshold,
                        tile_above=yunet.tile_above)
    before.models = dataclasses.replace(
        before.models, detectors={**before.models.detectors, "all": old})
    an = {"before": before, "after": after}
    m = machine()
    out: dict[str, Any] = {"machine": m, "threshold": yunet.score_threshold,
                           "edge_threshold": yunet.edge_score_threshold}
    out["recall"] = {s: recall(an[s], cut + corners + control) for s in SIDES}
    source = photos["astronaut"]
    out["fused"] = {s: fused(FaceFuser(base, an[s]), source, cut + corners) for s in SIDES}
    cost: dict[str, dict[str, float]] = {}
    for c in (corners[4], corners[4 + len(corners) // 2]):  # face 90 px, cut 0.2
        h, w = c.image.shape[:2]
        cost[f"{w}x{h}"] = detect_ms({
            "every face, before": lambda img: before.detect(img, "all"),
            "every face, after": lambda img: after.detect(img, "all"),
            "largest face (BlazeFace)": lambda img: after.detect(img, "largest"),
        }, c.image, args.repeat)
    out["detect_ms"] = cost
    post = {f"{c.image.shape[1]}x{c.image.shape[0]}": postprocess_ms(old, yunet, c.image)
            for c in (corners[4], corners[4 + len(corners) // 2])}
    out["postprocess_ms"] = post
    write_json("edge_recall", out)
    shown = [c for c in corners if c.name.endswith("cut0.35")][::2] + [
        c for c in cut if "span1.3" in c.name and c.name.endswith("0.40")][:4]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "edge_recall_sheet.jpg").write_bytes(encode_image(sheet(an, shown), "jpeg", 85))

    rec = out["recall"]
    lines = [
        "## Faces at the frame's edge, before / after (`bench/edge_recall.py`)", "",
        f"`.venv/bin/python bench/edge_recall.py --repeat {args.repeat}`; every-face YuNet, "
        f"threshold {yunet.score_threshold}; *before*: the same score asked of a face cut "
        f"by the frame; *after*: {EDGE_SCORE_THRESHOLD} for a detection whose box reaches "
        "past the image border (centre inside), pieces of a confident face dropped "
        "(`facefuse.faces.borders`). Sets from `facefuse.toolchain.detection_sets`: "
        f"`frame_cut_cases` ({len(cut)} crops of the native photos with 20/30/40 % of the "
        f"face outside one edge), `corner_cases` ({len(corners)} groups of 0.9 and 2.1 MP, "
        "a face in each corner cut by 0/20/35 % of its size on both axes, 50/90/160 px "
        "wide, and three whole faces inside), and the edge/group/large/face-free sets.", "",
        machine_line(m) + " Shared machine (2 cores, other work running).", "",
        "Recall: faces found / present (false positives).", "",
        "| set | before | after |", "|---|---|---|",
    ]
    for key in sorted(rec["after"]):
        cells = []
        for s in SIDES:
            f, n, fp = rec[s].get(key, [0, 0, 0])
            cells.append(f"{fp} false" if key == "face-free" else f"{f}/{n} ({fp} false)")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    lines += ["", "Fused in `mode=many` (astronaut as source): true faces fused / present.",
              "", "| set | before | after |", "|---|---|---|"]
    for kind in out["fused"]["after"]:
        cells = ["{}/{}".format(*out["fused"][s][kind]) for s in SIDES]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines += ["", f"Detect ms (median of {args.repeat} interleaved runs, 1 thread):", "",
              "| image | " + " | ".join(next(iter(cost.values()))) + " |",
              "|---|" + "---:|" * len(next(iter(cost.values())))]
    for size, row in cost.items():
        lines.append(f"| {size} | " + " | ".join(f"{v:.1f}" for v in row.values()) + " |")
    lines += ["", "The passes are the same before and after (no extra tensor), so the "
              "detect columns differ by noise only; what changes is the score filter and "
              "one overlap test per kept detection, timed alone (decode + merge of the "
              "same model outputs, median of 200 interleaved): " + "; ".join(
                  f"{k} {v['before']:.2f} → {v['after']:.2f} ms" for k, v in post.items())
              + ". Sheet "
              "(before red, after green, true faces white): "
              "`bench/results/edge_recall_sheet.jpg`."]
    publish("edge_recall", lines)


if __name__ == "__main__":
    main()
