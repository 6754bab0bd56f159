"""The only door to a swapper.

:mod:`~facefuse.fusion.swappers.base` is the interface every swapper meets
(:class:`Swapper`, its :class:`FaceLayer`) and what it declares of itself (the
source embedding it needs, whether it survives a fork, ...);
:func:`build_swappers` makes every available one. The swappers themselves,
``classic/`` and ``onnx/``, each keep their helpers to themselves: nothing
outside a swapper's package imports it but :mod:`~facefuse.fusion.swappers.build`
(an import-linter contract in ``pyproject.toml``).
"""

from facefuse.fusion.swappers.base import FaceLayer, Swapper, SwapperInfo
from facefuse.fusion.swappers.build import build_swappers, describe_swapper

__all__ = ["FaceLayer", "Swapper", "SwapperInfo", "build_swappers", "describe_swapper"]
