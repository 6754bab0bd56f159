"""The library's fusion driver: decode, analyse, select, render, blend, paste back,
evaluate.

``FaceFuser.fuse(source, target, degree=...)`` returns a :class:`FusionResult`
whose image is the target with the source identity fused into the selected
face(s). Only each face's bounding region is ever rewritten.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces.analyser import FaceAnalyser, StageTimer
from facefuse.faces.types import Face
from facefuse.fusion.mapping import FacePair, MappedFace, detect_purposes, parse_mapping, resolve
from facefuse.fusion.quality import compare_faces, seam_scores
from facefuse.fusion.select import IdentityNeeds, select
from facefuse.fusion.swappers.base import FaceLayer, Swapper
from facefuse.fusion.swappers.classic import ClassicSwapper
from facefuse.fusion.swappers.contract import SWAP_TASK
from facefuse.fusion.swappers.onnx import OnnxSwapper
from facefuse.fusion.types import FusedFace, FuseOptions, FusionResult
from facefuse.imaging.blend import alpha_blend, poisson_blend
from facefuse.imaging.decode import ImageInput
from facefuse.imaging.pixels import OpenCVPixels, PixelBackend, pixel_backend


def blend_layer(image: np.ndarray, layer: FaceLayer, mode: str,
                pixels: PixelBackend | None = None) -> None:
    """Blend ``layer`` into ``image`` (in place) over the layer's region only
    (multi-band on ``pixels``, default OpenCV); the layer's ``keep`` pixels (the
    target's occluders) go back on top afterwards."""
    x0, y0, x1, y1 = layer.region
    bg = image[y0:y1, x0:x1]
    fg = np.clip(np.asarray(layer.face, np.float32), 0, 255)
    out: np.ndarray
    if mode == "multiband":
        out = (pixels or OpenCVPixels()).multiband(fg, bg, layer.mask)
    elif mode == "poisson":
        out = poisson_blend(fg, bg, layer.mask)
    else:
        out = alpha_blend(fg, bg, layer.mask)
    if layer.keep is not None:
        out = alpha_blend(bg.astype(np.float32), out.astype(np.float32), layer.keep)
    res = np.asarray(out, np.float32)  # a fresh array from every blend: rounded in place
    np.rint(res, out=res)
    np.clip(res, 0, 255, out=res)
    image[y0:y1, x0:x1] = res


