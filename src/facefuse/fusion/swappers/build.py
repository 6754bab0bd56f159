"""Every available swapper, made in one place."""

from __future__ import annotations

from facefuse.config import Settings
from facefuse.fusion.swappers.base import Swapper, SwapperInfo
from facefuse.fusion.swappers.classic import ClassicSwapper
from facefuse.fusion.swappers.onnx import SWAP_TASK, OnnxSwapper
from facefuse.imaging.pixels import PixelBackend, pixel_backend
from facefuse.runtime.registry import ModelRegistry

__all__ = ["build_swappers", "describe_swapper"]


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


def describe_swapper(name: str, swapper: Swapper, registry: ModelRegistry) -> SwapperInfo:
    """What ``swapper``, chosen as ``name``, is (:class:`SwapperInfo`): its kind, and
    the manifest's sha256 of the models it runs (read off the manifest: nothing is
    loaded, so a broken entry is described, and fails only when used)."""
    kind = "custom"
    models: tuple[str, ...] = ()
    if isinstance(swapper, ClassicSwapper):
        kind = "classic"
    elif isinstance(swapper, OnnxSwapper):
        kind, models = "onnx", swapper.model_names()
    versions = {m: registry.manifest.get(m).sha256 for m in models if registry.has(m)}
    return SwapperInfo(name, kind, swapper.needs_source_embedding, versions)
