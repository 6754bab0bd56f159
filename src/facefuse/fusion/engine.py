"""The fusion engine: analyse, select, render, blend, paste back, evaluate.

``FaceFuser.fuse(source, target, degree=...)`` returns a :class:`FusionResult`
whose image is the target with the source identity fused into the selected
face(s). Only each face's bounding region is ever rewritten.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from facefuse.config import Settings
from facefuse.errors import (
    FaceIndexError,
    FaceProfileError,
    FaceTooSmallError,
    InvalidArgumentError,
    NoFaceError,
)
from facefuse.faces.analyser import FaceAnalyser, StageTimer
from facefuse.faces.types import Detection, Face
from facefuse.fusion.geometry import eye_distance, head_pose
from facefuse.fusion.quality import compare_faces, cosine, seam_scores
from facefuse.fusion.swappers.base import FaceLayer, Swapper
from facefuse.fusion.swappers.classic import ClassicSwapper
from facefuse.fusion.swappers.onnx import SWAP_TASK, OnnxSwapper
from facefuse.fusion.types import FusedFace, FuseOptions, FusionResult
from facefuse.imaging.blend import alpha_blend, laplacian_blend, poisson_blend
from facefuse.imaging.decode import ImageInput

#: Faces whose outer eye corners are closer than this (pixels) are too small to fuse well.
MIN_EYE_DISTANCE_PX = 40.0
#: Faces turned further than this (degrees of yaw) are too far in profile.
MAX_ABS_YAW_DEG = 50.0


def frontalness(face: Face) -> float:
    """cos(yaw) of the face, 1 for frontal; 0 when the mesh is missing."""
    if face.landmarks is None:
        return 0.0
    return max(0.0, math.cos(math.radians(head_pose(face.landmarks)[0])))


def check_usable(face: Face, which: str) -> None:
    """Raise a typed error naming ``which`` image when the face cannot be fused well."""
    assert face.landmarks is not None
    d = eye_distance(face.landmarks)
    if d < MIN_EYE_DISTANCE_PX:
        raise FaceTooSmallError(
            f"the {which} face is too small to fuse: {d:.0f} px between the outer eye corners "
            f"(need at least {MIN_EYE_DISTANCE_PX:.0f})", code=f"{which}_face_too_small")
    yaw = head_pose(face.landmarks)[0]
    if abs(yaw) > MAX_ABS_YAW_DEG:
        raise FaceProfileError(
            f"the {which} face is too far in profile to fuse well (yaw {yaw:+.0f}°, "
            f"limit ±{MAX_ABS_YAW_DEG:.0f}°)", code=f"{which}_face_profile")


def blend_layer(image: np.ndarray, layer: FaceLayer, mode: str) -> None:
    """Blend ``layer`` into ``image`` (in place) over the layer's region only; the
    layer's ``keep`` pixels (the target's occluders) go back on top afterwards."""
    x0, y0, x1, y1 = layer.region
    bg = image[y0:y1, x0:x1]
    fg = np.clip(layer.face, 0, 255)
    if mode == "multiband":
        out = laplacian_blend(fg, bg, layer.mask)
    elif mode == "poisson":
        out = poisson_blend(fg, bg, layer.mask)
    else:
        out = alpha_blend(fg, bg, layer.mask)
    if layer.keep is not None:
        out = alpha_blend(bg.astype(np.float32), out.astype(np.float32), layer.keep)
    image[y0:y1, x0:x1] = np.clip(np.rint(out), 0, 255).astype(np.uint8)


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
        self.swappers: dict[str, Swapper] = {"classic": ClassicSwapper()}
        # Every manifest "swap" entry, loaded on first use (see docs/swappers.md).
        registry = self.analyser.registry
        for spec in registry.manifest.for_task(SWAP_TASK):
            if spec.base is None:
                self.swappers.setdefault(spec.name, OnnxSwapper(registry, spec.name))
        if swappers:
            self.swappers.update(swappers)

    # ---- selection ------------------------------------------------------------------

    def pick_source(self, candidates: Sequence[tuple[np.ndarray, list[Face]]]
                    ) -> tuple[int, np.ndarray, Face, list[str]]:
        """Best source face over all source images: largest × most frontal."""
        best: tuple[float, int, np.ndarray, Face] | None = None
        notes: list[str] = []
        for i, (rgb, faces) in enumerate(candidates):
            if len(faces) > 1:
                notes.append(f"source image {i} has {len(faces)} faces; the largest is used")
            for f in faces[:1]:
                score = f.area * frontalness(f)
                if best is None or score > best[0]:
                    best = (score, i, rgb, f)
        if best is None:
            raise NoFaceError("no face found in the source image", code="source_no_face")
        if len(candidates) > 1:
            notes.append(f"{len(candidates)} source images; used image {best[1]} "
                         "(largest, most frontal face)")
        return best[1], best[2], best[3], notes

    def select_targets(self, faces: list[Face], options: FuseOptions,
                       reference: Face | None) -> list[int]:
        """Indices (into ``faces``, largest first) of the target faces to fuse."""
        if not faces:
            raise NoFaceError("no face found in the target image", code="target_no_face")
        if options.mode == "many":
            return list(range(len(faces)))
        if options.mode == "reference":
            if reference is None or reference.embedding is None:
                raise InvalidArgumentError("mode 'reference' needs a reference image with a face",
                                           code="reference_required")
            sims = [cosine(reference.embedding, f.embedding) if f.embedding is not None else -1.0
                    for f in faces]
            return [int(np.argmax(sims))]
        idx = options.target_face_index or 0
        if idx >= len(faces):
            raise FaceIndexError(f"target face index {idx} out of range: the target has "
                                 f"{len(faces)} face(s)")
        return [idx]

    # ---- the pipeline ---------------------------------------------------------------

    def fuse(
        self,
        source: ImageInput | Sequence[ImageInput],
        target: ImageInput,
        options: FuseOptions | None = None,
        *,
        reference: ImageInput | None = None,
        **kwargs: Any,
    ) -> FusionResult:
        """Fuse the source identity into ``target``.

        Args:
            source: one image or a list of images of the same person (RGB uint8
                (H, W, 3), a path or encoded bytes).
            target: the image to change.
            options: a :class:`FuseOptions`, or pass its fields as keywords
                (``degree=60``, ``mode="many"``, ...).
            reference: for ``mode="reference"``, an image of the person to replace.
        """
        options = options or FuseOptions(**kwargs)
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
        # Identity vectors are only needed to report quality, to pick the reference
        # face, or to feed a neural swapper: the classic geometry needs none.
        embed = options.evaluate or options.mode == "reference" or options.swapper != "classic"
        cands = [(rgb, self.analyser.analyse(rgb, embed=embed)) for rgb in src_decoded]
        t = timer.add("analyse_source", t)
        _, src_rgb, src_face, notes = self.pick_source(cands)
        check_usable(src_face, "source")
        tgt_faces = self.analyser.analyse(tgt_rgb, embed=embed)
        ref_face = None
        if reference is not None:
            ref_faces = self.analyser.analyse(reference)
            if not ref_faces:
                raise NoFaceError("no face found in the reference image",
                                  code="reference_no_face")
            ref_face = ref_faces[0]
        t = timer.add("analyse_target", t)
        chosen = self.select_targets(tgt_faces, options, ref_face)
        for i in chosen:
            check_usable(tgt_faces[i], "target")
        result = self.fuse_faces(src_rgb, src_face, tgt_rgb, tgt_faces, chosen, options)
        result.timings_ms = {**timer.ms, **result.timings_ms}
        result.notes = notes + result.notes
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
        if options.degree == 0 and options.shape in (None, 0) and options.texture in (None, 0):
            # Exactly the target: nothing to render.
            return FusionResult(out, source_face,
                                [FusedFace(i, target_faces[i], (0, 0, 0, 0),
                                           np.zeros((0, 0), np.float32)) for i in chosen],
                                {"fuse": 0.0}, ["degree 0: target returned unchanged"])
        for i in chosen:
            layer = swapper.render(source_rgb, source_face, out, target_faces[i], options)
            blend_layer(out, layer, options.blend)
            fused.append(FusedFace(i, target_faces[i], layer.region, layer.mask))
        t = timer.add("fuse", t)
        if options.evaluate:
            for ff in fused:
                ff.quality = self.evaluate(out, target_rgb, source_face, ff)
            timer.add("evaluate", t)
        return FusionResult(out, source_face, fused, timer.ms, [])

    def evaluate(self, output: np.ndarray, target: np.ndarray, source_face: Face,
                 fused: FusedFace) -> dict[str, float]:
        """Quality figures of one fused face, re-analysed on the output at the same place."""
        tf = fused.target_face
        det = Detection(bbox=tf.bbox, score=tf.score, keypoints=tf.keypoints)
        out_face = self.analyser.face_from_detection(output, det)
        self.analyser.embed(output, [out_face])
        q = compare_faces(out_face, source_face, tf)
        q.update(seam_scores(output, target, fused.mask, fused.region))
        return q
