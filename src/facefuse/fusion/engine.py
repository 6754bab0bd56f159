"""The library's fusion driver: decode, then run the fusion plan on this process's
sessions (analyse, select, render, blend, paste back, evaluate).

``FaceFuser.fuse(source, target, degree=...)`` returns a :class:`FusionResult`
whose image is the target with the source identity fused into the selected
face(s). Only each face's bounding region is ever rewritten.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces.analyser import FaceAnalyser, StageTimer
from facefuse.faces.types import Face
from facefuse.fusion.mapping import FacePair, MappedFace, parse_mapping
from facefuse.fusion.plan import Analyse, FuseRequest, Planned, Render, fuse_plan, quality
from facefuse.fusion.swappers import (
    FaceLayer,
    Swapper,
    SwapperInfo,
    build_swappers,
    describe_swapper,
)
from facefuse.fusion.types import FusedFace, FuseOptions, FusionResult
from facefuse.imaging.blend import alpha_blend, alpha_blend_into, poisson_blend
from facefuse.imaging.decode import ImageInput
from facefuse.imaging.pixels import OpenCVPixels, PixelBackend, pixel_backend


def blend_layer(image: np.ndarray, layer: FaceLayer, mode: str,
                pixels: PixelBackend | None = None, *, consume: bool = False) -> None:
    """Blend ``layer`` into ``image`` (in place) over the layer's region only
    (multi-band on ``pixels``, default OpenCV); the layer's ``keep`` pixels (the
    target's occluders) go back on top afterwards. ``consume``: the layer's float32
    face is the caller's to give up (it is not read afterwards): the blend works in
    it instead of beside a copy of it (one region-sized float image less)."""
    x0, y0, x1, y1 = layer.region
    bg = image[y0:y1, x0:x1]
    face = layer.face
    into = (face if consume and face.dtype == np.float32 and face.flags.writeable
            else None)
    fg = np.clip(np.asarray(face, np.float32), 0, 255, out=into)
    out: np.ndarray
    if mode == "multiband":
        out = (pixels or OpenCVPixels()).multiband(fg, bg, layer.mask)
    elif mode == "poisson":
        out = poisson_blend(fg, bg, layer.mask)
    else:
        out = alpha_blend(fg, bg, layer.mask)
    res = np.asarray(out, np.float32)  # a fresh array from every blend: rounded in place
    if layer.keep is not None:
        # Only where something is kept (the keep mask is 0 elsewhere: the blend's own).
        kx, ky, kw, kh = cv2.boundingRect((layer.keep > 0).view(np.uint8))
        if kw and kh:
            win = np.s_[ky:ky + kh, kx:kx + kw]
            alpha_blend_into(bg[win], res[win], layer.keep[win])
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
        #: Every available swapper by name (the classic one on :attr:`pixels`), then
        #: ``swappers`` (added or replacing by name).
        self.swappers: dict[str, Swapper] = build_swappers(
            self.settings, self.analyser.registry, pixels=self.pixels)
        if swappers:
            self.swappers.update(swappers)
        #: The swapper of options that name none (``FACEFUSE_SWAPPER``).
        self.default_swapper = self.settings.swapper
        if self.default_swapper not in self.swappers:
            raise InvalidArgumentError(
                f"FACEFUSE_SWAPPER={self.default_swapper[:80]!r} names no swapper (have: "
                f"{', '.join(sorted(self.swappers))}); register its model in manifest.json "
                "(docs/swappers.md) or name one of these", code="unknown_swapper")

    def close(self) -> None:
        """Let the swappers' own threads go (the fuser stays usable)."""
        for swapper in self.swappers.values():
            close = getattr(swapper, "close", None)
            if close is not None:
                close()

    def swapper(self, name: str | None) -> Swapper:
        """The swapper called ``name`` (None: :attr:`default_swapper`);
        ``unknown_swapper`` when there is none."""
        try:
            return self.swappers[self.default_swapper if name is None else name]
        except KeyError:
            raise InvalidArgumentError(
                f"unknown swapper {str(name)[:80]!r} (have: {', '.join(sorted(self.swappers))})",
                code="unknown_swapper") from None

    def resolve(self, options: FuseOptions) -> FuseOptions:
        """``options`` naming the swapper that will render them (the default when they
        name none): what a door checks before any work and a result cache's key holds,
        so the same request means the same swapper whatever the default.

        Raises:
            InvalidArgumentError: ``unknown_swapper``.
        """
        name = self.default_swapper if options.swapper is None else options.swapper
        self.swapper(name)
        return options if options.swapper == name else dataclasses.replace(options,
                                                                            swapper=name)

    def describe_swappers(self) -> list[SwapperInfo]:
        """Every swapper a fusion may name, by name (:class:`SwapperInfo`)."""
        return [describe_swapper(n, s, self.analyser.registry)
                for n, s in sorted(self.swappers.items())]

    def swapper_info(self, name: str | None) -> SwapperInfo:
        """The :class:`SwapperInfo` of the swapper ``name`` (None: the default);
        ``unknown_swapper`` when there is none."""
        name = self.default_swapper if name is None else name
        return describe_swapper(name, self.swapper(name), self.analyser.registry)

    # ---- the pipeline ---------------------------------------------------------------

    def fuse(
        self,
        source: ImageInput | Sequence[ImageInput],
        target: ImageInput,
        options: FuseOptions | None = None,
        *,
        reference: ImageInput | None = None,
        mapping: Sequence[FacePair | Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> FusionResult:
        """Fuse the source identity into ``target``.

        Args:
            source: one image or a list of images of the same person (RGB uint8
                (H, W, 3), a path or encoded bytes).
            target: the image to change.
            options: a :class:`FuseOptions`, or pass its fields as keywords
                (``degree=60``, ``mode="many"``, ...), not both.
                In ``many`` mode and with a mapping, faces that cannot be fused are
                skipped and listed in ``result.skipped``; the call fails only when
                none can be fused.
            reference: for ``mode="reference"``, an image of the person to replace.
            mapping: which source face replaces which target face (see
                :mod:`facefuse.fusion.mapping`); overrides ``mode``. Sources are then
                images of different people, indexed in the order given.

        The decisions (what to analyse, which faces, what to score) are
        :func:`facefuse.fusion.plan.fuse_plan`'s, the same the server runs.
        """
        if options is not None and kwargs:
            raise InvalidArgumentError(
                f"give the options either as FuseOptions or as keywords, not both "
                f"(got options= and {', '.join(sorted(kwargs))})", code="options_conflict")
        options = options or FuseOptions(**kwargs)
        sources: list[ImageInput] = (
            list(source) if isinstance(source, list | tuple) else [source]  # type: ignore[list-item]
        )
        if not sources:
            raise InvalidArgumentError("no source image given", code="source_missing")
        req = FuseRequest(options, len(sources),
                          parse_mapping(mapping) if mapping is not None else None,
                          reference=reference is not None,
                          source_embedding=self.swapper(options.swapper).needs_source_embedding)
        timer = StageTimer()
        t = time.perf_counter()
        images = [self.analyser.decode(s) for s in [*sources, target]]
        if req.uses_reference:
            assert reference is not None
            images.append(self.analyser.decode(reference))
        timer.add("decode", t)
        return self.run_plan(req, images, timer).result

    def run_plan(self, req: FuseRequest, images: Sequence[np.ndarray],
                 timer: StageTimer | None = None) -> Planned:
        """Drive :func:`~facefuse.fusion.plan.fuse_plan` over decoded ``images``
        (sources, target[, reference]) on this process's sessions, one step after
        another; ``timer`` (the decode time, say) is merged into the timings. The
        images are the caller's to give up: unless the options ask for quality
        figures, the fused faces are drawn into the target image itself."""
        timer = timer or StageTimer()
        scoring = StageTimer()
        plan = fuse_plan(req, self.analyser.models, images)
        answer: Any = None
        while True:
            try:
                step = plan.send(answer)
            except StopIteration as stop:
                planned: Planned = stop.value
                break
            t = time.perf_counter()
            if isinstance(step, Analyse):
                answer = []
                for job in step.jobs:
                    answer.append(self.analyser.analyse(images[job.image], embed=job.embed,
                                                        purpose=job.purpose))
                    t = timer.add("analyse_source" if job.role == "source" else "analyse_target",
                                  t)
            elif isinstance(step, Render):
                answer = self.fuse_mapped(step.sources_rgb, step.pairs, step.target_rgb,
                                          step.target_faces, step.options,
                                          in_place=step.in_place)
            else:
                answer = self.analyser.run(step.stage)
                scoring.add("evaluate", t)
        result = planned.result
        result.timings_ms = {**timer.ms, **result.timings_ms, **scoring.ms}
        return planned

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
        *,
        in_place: bool = False,
    ) -> FusionResult:
        """Fuse each pair's source face (from ``sources_rgb[pair.source_index]``) into
        its target face, one after another on the same output image: a copy of
        ``target_rgb``, or (``in_place``: the caller's own image, not needed
        afterwards) ``target_rgb`` itself, which spares a full-frame copy."""
        swapper = self.swapper(options.swapper)
        timer = StageTimer()
        t = time.perf_counter()
        # (Never into an image a source shares: the later pairs read the sources.)
        own = in_place and not any(np.may_share_memory(s, target_rgb) for s in sources_rgb)
        out = target_rgb if own else target_rgb.copy()
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
            blend_layer(out, layer, options.blend, self.pixels, consume=True)
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
        """Quality figures of one fused face, re-analysed on the output at the same place
        (:func:`facefuse.fusion.plan.quality`)."""
        return self.analyser.run(quality(self.analyser.models, output, target, source_face,
                                         fused))
