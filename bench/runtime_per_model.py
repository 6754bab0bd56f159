"""Benchmark: ONNX Runtime vs PyTorch eager per model, and FP32 vs INT8 load memory
(bench only: needs torch and onnx2torch, ``make bench-gpu-deps``).

For each analysis model (detector, face mesh, iris, recogniser) and each runtime:

* ``ort fp32``: the model file as the product runs it (facefuse's session factory,
  ``--threads`` intra-op threads, the product's memory options);
* ``torch fp32``: the same file converted with onnx2torch (bench/torch_graphs.py),
  saved as a whole torch module (``torch.save``) beforehand, then loaded with
  ``torch.load`` as a PyTorch service would load its model; eager, ``--threads``
  threads, ``torch.inference_mode``;
* ``ort int8``: the INT8 variant in the record format and calibration method the
  quantizer keeps for that model (QDQ or QOperator u8s8, output heads in FP32),
  built here with facefuse's own quantization functions on a small calibration set
  (the load memory does not depend on the calibration ranges);

at batch 1 and 8, each measurement in a fresh Python process: RSS after the imports
(runtime, numpy), the RSS growth from loading the model, median and p95 latency per
batch over ``--iters`` runs after warm-up (seeded random input of the model's shape),
and the process's peak RSS (VmHWM) at the end.

    .venv/bin/python bench/runtime_per_model.py [--iters 30] [--benchmarks]

Writes bench/results/runtime_per_model.json and, with ``--benchmarks``, the
"runtime-per-model" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings

MODELS = ("blazeface_full", "facemesh", "iris", "dlib_resnet")
RUNTIMES = ("ort fp32", "torch fp32", "ort int8")
#: (record format, calibration method) the quantizer keeps per model (BENCHMARKS.md,
#: quantization section); all with the output heads kept in FP32.
INT8_CHOICE = {"blazeface_full": ("qdq-u8s8", "percentile"),
               "facemesh": ("qop-u8s8", "minmax"),
               "iris": ("qop-u8s8", "percentile"),
               "dlib_resnet": ("qop-u8s8", "percentile")}


# --- the probe: one fresh process per measurement ---------------------------------------------


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def probe(runtime: str, path: Path, shape: list[int], iters: int, threads: int) -> dict[str, Any]:
    """Load ``path`` in ``runtime`` and time it on a seeded input of ``shape`` (this
    process: run it fresh)."""
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    if runtime.startswith("torch"):
        import torch

        import torch_graphs

        torch_graphs.import_onnx2torch()  # its classes, for unpickling the saved module
        torch.set_num_threads(threads)
        base = _status_mb("VmRSS")
        module = torch.load(path, weights_only=False).eval()

        def run() -> object:
            with torch.inference_mode():
                return module(torch.from_numpy(x))
    else:
        import onnxruntime  # noqa: F401  (counted in the baseline)

        from facefuse.runtime.session import create_session

        base = _status_mb("VmRSS")
        session = create_session(path, Settings(threads=threads, precision="fp32"))
        name = session.get_inputs()[0].name

        def run() -> object:
            return session.run(None, {name: x})
    loaded = _status_mb("VmRSS")
    for _ in range(3):
        run()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1000.0)
    return {"import_rss_mb": round(base, 1), "load_mb": round(loaded - base, 1),
            "ms_p50": round(statistics.median(times), 2),
            "ms_p95": round(float(np.percentile(times, 95)), 2),
            "peak_rss_mb": round(_status_mb("VmHWM"), 1)}


def fresh(runtime: str, path: Path, shape: list[int], iters: int, threads: int) -> dict[str, Any]:
    """:func:`probe` in a new Python process."""
    cmd = [sys.executable, __file__, "probe", runtime, str(path), ",".join(map(str, shape)),
           str(iters), str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"probe {runtime} {path.name} failed: {proc.stderr[-1500:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


# --- preparing the files ----------------------------------------------------------------------


def torch_files(settings: Settings, names: list[str], into: Path) -> dict[str, Path]:
    """Each model converted to a torch module and saved whole (``torch.save``)."""
    import torch

    from facefuse.runtime.registry import ModelRegistry
    from torch_graphs import torch_model

    registry = ModelRegistry(settings)
    out = {}
    for name in names:
        spec = registry.manifest.get(name)
        out[name] = into / f"{name}.pt"
        torch.save(torch_model(settings.model_dir / spec.file, "cpu"), out[name])
    return out


def int8_files(settings: Settings, names: list[str], into: Path, per_photo: int
               ) -> dict[str, Path]:
    """Each model's INT8 variant in the quantizer's kept format (small calibration set)."""
    from facefuse.faces.analyser import FaceAnalyser
    from facefuse.runtime.registry import ModelRegistry
    from facefuse.toolchain.quantize.calibration import (
        build_stage_data,
        calibration_plan,
        calibration_reader,
        load_photos,
    )
    from facefuse.toolchain.quantize.int8 import FORMATS, output_heads, preprocess, quantize_int8
    from facefuse.toolchain.samples import fetch_samples

    registry = ModelRegistry(settings)
    photos = load_photos(fetch_samples(settings.samples_dir, settings.downloads_dir))
    data = build_stage_data(FaceAnalyser(settings, registry), photos,
                            calibration_plan(sorted(photos), per_photo))
    out = {}
    for name in names:
        spec = registry.manifest.get(name)
        pre = into / f"{name}.pre.onnx"
        preprocess(settings.model_dir / spec.file, pre)
        fmt, method = INT8_CHOICE[name]
        out[name] = quantize_int8(pre, into / f"{name}.int8.onnx",
                                  calibration_reader(data, name, spec.inputs[0].name, batch_size=1),
                                  FORMATS[fmt], method,
                                  cache=into / f"{name}.{method}.ranges.json",
                                  nodes_to_exclude=output_heads(pre))
    return out


# --- the run ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS))
    ap.add_argument("--batches", type=lambda s: [int(v) for v in s.split(",")], default=[1, 8])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--calibration-per-photo", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    ap.add_argument("--benchmarks", action="store_true",
                    help="also write the 'runtime-per-model' section of BENCHMARKS.md")
    ap.add_argument("--from-json", type=Path,
                    help="no measurement: redo the report of a saved run")
    args = ap.parse_args(argv)
    if args.from_json:
        return finish(json.loads(args.from_json.read_text()), args.out, args.benchmarks)
    if unknown := set(args.models) - set(MODELS):
        ap.error(f"unknown models {sorted(unknown)}; choose from {', '.join(MODELS)}")
    t_start = time.monotonic()
    settings = Settings.from_env(precision="fp32")
    from facefuse.runtime.registry import ModelRegistry
    from report import arguments, machine

    manifest = ModelRegistry(settings).manifest
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="facefuse-runtimes-") as tmp:
        files = {"ort fp32": {n: settings.model_dir / manifest.get(n).file for n in args.models},
                 "torch fp32": torch_files(settings, args.models, Path(tmp)),
                 "ort int8": int8_files(settings, args.models, Path(tmp),
                                        args.calibration_per_photo)}
        for name in args.models:
            spec = manifest.get(name)
            dims = [int(d) for d in spec.inputs[0].shape[1:]]
            for b in args.batches:
                for runtime in RUNTIMES:  # interleaved per model and batch
                    row = fresh(runtime, files[runtime][name], [b, *dims], args.iters,
                                args.threads)
                    row["file_mb"] = round(files[runtime][name].stat().st_size / 2**20, 1)
                    rows.setdefault(name, {})[f"{runtime} b{b}"] = row
                    print(name, runtime, b, row, flush=True)
    res = {"machine": machine(), "args": arguments(args),
           "rows": rows, "wall_s": round(time.monotonic() - t_start, 1)}
    return finish(res, args.out, args.benchmarks)


def finish(res: dict[str, Any], out: Path, benchmarks: bool) -> int:
    """JSON and the report of a run."""
    from report import write_json

    write_json("runtime_per_model", res, out)
    text = report(res)
    print(text)
    if benchmarks:
        from report import write_section

        write_section("runtime-per-model", text)
    return 0


def report(res: dict[str, Any]) -> str:
    from report import machine_line

    a = res["args"]
    lines = [
        "## ONNX Runtime vs PyTorch eager per model, FP32 vs INT8 (`bench/runtime_per_model.py`)",
        "",
        machine_line(res["machine"]) + f" Shared with other work while measured. "
        f"{res['wall_s']:.0f} s.", "",
        f"Command: `make bench-naive` (`python bench/runtime_per_model.py --iters {a['iters']} "
        f"--benchmarks`). Every cell is a fresh Python process with {a['threads']} intra-op "
        "thread(s): import RSS (runtime + numpy), the RSS growth from loading the model "
        "(torch: `torch.load` of the onnx2torch module saved whole; ORT: facefuse's session "
        "factory), latency per batch (median and p95 of "
        f"{a['iters']} runs after 3 warm-ups, seeded random input) and the process's peak "
        "RSS. INT8: the quantizer's kept format per model (u8s8, FP32 output heads), "
        f"calibrated here on {a['calibration_per_photo']} augmentations per sample photo.",
        "",
        "| model | batch | runtime | file MB | import RSS MiB | load MiB | ms p50 | ms p95 "
        "| peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, cells in res["rows"].items():
        for key, r in cells.items():
            runtime, b = key.rsplit(" b", 1)
            lines.append(f"| {name} | {b} | {runtime} | {r['file_mb']} | {r['import_rss_mb']:.0f}"
                         f" | {r['load_mb']:.1f} | {r['ms_p50']:.2f} | {r['ms_p95']:.2f} | "
                         f"{r['peak_rss_mb']:.0f} |")
    lines += ["", "| model | batch | ORT / torch: latency p50 | peak RSS | INT8 / FP32 (ORT): "
              "load | peak RSS |", "|---|---|---|---|---|---|"]
    for name, cells in res["rows"].items():
        for b in a["batches"]:
            o, t, q = (cells[f"{r} b{b}"] for r in RUNTIMES)
            load = f"{q['load_mb'] / o['load_mb']:.2f}×" if o["load_mb"] > 0 else "–"
            lines.append(f"| {name} | {b} | {o['ms_p50'] / t['ms_p50']:.2f}× | "
                         f"{o['peak_rss_mb'] / t['peak_rss_mb']:.2f}× | {load} | "
                         f"{q['peak_rss_mb'] / o['peak_rss_mb']:.2f}× |")
    cells = [(k, r) for c in res["rows"].values() for k, r in c.items()]
    b1 = a["batches"][0]
    imports = {rt: statistics.median(r["import_rss_mb"] for k, r in cells if k.startswith(rt))
               for rt in ("ort", "torch")}
    lines += ["", f"Most of the peak-RSS gap is the runtime itself: a process that has imported "
              f"torch holds {imports['torch']:.0f} MiB before any model, one that has imported "
              f"onnxruntime {imports['ort']:.0f} MiB (medians of the cells); the model's own "
              "load is smaller in torch (its weights only; ORT also builds its optimised "
              "graph and arena). INT8 / FP32 load memory per model at batch 1: "
              + ", ".join(f"{n} {q['load_mb'] / o['load_mb']:.2f}×" for n, o, q in (
                  (n, c[f"ort fp32 b{b1}"], c[f"ort int8 b{b1}"]) for n, c in res["rows"].items())
                          if o["load_mb"] > 0)
              + " (INT8 shrinks the weights; a session's fixed cost stays)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "probe":
        rt, model, shape, iters, threads = sys.argv[2:7]
        print(json.dumps(probe(rt, Path(model), [int(v) for v in shape.split(",")],
                               int(iters), int(threads))))
        sys.exit(0)
    sys.exit(main())
