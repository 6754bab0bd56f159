"""Benchmark: what the iris model buys the fusion, and what it costs.

The mesh stage runs the iris model on two 64×64 eye crops per face: it adds the
10 iris points and moves the 16 eye-contour points of each eye to its more
precise fit. Without it (:meth:`~facefuse.faces.landmarker.FaceMesh.estimate_iris`)
the iris points are guessed from the eye contour and the contour stays the
mesh's own. In one run, on the sample photos:

* landmark shift without the iris model, per photo (originals, mirrored, ×0.5):
  mean distance of the 32 eye-contour points, the 4 eye corners (which also place
  the recognition chip) and the 2 iris centres, as a share of the inter-ocular
  distance;
* fusion quality of every ordered pair of different people at degree 100 with the
  iris model on both faces, on neither, on the target only and on the source only,
  every output judged by the same (iris) analyser: identity
  similarity to the source and to the target, head-pose and expression
  differences to the target (``eye_diff``: eye openness);
* the mesh stage's time per image with and without it (one interleaved loop).

    .venv/bin/python bench/iris.py

Writes bench/results/iris.json and the "iris" section of BENCHMARKS.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.landmarker import EYE_CONTOUR_INDICES, EYE_CORNERS, FaceMesh
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.quality import compare_faces
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import decode_image
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.samples import SAMPLES, fetch_samples, identity_of
from report import machine, machine_line, publish, write_json

CONTOUR = [i for eye in EYE_CONTOUR_INDICES for i in eye]
CORNERS = [i for eye in EYE_CORNERS for i in eye]
IRIS_CENTRES = [468, 473]
QUALITY_KEYS = ("id_sim_source", "id_sim_target", "yaw_diff", "eye_diff", "mouth_diff")
TIMING_ROUNDS = 15


def shift(a: np.ndarray, b: np.ndarray, idx: list[int]) -> float:
    """Mean distance of points ``idx`` between two (478, 3) meshes, over the IOD of ``a``."""
    iod = float(np.linalg.norm(a[468, :2] - a[473, :2]))
    return float(np.linalg.norm(a[idx, :2] - b[idx, :2], axis=1).mean()) / iod


def main() -> None:
    settings = Settings.from_env()
    paths = fetch_samples(settings.samples_dir, settings.downloads_dir)
    registry = ModelRegistry(settings)
    with_iris = FaceAnalyser(settings, registry)
    if with_iris.models.mesh.iris is None:
        raise SystemExit("no iris model installed")
    without = FaceAnalyser(settings, registry)
    without.models = dataclasses.replace(
        with_iris.models, mesh=FaceMesh(with_iris.models.mesh.mesh, None))
    images = {n: decode_image(paths[n].read_bytes()) for n in SAMPLES}

    shifts: dict[str, list[float]] = {"contour": [], "corners": [], "iris": []}
    for img in images.values():
        half = cv2.resize(img, None, fx=0.5, fy=0.5, interpolation=cv2.INTER_AREA)
        for view in (img, np.ascontiguousarray(img[:, ::-1]), half):
            a = with_iris.analyse(view, embed=False)[0].landmarks
            b = without.analyse(view, embed=False)[0].landmarks
            assert a is not None and b is not None
            for key, idx in (("contour", CONTOUR), ("corners", CORNERS),
                             ("iris", IRIS_CENTRES)):
                shifts[key].append(shift(a, b, idx))

    # (source analyser, target analyser) per variant; one fuser renders them all
    analysers = {"iris": with_iris, "estimated": without}
    variants = {"iris": ("iris", "iris"), "estimated": ("estimated", "estimated"),
                "target only": ("estimated", "iris"), "source only": ("iris", "estimated")}
    fuser = FaceFuser(settings, with_iris)
    faces = {(k, n): an.analyse(img) for k, an in analysers.items() for n, img in images.items()}
    quality: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    pairs = [(s, t) for s, t in itertools.permutations(SAMPLES, 2)
             if identity_of(s) != identity_of(t)]
    for s, t in pairs:
        for key, (on_source, on_target) in variants.items():
            out = fuser.fuse_faces(images[s], faces[on_source, s][0], images[t],
                                   faces[on_target, t], [0], FuseOptions(degree=100)).image
            quality[key].append(compare_faces(with_iris.analyse(out)[0], faces["iris", s][0],
                                              faces["iris", t][0]))

    times: dict[str, list[float]] = {k: [] for k in analysers}
    detections = {n: with_iris.detect(img)[:1] for n, img in images.items()}
    for _ in range(TIMING_ROUNDS):
        for n, img in images.items():
            for key, an in analysers.items():
                t0 = time.perf_counter()
                an.run(stages.mesh(an.models.mesh, img, detections[n]))
                times[key].append(time.perf_counter() - t0)

    m = machine()
    med = {k: {q: statistics.median(r[q] for r in rows) for q in QUALITY_KEYS}
           for k, rows in quality.items()}
    mesh_ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    write_json("iris", {"machine": m, "shifts": shifts, "quality": quality,
                        "pairs": pairs, "mesh_ms": mesh_ms})
    n_views = len(shifts["contour"])

    def srow(label: str, key: str) -> str:
        v = shifts[key]
        return f"| {label} | {statistics.median(v):.4f} | {max(v):.4f} |"

    lines: list[str] = [
        "## What the iris model buys (`bench/iris.py`)", "",
        "`.venv/bin/python bench/iris.py`: the mesh stage with the iris model (the "
        "default) against the iris points estimated from the eye contour "
        "(`FaceMesh.estimate_iris`), in one run. " + machine_line(m) + " Shared machine.",
        "",
        f"Landmark shift without the iris model ({n_views} views: the samples, mirrored "
        "and ×0.5), mean distance over the inter-ocular distance:", "",
        "| points | median | worst |", "|---|---:|---:|",
        srow("32 eye-contour points", "contour"),
        srow("4 eye corners (they also place the recognition chip)", "corners"),
        srow("2 iris centres", "iris"), "",
        f"Fusion at degree 100, every ordered pair of different people ({len(pairs)} "
        "pairs), each output judged by the iris analyser; medians:", "",
        "| figure | " + " | ".join(f"iris model: {k}" if k in ("target only", "source only")
                                   else {"iris": "iris model (both)",
                                         "estimated": "estimated iris (neither)"}[k]
                                   for k in variants) + " |",
        "|---|" + "---:|" * len(variants),
    ]
    for q in QUALITY_KEYS:
        lines.append(f"| {q} | " + " | ".join(f"{med[k][q]:.4f}" for k in variants) + " |")
    lines += [
        "",
        f"Mesh stage per image (median of {TIMING_ROUNDS} interleaved rounds): "
        f"{mesh_ms['iris']:.1f} ms with the iris model, {mesh_ms['estimated']:.1f} ms "
        "without.", "",
        f"Without the iris model the output's eye openness differs from the target's "
        f"{med['estimated']['eye_diff'] / med['iris']['eye_diff']:.2f}× as much "
        f"(`eye_diff`), for {mesh_ms['iris'] - mesh_ms['estimated']:.1f} ms less per "
        "image; identity similarity to the source moves by "
        f"{med['estimated']['id_sim_source'] - med['iris']['id_sim_source']:+.4f}. With "
        "the iris model on the target only, `eye_diff` is "
        f"{med['target only']['eye_diff'] / med['iris']['eye_diff']:.2f}× that of both. The "
        "default keeps the iris model on every face.",
    ]
    publish("iris", lines)


if __name__ == "__main__":
    main()
