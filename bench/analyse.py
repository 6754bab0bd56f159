"""Benchmark: face analysis per sample photo, ours vs the `face_recognition` way on dlib.

Ours: BlazeFace → 478-point mesh → dlib-chip alignment → dlib ResNet on ONNX
Runtime, at 1 and 2 threads. Baseline, in the same run: dlib-bin's HOG detector
upsampled once + the 5-point shape predictor + dlib's ResNet
(``compute_face_descriptor`` with one jitter, as face_recognition does).

    .venv/bin/python bench/analyse.py [--repeat 7]

Writes bench/results/analyse.json and the "analyse" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.samples import SAMPLES, fetch_samples, identity_of
from facefuse.toolchain.sources import DLIB_MODELS, materialise
from report import machine, machine_line, median_ms, write_json, write_section


def ours(images: dict[str, np.ndarray], threads: int, repeat: int) -> dict[str, Any]:
    settings = Settings.from_env(threads=threads)
    an = FaceAnalyser(settings)
    rec = an.models.recognizer
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
            "total": median_ms(lambda rgb=rgb: an.analyse(rgb), repeat),
        }
    return {"per_image": rows, "embeddings": embeddings}


def dlib_path(images: dict[str, np.ndarray], settings: Settings, repeat: int) -> dict[str, Any]:
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

    rows, embeddings = {}, {}
    for name, rgb in images.items():
        embeddings[name] = run(rgb)
        rows[name] = {"total": median_ms(lambda rgb=rgb: run(rgb), max(3, repeat // 2), warmup=1)}
    return {"per_image": rows, "embeddings": embeddings}


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
    result: dict[str, Any] = {"machine": m, "repeat": args.repeat}
    for threads in (1, 2):
        r = ours(images, threads, args.repeat)
        result[f"ours_{threads}t"] = r["per_image"]
        if threads == 1:
            ours_emb = r["embeddings"]
    base = dlib_path(images, settings, args.repeat)
    result["dlib"] = base["per_image"]
    truth = {f"{a}-{b}": identity_of(a) == identity_of(b)
             for a, b in itertools.combinations(sorted(SAMPLES), 2)}
    ours_dec = decisions(ours_emb, settings.same_person_distance)
    dlib_dec = decisions(base["embeddings"], settings.same_person_distance)
    result["decisions"] = {"truth": truth, "ours": ours_dec, "dlib": dlib_dec}
    write_json("analyse", result)

    def med(key: str, col: str) -> float:
        return statistics.median(v[col] for v in result[key].values())

    lines = [
        "## Face analysis (`bench/analyse.py`)",
        "",
        machine_line(m),
        f"Command: `.venv/bin/python bench/analyse.py --repeat {args.repeat}`. "
        "Median ms per sample photo (5 photos, 512–2333 px), same run.",
        "",
        "| path | detect | mesh+iris | embed | whole analysis |",
        "|---|---:|---:|---:|---:|",
    ]
    for threads in (1, 2):
        k = f"ours_{threads}t"
        lines.append(f"| facefuse, {threads} thread(s) | {med(k, 'detect'):.1f} | "
                     f"{med(k, 'mesh'):.1f} | {med(k, 'embed'):.1f} | {med(k, 'total'):.1f} |")
    lines.append(f"| face_recognition way on dlib-bin (HOG ×1 upsample + 5-pt + ResNet) "
                 f"| | | | {med('dlib', 'total'):.1f} |")
    speedup = med("dlib", "total") / med("ours_1t", "total")
    agree_truth = sum(ours_dec[k] == truth[k] for k in ours_dec)
    agree_dlib = sum(ours_dec[k] == dlib_dec.get(k) for k in ours_dec)
    lines += [
        "",
        f"Speed-up, whole analysis, 1 thread: **{speedup:.1f}×** over the dlib path.",
        f"Same-person decisions at distance {settings.same_person_distance}: ours match the "
        f"ground truth on {agree_truth}/{len(ours_dec)} pairs and dlib's own decisions on "
        f"{agree_dlib}/{len(ours_dec)}.",
    ]
    write_section("analyse", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
