"""Measurements for the quantization report: latency, load cost (RSS), whole analysis.

Latencies of the models being compared are measured *interleaved* (one run of
each in turn, repeated), so that load from other processes on a shared
machine hits every variant alike; the figure is the median.

``python -m facefuse.toolchain.quantize.bench rss MODEL THREADS C H W`` is the
fresh process in which :func:`load_rss` measures one model.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from facefuse.config import Settings
from facefuse.faces.analyser import StageTimer
from facefuse.runtime.session import create_session


def compare_latency(
    models: Mapping[str, Path],
    tensors: np.ndarray,
    *,
    batch: int,
    threads: int,
    rounds: int = 20,
    min_seconds: float = 1.0,
    input_name: str | None = None,
) -> dict[str, float]:
    """Median milliseconds **per input** of each model at ``batch`` and ``threads``.

    Args:
        models: label → ONNX file (all with the same input).
        tensors: (N, C, H, W) float32 real inputs; a batch is the first ``batch``
            of them (repeated if N < batch).
        rounds: interleaved rounds at least; more until ``min_seconds`` have passed.
    """
    settings = Settings(threads=threads, precision="fp32")
    reps = -(-batch // len(tensors))
    x = np.ascontiguousarray(np.concatenate([tensors] * reps)[:batch], np.float32)
    sessions = {k: create_session(p, settings) for k, p in models.items()}
    feeds = {k: {input_name or s.get_inputs()[0].name: x} for k, s in sessions.items()}
    for k, s in sessions.items():  # warm up: arena, kernels
        for _ in range(2):
            s.run(None, feeds[k])
    times: dict[str, list[float]] = {k: [] for k in sessions}
    start = time.perf_counter()
    n = 0
    while n < rounds or (time.perf_counter() - start < min_seconds and n < 50 * rounds):
        for k, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, feeds[k])
            times[k].append(time.perf_counter() - t0)
        n += 1
    return {k: float(np.median(v)) * 1000.0 / batch for k, v in times.items()}


def _rss_bytes() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def load_rss(model: Path, input_shape: Sequence[int], threads: int = 1,
             timeout: float = 300.0) -> dict[str, int]:
    """RSS cost of one model, measured in a fresh Python process.

    Returns bytes: ``baseline`` (numpy + onnxruntime + facefuse imported),
    ``load`` (RSS growth from creating the session) and ``first_run`` (further
    growth from one batch-1 run: arena, kernels).
    """
    cmd = [sys.executable, "-m", "facefuse.toolchain.quantize.bench", "rss", str(model),
           str(threads), *(str(int(d)) for d in input_shape)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"RSS probe failed for {model}: {proc.stderr.strip()[-500:]}")
    out: dict[str, int] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _rss_probe(argv: Sequence[str]) -> None:
    model, threads, *shape = argv
    import onnxruntime  # noqa: F401  (counted in the baseline)

    base = _rss_bytes()
    session = create_session(Path(model), Settings(threads=int(threads), precision="fp32"))
    loaded = _rss_bytes()
    x = np.zeros([1, *(int(d) for d in shape)], np.float32)
    session.run(None, {session.get_inputs()[0].name: x})
    ran = _rss_bytes()
    print(json.dumps({"baseline": base, "load": loaded - base, "first_run": ran - loaded}))


def analysis_latency(
    analysers: Mapping[str, Any],
    images: Sequence[np.ndarray],
    rounds: int = 5,
) -> dict[str, dict[str, float]]:
    """Median ms per image of ``analyser.analyse`` for each analyser, interleaved.

    Returns label → {"total": ms, <stage>: ms, ...} (stage medians from the
    analyser's :class:`~facefuse.faces.analyser.StageTimer`).
    """

    totals: dict[str, list[float]] = {k: [] for k in analysers}
    stages: dict[str, dict[str, list[float]]] = {k: {} for k in analysers}
    for a in analysers.values():  # warm up
        a.analyse(images[0])
    for _ in range(rounds):
        for img in images:
            for k, a in analysers.items():
                timer = StageTimer()
                t0 = time.perf_counter()
                a.analyse(img, timer=timer)
                totals[k].append((time.perf_counter() - t0) * 1000.0)
                for stage, ms in timer.ms.items():
                    stages[k].setdefault(stage, []).append(ms)
    return {
        k: {"total": float(np.median(totals[k])),
            **{s: float(np.median(v)) for s, v in stages[k].items()}}
        for k in analysers
    }


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(result, seconds) of calling ``fn``."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


if __name__ == "__main__":  # pragma: no cover - exercised through load_rss
    if len(sys.argv) >= 2 and sys.argv[1] == "rss":
        _rss_probe(sys.argv[2:])
    else:
        sys.exit("usage: python -m facefuse.toolchain.quantize.bench rss MODEL THREADS C H W")
