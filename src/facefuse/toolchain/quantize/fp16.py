"""FP16 variants for GPUs: onnxconverter-common's float16 conversion.

Inputs and outputs stay FP32 (``keep_io_types``), so callers feed and read the
same arrays as with the FP32 model; the converter inserts the casts. Ops that
lose too much in half precision can be kept in FP32 per model through
:data:`BLOCKLISTS` (added to the converter's own default block list).
"""

from __future__ import annotations

import warnings
from pathlib import Path

#: Per-model op types kept in FP32 (beyond onnxconverter-common's defaults).
#: Measured on the sample photos: none of the zoo models needs one to pass the gate.
BLOCKLISTS: dict[str, list[str]] = {
    "blazeface_full": [],
    "blazeface_short": [],
    "facemesh": [],
    "iris": [],
    "dlib_resnet": [],
}


def convert_fp16(src: Path, dst: Path, *, op_block_list: list[str] | None = None) -> Path:
    """Write an FP16 copy of the ONNX model ``src`` to ``dst`` (IO kept FP32).

    Args:
        src: FP32 ONNX model.
        dst: output path.
        op_block_list: op types to keep in FP32, in addition to the converter's defaults.
    """
    import onnx
    from onnxconverter_common import float16

    model = onnx.load(str(src))
    blocked = sorted(set(float16.DEFAULT_OP_BLOCK_LIST) | set(op_block_list or []))
    with warnings.catch_warnings():
        # One warning per weight below FP16's range, clamped to ±1e-7: expected, and the
        # accuracy gate judges the result.
        warnings.simplefilter("ignore", UserWarning)
        converted = float16.convert_float_to_float16(model, keep_io_types=True,
                                                     op_block_list=blocked)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(converted, str(dst))
    return dst
