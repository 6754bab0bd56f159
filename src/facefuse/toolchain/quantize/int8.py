"""Static INT8 post-training quantization with ``onnxruntime.quantization``.

``quant_pre_process`` (shape inference + ORT basic graph optimisation) runs
first, then ``quantize_static`` with one of the candidate formats of
:data:`FORMATS` and a calibration method of :data:`METHODS`. Weights are
always per-channel. Which format is fastest depends on the processor (ONNX
Runtime recommends S8S8 where VNNI / ARM dot-product exist, U8S8 otherwise),
so the pipeline measures every candidate on the host instead of guessing.

The U8S8 candidates use ``reduce_range`` (7-bit weights): on AVX2 processors
without VNNI, u8×s8 multiply-adds (``vpmaddubsw``) can saturate with full
8-bit weights, so a file quantized on a VNNI host stays correct when it is
copied to an older one.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Int8Format:
    """One candidate INT8 record format."""

    name: str
    quant_format: QuantFormat
    activation_type: QuantType
    weight_type: QuantType
    reduce_range: bool
    per_channel: bool = True

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "quant_format": self.quant_format.name,
            "activations": self.activation_type.name,
            "weights": self.weight_type.name,
            "per_channel": self.per_channel,
            "reduce_range": self.reduce_range,
        }


FORMATS: dict[str, Int8Format] = {
    "qdq-u8s8": Int8Format("qdq-u8s8", QuantFormat.QDQ, QuantType.QUInt8, QuantType.QInt8, True),
    "qop-u8s8": Int8Format("qop-u8s8", QuantFormat.QOperator, QuantType.QUInt8, QuantType.QInt8,
                           True),
    "qdq-s8s8": Int8Format("qdq-s8s8", QuantFormat.QDQ, QuantType.QInt8, QuantType.QInt8, False),
}

METHODS: dict[str, CalibrationMethod] = {
    "minmax": CalibrationMethod.MinMax,
    "percentile": CalibrationMethod.Percentile,
    "entropy": CalibrationMethod.Entropy,
}

#: Processor features that decide which integer kernels ONNX Runtime uses.
INTERESTING_FLAGS = (
    "sse4_1", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_int8", "amx_bf16", "amx_tile",
    "asimd", "asimddp", "i8mm", "sve",
)


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


def has_dot_product(flags: list[str]) -> bool:
    """True when the processor has int8 dot-product instructions (VNNI / ARM dot)."""
    return any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp"))


def host_info() -> dict[str, Any]:
    """What the quantized record depends on: processor, flags, ORT and onnx versions."""
    import onnx

    flags = cpu_flags()
    return {
        "calibration_cache": _HAS_CACHE,
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "cpu_flags": flags,
        "int8_dot_product": has_dot_product(flags),
        "onnxruntime": ort.__version__,
        "onnx": onnx.__version__,
    }


#: Per-channel QDQ needs ``DequantizeLinear``'s ``axis`` (opset 13); older graphs are
#: converted up first.
MIN_OPSET = 13


def preprocess(src: Path, dst: Path) -> str:
    """``quant_pre_process``: shape inference and ORT basic optimisation, ``src`` → ``dst``.

    Graphs below opset :data:`MIN_OPSET` (the tflite conversions are opset 11)
    are first converted up with ``onnx.version_converter``. Symbolic shape
    inference (needs ``sympy``) is tried first; models it cannot complete (the
    BlazeFace graphs' Resize ops) get ONNX shape inference only. Returns what was
    done, e.g. ``"opset 11→13, symbolic shapes"``.
    """
    import onnx
    from onnx import version_converter
    from onnxruntime.quantization.shape_inference import quant_pre_process

    dst.parent.mkdir(parents=True, exist_ok=True)
    steps = []
    model = onnx.load(str(src))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=MIN_OPSET)
    source, dst = src.resolve(), dst.resolve()
    if opset < MIN_OPSET:
        source = dst.with_name(f"{dst.stem}.opset{MIN_OPSET}.onnx")
        onnx.save(version_converter.convert_version(model, MIN_OPSET), str(source))
        steps.append(f"opset {opset}→{MIN_OPSET}")
    # When symbolic inference gives up, ORT saves its partial model (and external
    # data files) into the working directory: run it in a scratch one. This changes
    # the process's directory for the call; only the single-threaded toolchain runs it.
    with tempfile.TemporaryDirectory(prefix="facefuse-preprocess-") as scratch, \
            contextlib.chdir(scratch):
        try:
            quant_pre_process(source, str(dst))
            steps.append("symbolic shapes")
        except Exception as exc:  # ORT raises a bare Exception for incomplete inference
            log.info("quant_pre_process of %s without symbolic shape inference (%s)",
                     src.name, exc)
            quant_pre_process(source, str(dst), skip_symbolic_shape=True)
            steps.append("onnx shapes")
    if _name_nodes(dst):
        steps.append("nodes named")
    return ", ".join(steps)


def _name_nodes(path: Path) -> bool:
    """Give unnamed nodes a name (their first output's), so they can be excluded by name."""
    import onnx

    model = onnx.load(str(path))
    taken = {n.name for n in model.graph.node if n.name}
    changed = False
    for i, node in enumerate(model.graph.node):
        if node.name:
            continue
        name = node.output[0] if node.output and node.output[0] not in taken else f"node_{i}"
        node.name = name
        taken.add(name)
        changed = True
    if changed:
        onnx.save(model, str(path))
    return changed


#: Ops whose weights make a layer a "head" when it is the last one before an output.
WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


def output_heads(model_path: Path) -> list[str]:
    """Names of the last weighted nodes (Conv/MatMul/Gemm) before each graph output.

    Walks back from every output through weight-free ops (Flatten, Reshape,
    Transpose, Concat, Add, activations …) and stops at the first weighted node
    on each path. These regression/score heads set the output precision, so
    keeping them in FP32 costs little time and buys most of the accuracy back.
    """
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    producer = {out: node for node in graph.node for out in node.output}
    inits = {i.name for i in graph.initializer}
    heads: list[str] = []
    seen: set[str] = set()
    stack = [o.name for o in graph.output]
    while stack:
        tensor = stack.pop()
        node = producer.get(tensor)
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op_type in WEIGHTED_OPS:
            heads.append(node.name)
            continue
        stack.extend(i for i in node.input if i and i not in inits)
    return sorted(heads)


_HAS_CACHE = "calibration_cache_path" in inspect.signature(quantize_static).parameters

#: Calibrator options per method. ``quantize_static`` builds its Entropy
#: calibrator with 128 histogram bins and 128 quantized bins, which leaves the
#: KL search a single candidate (the full range) — i.e. MinMax again. We run
#: the calibrators ourselves with a finer histogram and hand the ranges to
#: ``quantize_static`` through its calibration cache.
CALIBRATOR_OPTIONS: dict[str, dict[str, Any]] = {
    "minmax": {},
    "percentile": {"num_bins": 2048, "percentile": 99.999, "symmetric": False},
    "entropy": {"num_bins": 1024, "num_quantized_bins": 128},
}


def calibrate(pre: Path, reader: CalibrationDataReader, method: str, cache: Path) -> Path:
    """Run ``method``'s calibrator over ``reader`` on ``pre`` and save the tensor
    ranges as a ``quantize_static`` calibration cache (JSON) at ``cache``."""
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

    rewind = getattr(reader, "rewind", None)
    if callable(rewind):
        rewind()
    with tempfile.TemporaryDirectory(prefix="facefuse-calib-") as tmp:
        calibrator = create_calibrator(
            pre, None, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
            calibrate_method=METHODS[method], extra_options=CALIBRATOR_OPTIONS[method],
        )
        calibrator.collect_data(reader)
        ranges = calibrator.compute_data()
        del calibrator
    save_tensors_data(ranges, cache)
    return cache


def quantize_int8(
    pre: Path,
    dst: Path,
    reader: CalibrationDataReader,
    fmt: Int8Format,
    method: str,
    *,
    cache: Path | None = None,
    nodes_to_exclude: list[str] | None = None,
) -> Path:
    """Quantize the pre-processed FP32 model ``pre`` into ``dst``.

    Args:
        pre: output of :func:`preprocess`.
        dst: where to write the INT8 model.
        reader: calibration inputs (rewound before use when it can be).
        fmt: the record format.
        method: a key of :data:`METHODS`.
        cache: JSON file of calibrated tensor ranges (:func:`calibrate` writes it
            when missing), so formats share one calibration per method. Without
            it (or with an onnxruntime too old for caches) ``quantize_static``
            calibrates by itself, with its own (coarser) calibrator settings.
        nodes_to_exclude: node names kept in FP32.
    """
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}")
    rewind = getattr(reader, "rewind", None)
    if callable(rewind):
        rewind()
    kwargs: dict[str, Any] = {}
    if cache is not None and _HAS_CACHE:
        if not cache.is_file():
            calibrate(pre, reader, method, cache)
        kwargs["calibration_cache_path"] = str(cache)
    else:  # quantize_static calibrates by itself, with what its options allow
        opts = CALIBRATOR_OPTIONS[method]
        kwargs["extra_options"] = {"CalibTensorRangeSymmetric": opts.get("symmetric", False)}
        if "percentile" in opts:
            kwargs["extra_options"]["CalibPercentile"] = opts["percentile"]
        if method == "entropy":
            log.warning("onnxruntime %s has no calibration cache: its Entropy calibrator runs "
                        "with 128/128 bins, which gives MinMax ranges", ort.__version__)
    dst.parent.mkdir(parents=True, exist_ok=True)
    quantize_static(
        str(pre),
        str(dst),
        reader,
        quant_format=fmt.quant_format,
        per_channel=fmt.per_channel,
        reduce_range=fmt.reduce_range,
        activation_type=fmt.activation_type,
        weight_type=fmt.weight_type,
        calibrate_method=METHODS[method],
        nodes_to_exclude=nodes_to_exclude or [],
        **kwargs,
    )
    return dst
