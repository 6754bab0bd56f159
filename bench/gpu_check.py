"""The GPU check: our models and fusion pixel graphs on a PyTorch device, in one run.

Made for a lent GPU machine that has PyTorch (CUDA), onnx and the CPU build of
ONNX Runtime but no registry access (see docs/gpu.md for what to carry there).
ONNX Runtime's CUDA provider cannot be measured on such a machine, so:

* each analysis model is converted with onnx2torch and timed on ``--device`` in
  FP32 and FP16 at batch 1, 8, 32 and 64 (latency per item, host arrays in and
  out, i.e. including the copies); its outputs on the real evaluation inputs
  (sample photos, seeded augmentations) go through the same accuracy gate as
  the FP16/INT8 variants against the CPU ONNX Runtime FP32 results;
* the fusion pixel graphs the product ships (remap, lighting, multi-band blend)
  run on ``--device`` through ``bench/torch_graphs.py``, per face, for targets
  of 1024 and 4096 px, next to OpenCV and ONNX Runtime on the CPU, with the PSNR
  of the fused image against the OpenCV path;
* an end-to-end estimate: model time per fusion (2 detector letterboxes, 2 mesh
  ROIs, 4 iris crops, 2 recogniser chips) at batch 1 and at the best batch, and
  fusions per second with the pixel stages added.

    OUT=/tmp/out python bench/gpu_check.py                 # on the GPU machine
    python bench/gpu_check.py --device cpu --iters 2 --batches 1,2 --sizes 512

Writes ``$OUT/gpu_check.json`` and ``$OUT/gpu_check.md`` (default folder:
bench/results/gpu_check). Stays inside ``--budget-s`` (default 420 s): what does
not fit is listed as skipped.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.swappers import build_swappers
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.pixels import OnnxPixels, OpenCVPixels, PixelBackend, load_graph
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.quantize.calibration import build_stage_data, evaluation_plan, load_photos
from facefuse.toolchain.quantize.evaluate import Evaluator
from facefuse.toolchain.samples import fetch_samples
from report import arguments, machine, machine_line, write_json, write_section
from torch_graphs import TorchGraph, TorchRunner, torch_model

MODELS = ("blazeface_full", "facemesh", "iris", "dlib_resnet")
#: Model inputs per fusion of one source and one target face (evaluation on).
ITEMS_PER_FUSION = {"blazeface_full": 2, "facemesh": 2, "iris": 4, "dlib_resnet": 2}
PAIR = ("obama", "biden")
STAGES = ("remap", "lighting", "multiband")


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class TorchPixels(OnnxPixels):
    """The product's pixel graphs, run on a torch device instead of ONNX Runtime."""

    name = "torch"

    def __init__(self, settings: Settings, device: str) -> None:
        super().__init__(settings)
        self.torch_device = device
        self._graphs: dict[str, TorchGraph] = {}

    def _run(self, graph: str, **inputs: np.ndarray) -> Any:
        g = self._graphs.get(graph)
        if g is None:
            g = self._graphs[graph] = TorchGraph(load_graph(graph), self.torch_device)
        with torch.inference_mode():
            out = g(**{k: g.to_device(v) for k, v in inputs.items()})
            return out.float().cpu().numpy()


