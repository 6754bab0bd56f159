"""Model compression behind an accuracy gate: INT8 (static PTQ) and FP16 variants.

``facefuse models quantize`` → :func:`~facefuse.toolchain.quantize.pipeline.quantize_models`.
A variant is written into the manifest (``<model>.int8`` / ``<model>.fp16`` with
``base=<model>``) only when it passes every gate of :mod:`.gate`.
"""

from facefuse.errors import QuantizationGateError
from facefuse.toolchain.quantize.gate import Thresholds
from facefuse.toolchain.quantize.pipeline import (
    DEFAULT_MODELS,
    QuantizeOptions,
    QuantizeOutcome,
    quantize_models,
)

__all__ = [
    "DEFAULT_MODELS",
    "QuantizationGateError",
    "QuantizeOptions",
    "QuantizeOutcome",
    "Thresholds",
    "quantize_models",
]