class FaceFuser:
    """Fuses a source identity into target images. Thread-safe; share one instance."""

    def __init__(
        self,
        settings: Settings | None = None,
        analyser: FaceAnalyser | None = None,
        swappers: dict[str, Swapper] | None = None,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.analyser = analyser or FaceAnalyser(self.settings)
        #: Where the remap, lighting and multi-band blend run (``FACEFUSE_PIXEL_BACKEND``).
        self.pixels = pixel_backend(self.settings)
        self.swappers: dict[str, Swapper] = {"classic": ClassicSwapper(pixels=self.pixels)}
        # Every manifest "swap" entry, loaded on first use (see docs/swappers.md).
        registry = self.analyser.registry
        for spec in registry.manifest.for_task(SWAP_TASK):
            if spec.base is None:
                self.swappers.setdefault(spec.name, OnnxSwapper(registry, spec.name))
        if swappers:
            self.swappers.update(swappers)

    # ---- the pipeline ---------------------------------------------------------------

    def fuse(
        self,
        source: ImageInput | Sequence[ImageInput],
        target: ImageInput,
        options: FuseOptions | None = None,
        *,
        reference: ImageInput | None = None,
        mapping: Sequence[FacePair | dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> FusionResult:
        """Fuse the source identity into ``target``.

        Args:
            source: one image or a list of images of the same person (RGB uint8
                (H, W, 3), a path or encoded bytes).
            target: the image to change.
            options: a :class:`FuseOptions`, or pass its fields as keywords
                (``degree=60``, ``mode="many"``, ...).
                In ``many`` mode and with a mapping, faces that cannot be fused are
                skipped and listed in ``result.skipped``; the call fails only when
                none can be fused.
            reference: for ``mode="reference"``, an image of the person to replace.
            mapping: which source face replaces which target face (see
                :mod:`facefuse.fusion.mapping`); overrides ``mode``. Sources are then
                images of different people, indexed in the order given.
        """
        options = options or FuseOptions(**kwargs)
        pairs = parse_mapping(mapping) if mapping is not None else None
        timer = StageTimer()
        sources: list[ImageInput] = (
            list(source) if isinstance(source, list | tuple) else [source]  # type: ignore[list-item]
        )
        if not sources:
            raise InvalidArgumentError("no source image given", code="source_missing")
        t = time.perf_counter()
        src_decoded = [self.analyser.decode(s) for s in sources]
        tgt_rgb = self.analyser.decode(target)
        t = timer.add("decode", t)
        needs = IdentityNeeds.of(options)
        if pairs is not None:
            needs = IdentityNeeds(source=needs.source, target=options.evaluate)
        purposes = detect_purposes(options, pairs)
        src_faces = [self.analyser.analyse(rgb, embed=needs.source, purpose=purposes.source)
                     for rgb in src_decoded]
        t = timer.add("analyse_source", t)
        tgt_faces = self.analyser.analyse(tgt_rgb, embed=needs.target, purpose=purposes.target)
        ref_faces = None
        if reference is not None and options.mode == "reference" and pairs is None:
            ref_faces = self.analyser.analyse(reference, purpose=purposes.reference)
        t = timer.add("analyse_target", t)
        if pairs is not None:
            mapped, skipped = resolve(pairs, src_faces, tgt_faces, options.min_face_size)
            result = self.fuse_mapped(src_decoded, mapped, tgt_rgb, tgt_faces, options)
            result.timings_ms = {**timer.ms, **result.timings_ms}
            result.skipped = skipped
            return result
        chosen = select(src_faces, tgt_faces, options, ref_faces)
        src_rgb = src_decoded[chosen.source_index]
        result = self.fuse_faces(src_rgb, chosen.source_face, tgt_rgb, tgt_faces,
                                 list(chosen.targets), options)
        result.timings_ms = {**timer.ms, **result.timings_ms}
        result.notes = list(chosen.notes) + result.notes
        result.skipped = list(chosen.skipped)
        return result

    def fuse_faces(
        self,
        source_rgb: np.ndarray,
        source_face: Face,
        target_rgb: np.ndarray,
        target_faces: list[Face],
        chosen: list[int],
        options: FuseOptions,
    ) -> FusionResult:
        """The fusion stage on already-analysed faces (what ``bench/fuse.py`` times)."""
        return self.fuse_mapped([source_rgb], [MappedFace(0, source_face, i) for i in chosen],
                                target_rgb, target_faces, options)

    def fuse_mapped(
        self,
        sources_rgb: Sequence[np.ndarray],
        pairs: Sequence[MappedFace],
        target_rgb: np.ndarray,
        target_faces: list[Face],
        options: FuseOptions,
    ) -> FusionResult:
        """Fuse each pair's source face (from ``sources_rgb[pair.source_index]``) into
        its target face, one after another on the same output image."""
        try:
            swapper = self.swappers[options.swapper]
        except KeyError:
            raise InvalidArgumentError(
                f"unknown swapper {options.swapper!r} (have: {', '.join(sorted(self.swappers))})",
                code="unknown_swapper") from None
        timer = StageTimer()
        t = time.perf_counter()
        out = target_rgb.copy()
        fused: list[FusedFace] = []
        first = pairs[0].source_face
        if options.degree == 0 and options.shape in (None, 0) and options.texture in (None, 0):
            # Exactly the target: nothing to render.
            return FusionResult(out, first,
                                [FusedFace(p.target_index, target_faces[p.target_index],
                                           (0, 0, 0, 0), np.zeros((0, 0), np.float32),
                                           source_index=p.source_index) for p in pairs],
                                {"fuse": 0.0}, ["degree 0: target returned unchanged"])
        for p in pairs:
            tf = target_faces[p.target_index]
            layer = swapper.render(sources_rgb[p.source_index], p.source_face, out, tf, options)
            blend_layer(out, layer, options.blend, self.pixels)
            fused.append(FusedFace(p.target_index, tf, layer.region, layer.mask,
                                   source_index=p.source_index, landmarks=layer.landmarks,
                                   outside_source=layer.outside_source))
        t = timer.add("fuse", t)
        if options.evaluate:
            for p, ff in zip(pairs, fused, strict=True):
                ff.quality = self.evaluate(out, target_rgb, p.source_face, ff)
            timer.add("evaluate", t)
        return FusionResult(out, first, fused, timer.ms, [])

    def evaluate(self, output: np.ndarray, target: np.ndarray, source_face: Face,
                 fused: FusedFace) -> dict[str, float]:
        """Quality figures of one fused face, re-analysed on the output at the same place."""
        tf = fused.target_face
        out_face = self.analyser.reanalyse(output, tf)
        q = compare_faces(out_face, source_face, tf)
        q.update(seam_scores(output, target, fused.mask, fused.region))
        return q
