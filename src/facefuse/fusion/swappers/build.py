"""Every available swapper, made in one place."""

from __future__ import annotations

from facefuse.config import Settings
from facefuse.fusion.swappers.base import Swapper
from facefuse.fusion.swappers.classic import ClassicSwapper
from facefuse.fusion.swappers.onnx import SWAP_TASK, OnnxSwapper
from facefuse.imaging.pixels import PixelBackend, pixel_backend
from facefuse.runtime.registry import ModelRegistry

__all__ = ["build_swappers"]


def build_swappers(settings: Settings, registry: ModelRegistry, *,
                   pixels: PixelBackend | None = None) -> dict[str, Swapper]:
    """The swappers by name: ``classic`` (its remaps and lighting on ``pixels``,
    default :func:`~facefuse.imaging.pixels.pixel_backend` of ``settings``; its
    source sides on ``settings.render_side_threads`` threads), then every manifest
    ``task: "swap"`` entry of ``registry`` that is not a precision variant, as an
    :class:`~facefuse.fusion.swappers.onnx.OnnxSwapper` loaded on first use (see
    ``docs/swappers.md``); an entry named ``classic`` does not replace the classic
    swapper."""
    swappers: dict[str, Swapper] = {"classic": ClassicSwapper(
        pixels=pixel_backend(settings) if pixels is None else pixels,
        side_threads=settings.render_side_threads)}
    for spec in registry.manifest.for_task(SWAP_TASK):
        if spec.base is None:
            swappers.setdefault(spec.name, OnnxSwapper(registry, spec.name))
    return swappers
