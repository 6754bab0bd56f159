"""The neural swapper plug-in: ONNX face-swap models declared in the manifest.

``contract`` (what a manifest ``task: "swap"`` entry must declare), ``crop``
(align, crop, paste back) and ``runner`` (:class:`OnnxSwapper`: the model run on
one face). See ``docs/swappers.md``.

Only :mod:`facefuse.fusion.swappers.build` imports this package in the library
(an import-linter contract); everything else reaches the swapper through
:func:`facefuse.fusion.swappers.build_swappers` and the
:class:`~facefuse.fusion.swappers.base.Swapper` interface.
"""

from facefuse.fusion.swappers.onnx.contract import SWAP_TASK
from facefuse.fusion.swappers.onnx.runner import OnnxSwapper

__all__ = ["SWAP_TASK", "OnnxSwapper"]
