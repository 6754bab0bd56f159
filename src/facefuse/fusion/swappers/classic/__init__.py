"""The classic swapper (:class:`ClassicSwapper`) and every helper of its own.

``swapper`` renders the layer: dense-mesh geometry, one piecewise-affine remap,
tone transfer (see ``docs/fusion.md``). Its helpers: ``regions`` (glasses and
facial hair found as regions), ``occlusion`` (skin models and occluder masks),
``detail`` (the full-resolution detail path), ``eyes``, ``nostrils``,
``specular`` (highlights), ``light`` (spherical-harmonic relighting),
``symmetry`` (the symmetric fill) and ``source_prep`` (the per-source memo of
the render's source-side work).

Only :mod:`facefuse.fusion.swappers.build` imports this package in the library
(an import-linter contract); everything else reaches the swapper through
:func:`facefuse.fusion.swappers.build_swappers` and the
:class:`~facefuse.fusion.swappers.base.Swapper` interface.
"""

from facefuse.fusion.swappers.classic.swapper import ClassicSwapper

__all__ = ["ClassicSwapper"]