class TimedPixels:
    """Wraps a backend and records the wall time of each stage call, in ms."""

    def __init__(self, inner: PixelBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.times: dict[str, list[float]] = {s: [] for s in STAGES}

    def _timed(self, stage: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self.times[stage].append((time.perf_counter() - t0) * 1000.0)
        return out

    def remap(self, *a: Any) -> Any:
        return self._timed("remap", self.inner.remap, *a)

    def lighting(self, *a: Any) -> Any:
        return self._timed("lighting", self.inner.lighting, *a)

    def multiband(self, *a: Any) -> Any:
        return self._timed("multiband", self.inner.multiband, *a)


def ms_per_item(fn: Callable[[], object], batch: int, iters: int, device: str) -> float:
    """Median ms of ``fn()`` over ``iters`` runs (after 2 warm-ups), divided by ``batch``."""
    for _ in range(2):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times) / batch


def tiled(tensors: np.ndarray, batch: int) -> np.ndarray:
    reps = math.ceil(batch / len(tensors))
    return np.ascontiguousarray(np.concatenate([tensors] * reps)[:batch], np.float32)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.skipped: list[str] = []

    def left(self, what: str) -> bool:
        if time.monotonic() < self.end:
            return True
        self.skipped.append(what)
        return False


def check_models(args: argparse.Namespace, settings: Settings, registry: ModelRegistry,
                 analyser: FaceAnalyser, budget: Budget) -> dict[str, Any]:
    photos = load_photos(fetch_samples(settings.samples_dir, settings.downloads_dir))
    data = build_stage_data(analyser, photos, evaluation_plan(sorted(photos), args.per_photo))
    fp32 = {n: registry.get(n) for n in args.models}
    evaluator = Evaluator(data, fp32, settings)
    out: dict[str, Any] = {"inputs": data.summary()["inputs"]}
    for name in args.models:
        tensors = data.tensors(name)
        base = torch_model(fp32[name].path, args.device)
        rows: dict[str, Any] = {}
        for prec, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
            module = base if prec == "fp32" else copy.deepcopy(base).half()
            runner = TorchRunner(fp32[name].spec, module, args.device, dtype)
            gate = evaluator.judge(name, runner)  # type: ignore[arg-type]
            lat: dict[int, float] = {}
            for b in args.batches:
                if not budget.left(f"{name} {prec} batch {b}"):
                    break
                x = tiled(tensors, b)
                lat[b] = ms_per_item(lambda r=runner, x=x: r.run(x), b, args.iters, args.device)
            rows[prec] = {"gate": "pass" if gate.passed else "FAIL", "failures": gate.failures,
                          "figures": gate.figures, "ms_per_item": lat}
            print(name, prec, rows[prec]["gate"], lat, flush=True)
        ort_lat: dict[int, float] = {}
        for b in args.batches[:2]:
            if not budget.left(f"{name} onnxruntime-cpu batch {b}"):
                break
            x = tiled(tensors, b)
            ort_lat[b] = ms_per_item(lambda m=fp32[name], x=x: m.run(x), b, args.iters, "cpu")
        rows["onnxruntime_cpu_fp32"] = {"ms_per_item": ort_lat}
        out[name] = rows
    return out


def resize_long(img: np.ndarray, long_side: int) -> np.ndarray:
    scale = long_side / max(img.shape[:2])
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
    return np.ascontiguousarray(cv2.resize(img, None, fx=scale, fy=scale, interpolation=interp))


def check_pixels(args: argparse.Namespace, settings: Settings, analyser: FaceAnalyser,
                 budget: Budget) -> dict[str, Any]:
    paths = fetch_samples(settings.samples_dir, settings.downloads_dir)
    photos = load_photos(paths)
    src = photos[PAIR[0]]
    sf = analyser.analyse(src)[0]
    every: dict[str, Callable[[], PixelBackend]] = {
        "opencv_cpu": OpenCVPixels, "onnxruntime_cpu": lambda: OnnxPixels(settings),
        "graphs_torch": lambda: TorchPixels(settings, args.device)}
    backends = {(f"graphs_torch_{args.device}" if b == "graphs_torch" else b): every[b]()
                for b in args.pixel_backends}
    opts = FuseOptions(degree=100, evaluate=False)
    out: dict[str, Any] = {}
    for size in args.sizes:
        tgt = resize_long(photos[PAIR[1]], size)
        tf = analyser.analyse(tgt)
        row: dict[str, Any] = {"face_width_px": round(tf[0].width)}
        ref_img = None
        for bname, backend in backends.items():
            if not budget.left(f"pixels {size} px {bname}"):
                break
            timed = TimedPixels(backend)
            fuser = FaceFuser(settings, analyser, swappers=build_swappers(
                settings, analyser.registry, pixels=timed))  # type: ignore[arg-type]
            fuser.pixels = timed  # type: ignore[assignment]
            stage_ms = ms_per_item(
                lambda f=fuser, t=tgt, tf=tf: f.fuse_faces(src, sf, t, tf, [0], opts),
                1, args.iters, args.device)
            image = fuser.fuse_faces(src, sf, tgt, tf, [0], opts).image
            if ref_img is None:
                ref_img = image
            n = 2 + args.iters + 1  # warm-ups, timed runs, the image
            row[bname] = {
                "fuse_stage_ms": stage_ms,
                # remap runs twice per face: per face = total / runs
                **{f"{s}_ms_per_face": sum(timed.times[s]) / n for s in STAGES},
                "psnr_vs_opencv_db": psnr(image, ref_img),
            }
            print(size, bname, row[bname], flush=True)
        out[str(size)] = row
    return out


def throughput(models: dict[str, Any], pixels: dict[str, Any], device: str) -> dict[str, Any]:
    """Model time per fusion at batch 1 vs the best batch, and fusions/s with pixel stages
    (over the models checked; all four for a real estimate)."""
    out: dict[str, Any] = {}
    names = [n for n in MODELS if n in models]
    if not names:
        return out
    first = next(iter(pixels.values()), {})
    dev = first.get(f"graphs_torch_{device}", {})
    pixel_ms = sum(dev.get(f"{s}_ms_per_face", 0.0) for s in STAGES)
    for prec in ("fp32", "fp16"):
        per_batch: dict[int, float] = {}
        batches = set.intersection(*[set(models[n][prec]["ms_per_item"]) for n in names])
        for b in sorted(batches):
            per_batch[b] = sum(ITEMS_PER_FUSION[n] * models[n][prec]["ms_per_item"][b]
                               for n in names)
        if not per_batch:
            continue
        best = min(per_batch, key=lambda b: per_batch[b])
        out[prec] = {
            "model_ms_per_fusion": per_batch, "best_batch": best,
            "batching_gain": per_batch[min(per_batch)] / per_batch[best],
            "fusions_per_s_models_only": 1000.0 / per_batch[best],
            "pixel_ms_per_face": pixel_ms,
            "fusions_per_s_with_pixels": 1000.0 / (per_batch[best] + pixel_ms),
        }
    return out


def markdown(res: dict[str, Any]) -> str:
    env, batches = res["environment"], res["args"]["batches"]
    lines = [f"Device: {env['device_name']} (torch {env['torch']}, onnxruntime "
             f"{env['onnxruntime']} on the CPU); host CPU: {env['cpu']} (shared)."]
    names = [n for n in res["args"]["models"] if n in res["models"]]
    if names:
        lines += ["", "| model | precision | gate vs ORT CPU FP32 | "
                  + " | ".join(f"batch {b} (ms/item)" for b in batches) + " |",
                  "|---|---|---|" + "---:|" * len(batches)]
    for name in names:
        for prec in ("fp32", "fp16", "onnxruntime_cpu_fp32"):
            row = res["models"][name][prec]
            lat = row["ms_per_item"]
            cells = [f"{lat[b]:.3f}" if b in lat else "—" for b in batches]
            label = "ORT CPU fp32" if prec.startswith("onnx") else f"torch {prec}"
            lines.append(f"| {name} | {label} | {row.get('gate', '—')} | " + " | ".join(cells)
                         + " |")
    if res["pixels"]:
        lines += ["", "| target long side | face px | backend | remap | lighting | multiband "
                  "| fusion stage | PSNR vs OpenCV (dB) |",
                  "|---:|---:|---|---:|---:|---:|---:|---:|"]
    for size, row in res["pixels"].items():
        for bname, r in row.items():
            if not isinstance(r, dict):
                continue
            lines.append(f"| {size} | {row['face_width_px']} | {bname} | "
                         f"{r['remap_ms_per_face']:.1f} | {r['lighting_ms_per_face']:.1f} | "
                         f"{r['multiband_ms_per_face']:.1f} | {r['fuse_stage_ms']:.1f} | "
                         f"{r['psnr_vs_opencv_db']:.1f} |")
    if res["throughput"]:
        lines += ["", "| precision | model ms per fusion (batch: ms) | best batch | batching "
                  "gain | fusions/s (models) | fusions/s (models + pixels) |",
                  "|---|---|---:|---:|---:|---:|"]
    for prec, t in res["throughput"].items():
        per = ", ".join(f"{b}: {v:.2f}" for b, v in t["model_ms_per_fusion"].items())
        lines.append(f"| {prec} | {per} | {t['best_batch']} | {t['batching_gain']:.1f}× | "
                     f"{t['fusions_per_s_models_only']:.0f} | "
                     f"{t['fusions_per_s_with_pixels']:.0f} |")
    if res["skipped"]:
        lines += ["", "Skipped (time budget): " + "; ".join(res["skipped"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="torch device: cuda, cuda:1, cpu")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get(
        "OUT", Path(__file__).resolve().parent / "results" / "gpu_check")))
    ap.add_argument("--batches", type=lambda s: [int(v) for v in s.split(",")],
                    default=[1, 8, 32, 64])
    ap.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")],
                    default=[1024, 4096])
    ap.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS))
    ap.add_argument("--parts", type=lambda s: s.split(","), default=["models", "pixels"])
    ap.add_argument("--pixel-backends", type=lambda s: s.split(","),
                    default=["opencv_cpu", "onnxruntime_cpu", "graphs_torch"])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--per-photo", type=int, default=3, help="augmentations per sample photo")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--benchmarks", action="store_true",
                    help="also write the 'gpu_check' section of BENCHMARKS.md")
    args = ap.parse_args(argv)
    if unknown := set(args.models) - set(MODELS):
        ap.error(f"unknown models {sorted(unknown)}; choose from {', '.join(MODELS)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch; use --device cpu", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    budget = Budget(args.budget_s)
    settings = Settings.from_env(threads=os.cpu_count() or 1, precision="fp32",
                                 providers=("cpu",))
    registry = ModelRegistry(settings)
    analyser = FaceAnalyser(settings, registry)
    env = {**machine(), "torch": torch.__version__, "device": args.device,
           "device_name": torch.cuda.get_device_name(args.device)
           if args.device.startswith("cuda") else "CPU (torch)"}
    models = check_models(args, settings, registry, analyser, budget) \
        if "models" in args.parts else {}
    pixels = check_pixels(args, settings, analyser, budget) if "pixels" in args.parts else {}
    res = {"environment": env, "args": arguments(args),
           "models": models, "pixels": pixels,
           "throughput": throughput(models, pixels, args.device),
           "skipped": budget.skipped, "wall_s": round(time.monotonic() - t0, 1)}
    write_json("gpu_check", res, args.out)
    (args.out / "gpu_check.md").write_text(markdown(res))
    print(markdown(res))
    if args.benchmarks:
        gpu = args.device.startswith("cuda")
        cmd = " ".join(["python bench/gpu_check.py", *(argv if argv is not None else sys.argv[1:])])
        write_section("gpu_check", "\n".join([
            "## GPU check (`bench/gpu_check.py`)", "",
            machine_line(env) + ("" if gpu else " **No GPU: these are CPU figures only; the "
                                 "GPU figures are still missing** (see docs/gpu.md)."),
            f"Command: `{cmd}`. Pixel stages: ms per face (the remap runs twice per face), "
            "fusion stage = `fuse_faces` without evaluation, PSNR of the fused image "
            "against the OpenCV path.", "", markdown(res)]))
    print(f"wrote {args.out}/gpu_check.json and gpu_check.md in {res['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
