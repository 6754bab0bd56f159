"""Benchmark: face analysis per sample photo, ours vs the `face_recognition` way on dlib.

Ours: BlazeFace → 478-point mesh → dlib-chip alignment → dlib ResNet on ONNX
Runtime, at 1 and 2 threads. Baseline, in the same run: dlib-bin's HOG detector
upsampled once + the 5-point shape predictor + dlib's ResNet
(``compute_face_descriptor`` with one jitter, as face_recognition does).

The whole-analysis times (and so the speed-up) are process CPU times, interleaved:
every round runs each photo through ours at 1 thread, at 2 threads and the dlib
path in turn, so
load from other processes on a shared machine falls on both sides alike. The
per-stage columns (detect, mesh, embed) are wall times per stage, ours only.

    .venv/bin/python bench/analyse.py [--repeat 7]

Writes bench/results/analyse.json and the "analyse" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.recognizer import Recognizer
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.samples import SAMPLES, fetch_samples, identity_of
from facefuse.toolchain.sources import DLIB_MODELS, materialise
from report import machine, machine_line, median_ms, write_json, write_section


def ours(an: FaceAnalyser, images: dict[str, np.ndarray], repeat: int) -> dict[str, Any]:
    """Per-stage medians (ms) per photo, and each photo's embedding."""
    rec = Recognizer(an.registry.get("dlib_resnet"))
    rows: dict[str, dict[str, float]] = {}
    embeddings: dict[str, np.ndarray] = {}
    for name, rgb in images.items():
        dets = an.detect(rgb)
        faces = an.analyse(rgb)
        embeddings[name] = faces[0].embedding_raw  # type: ignore[assignment]
        face = faces[0]
        chips = stages.chips(rgb, [face])
        rows[name] = {
            "detect": median_ms(lambda rgb=rgb: an.detect(rgb), repeat),
            "mesh": median_ms(lambda rgb=rgb, d=dets[0]: an.face_from_detection(rgb, d), repeat),
            "embed": median_ms(lambda c=chips: rec.embed_chips(c), repeat),
        }
    return {"per_image": rows, "embeddings": embeddings}


def dlib_path(settings: Settings) -> Callable[[np.ndarray], np.ndarray | None]:
    """The face_recognition way on dlib: RGB image → the first face's (128,) descriptor."""
    import dlib  # test/bench-only reference

    home = settings.home / "sources" / DLIB_MODELS.requirement
    sp_path = materialise(DLIB_MODELS,
                          "face_recognition_models/models/shape_predictor_5_face_landmarks.dat",
                          home / "shape_predictor_5_face_landmarks.dat", settings.downloads_dir)
    rec_path = materialise(DLIB_MODELS,
                           "face_recognition_models/models/dlib_face_recognition_resnet_model_v1.dat",
                           home / "dlib_face_recognition_resnet_model_v1.dat",
                           settings.downloads_dir)
    detector = dlib.get_frontal_face_detector()
    predictor = dlib.shape_predictor(str(sp_path))
    rec = dlib.face_recognition_model_v1(str(rec_path))

    def run(rgb: np.ndarray) -> np.ndarray | None:
        dets = detector(rgb, 1)
        best = None
        for d in dets:
            shape = predictor(rgb, d)
            v = np.asarray(rec.compute_face_descriptor(rgb, shape, 1), np.float32)
            if best is None:
                best = v
        return best

    return run


def interleaved_totals(images: dict[str, np.ndarray],
                       paths: dict[str, Callable[[np.ndarray], object]],
                       rounds: int) -> dict[str, dict[str, dict[str, float]]]:
    """Median wall ms (``"total"``) and process CPU ms (``"cpu"``, all threads) of each
    path on each photo, the paths taking turns photo by photo in every round (one
    untimed warm-up round first). On a shared machine the wall ratio of a second-long
    dlib run to a 30 ms one swings by a third between runs; the CPU ratio holds."""
    times: dict[str, dict[str, dict[str, list[float]]]] = {
        k: {n: {"total": [], "cpu": []} for n in images} for k in paths}
    for r in range(rounds + 1):
        for name, rgb in images.items():
            for key, fn in paths.items():
                w0, c0 = time.perf_counter(), time.process_time()
                fn(rgb)
                if r:
                    times[key][name]["total"].append((time.perf_counter() - w0) * 1000.0)
                    times[key][name]["cpu"].append((time.process_time() - c0) * 1000.0)
    return {k: {n: {c: statistics.median(v) for c, v in cols.items()}
                for n, cols in per.items()} for k, per in times.items()}


