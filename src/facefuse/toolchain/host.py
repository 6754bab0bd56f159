"""What machine a measurement ran on: processor model, the instruction-set flags that
decide which kernels ONNX Runtime picks, core count and library versions.

One description for every report: the benches' BENCHMARKS.md sections, the quantize
report and the record of each quantized model.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

import onnxruntime as ort

#: Processor features that decide which integer and float kernels ONNX Runtime uses.
INTERESTING_FLAGS = (
    "sse4_1", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_int8", "amx_bf16", "amx_tile",
    "asimd", "asimddp", "i8mm", "sve",
)

#: The flags a one-line description names (the rest stay in the full record).
SUMMARY_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "fma")


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The :data:`INTERESTING_FLAGS` this processor reports (Linux ``/proc/cpuinfo``)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return []
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return [f for f in INTERESTING_FLAGS if f in flags]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name (``/proc/cpuinfo``), else :func:`platform.processor`."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> dict[str, Any]:
    """CPU model, usable cores, the :data:`SUMMARY_FLAGS` present, Python and ONNX
    Runtime versions, today's date (what every bench records)."""
    flags = cpu_flags()
    return {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "flags": [f for f in SUMMARY_FLAGS if f in flags],
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "date": time.strftime("%Y-%m-%d"),
    }


def describe_line(m: dict[str, Any] | None = None) -> str:
    """``Machine: <cpu>, <n> cores (<flags>), Python …, onnxruntime …, <date>.``"""
    m = m if m is not None else describe()
    return (f"Machine: {m['cpu']}, {m['cores']} cores ({', '.join(m['flags'])}), "
            f"Python {m['python']}, onnxruntime {m['onnxruntime']}, {m['date']}.")
