"""Shared benchmark plumbing: machine description, medians, BENCHMARKS.md sections."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from facefuse.toolchain import reporting

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
RESULTS = ROOT / "bench" / "results"


def machine() -> dict[str, Any]:
    """CPU model, core count, flags of interest, onnxruntime version."""
    import onnxruntime as ort

    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "fma")
    try:
        ncpu = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
    except (OSError, ValueError):
        ncpu = 0
    return {
        "cpu": model, "cores": ncpu, "flags": sorted(f for f in wanted if f in flags),
        "python": platform.python_version(), "onnxruntime": ort.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def median_ms(fn: Callable[[], object], repeat: int, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def write_json(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def write_section(name: str, markdown: str) -> None:
    """Replace (or append) section ``name`` of BENCHMARKS.md."""
    reporting.write_section(BENCHMARKS, name, markdown)


def publish(name: str, lines: list[str]) -> None:
    """Write ``lines`` as section ``name`` of BENCHMARKS.md and print them."""
    markdown = "\n".join(lines)
    write_section(name, markdown)
    print(markdown)


def machine_line(m: dict[str, Any]) -> str:
    return (f"Machine: {m['cpu']}, {m['cores']} cores ({', '.join(m['flags'])}), "
            f"Python {m['python']}, onnxruntime {m['onnxruntime']}, {m['date']}.")