def decisions(embeddings: dict[str, np.ndarray | None], threshold: float) -> dict[str, bool]:
    out = {}
    for a, b in itertools.combinations(sorted(embeddings), 2):
        ea, eb = embeddings[a], embeddings[b]
        if ea is None or eb is None:
            continue
        out[f"{a}-{b}"] = bool(np.linalg.norm(ea - eb) < threshold)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    settings = Settings.from_env()
    paths = fetch_samples(settings.samples_dir, settings.downloads_dir)
    images = {n: decode_image(p) for n, p in paths.items()}
    m = machine()
    result: dict[str, Any] = {"machine": m, "repeat": args.repeat,
                              "load_before": [round(x, 2) for x in os.getloadavg()]}
    analysers = {t: FaceAnalyser(Settings.from_env(threads=t)) for t in (1, 2)}
    for threads, an in analysers.items():
        r = ours(an, images, args.repeat)
        result[f"ours_{threads}t"] = r["per_image"]
        if threads == 1:
            ours_emb = r["embeddings"]
    dlib_run = dlib_path(settings)
    dlib_emb = {name: dlib_run(rgb) for name, rgb in images.items()}
    totals = interleaved_totals(images, {
        "ours_1t": analysers[1].analyse, "ours_2t": analysers[2].analyse, "dlib": dlib_run,
    }, max(3, args.repeat // 2))
    result["dlib"] = {}
    for key, per in totals.items():
        for name, cols in per.items():
            result[key].setdefault(name, {}).update(cols)
    truth = {f"{a}-{b}": identity_of(a) == identity_of(b)
             for a, b in itertools.combinations(sorted(SAMPLES), 2)}
    ours_dec = decisions(ours_emb, settings.same_person_distance)
    dlib_dec = decisions(dlib_emb, settings.same_person_distance)
    result["decisions"] = {"truth": truth, "ours": ours_dec, "dlib": dlib_dec}
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    write_json("analyse", result)

    def med(key: str, col: str) -> float:
        return statistics.median(v[col] for v in result[key].values())

    active = ", ".join(f"{n} {analysers[1].registry.get(n).spec.precision}"
                       for n in ("blazeface_full", "facemesh", "iris", "dlib_resnet"))
    lines = [
        "## Face analysis (`bench/analyse.py`)",
        "",
        machine_line(m),
        f"Models as `FACEFUSE_PRECISION=auto` loads them from this home: {active} "
        "(`make models` adds the gated INT8 recogniser the image ships).",
        f"Command: `.venv/bin/python bench/analyse.py --repeat {args.repeat}`. "
        "Median ms per sample photo (5 photos, 512–2333 px), same run; the whole "
        "analyses interleaved photo by photo "
        f"({max(3, args.repeat // 2)} rounds: ours at 1 and 2 threads and the dlib path "
        "in turn), wall and process CPU (all threads); the stage columns wall, timed apart.",
        "",
        "| path | detect | mesh+iris | embed | whole analysis | whole analysis, CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for threads in (1, 2):
        k = f"ours_{threads}t"
        lines.append(f"| facefuse, {threads} thread(s) | {med(k, 'detect'):.1f} | "
                     f"{med(k, 'mesh'):.1f} | {med(k, 'embed'):.1f} | {med(k, 'total'):.1f} | "
                     f"{med(k, 'cpu'):.1f} |")
    lines.append(f"| face_recognition way on dlib-bin (HOG ×1 upsample + 5-pt + ResNet) "
                 f"| | | | {med('dlib', 'total'):.1f} | {med('dlib', 'cpu'):.1f} |")
    speedup = med("dlib", "total") / med("ours_1t", "total")
    speedup_cpu = med("dlib", "cpu") / med("ours_1t", "cpu")
    agree_truth = sum(ours_dec[k] == truth[k] for k in ours_dec)
    agree_dlib = sum(ours_dec[k] == dlib_dec.get(k) for k in ours_dec)
    lines += [
        "",
        f"Speed-up, whole analysis, 1 thread: **{speedup:.1f}×** over the dlib path in "
        f"wall time, **{speedup_cpu:.1f}×** in CPU time.",
        f"Same-person decisions at distance {settings.same_person_distance}: ours match the "
        f"ground truth on {agree_truth}/{len(ours_dec)} pairs and dlib's own decisions on "
        f"{agree_dlib}/{len(ours_dec)}.",
        f"Load average (1/5/15 min) at start {result['load_before']}, at end "
        f"{result['load_after']} (a shared machine: read the CPU ratio).",
    ]
    write_section("analyse", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
