"""The fusion plan: every decision of one fuse request, made once, run by both drivers.

Given the decoded images of a request (source images, the target, a reference),
:func:`fuse_plan` decides which images are analysed, with or without identity
embeddings and by which detector purpose; it selects the source face and the
target faces (mode ``one``/``many``/``reference``, a mapping, or a template's
stored faces), asks for the rendering, and scores the result (the quality
figures of every fused face, or one similarity figure). Like the stages of
:mod:`facefuse.faces.stages` it is a generator that does no IO: it *yields* what
it needs done and is sent the answer.

=================  ===============================================  ====================
yields             the driver does                                  and sends back
=================  ===============================================  ====================
:class:`Analyse`   analyses each :class:`ImageJob`'s image           faces per job,
                   (embeddings and detector purpose as given)       largest first
:class:`Render`    ``FaceFuser.fuse_mapped`` on its fields           the FusionResult
:class:`RunStage`  drives the analysis stage it carries             the stage's value
=================  ===============================================  ====================

The library (:meth:`facefuse.fusion.engine.FaceFuser.fuse`) answers with direct
session runs; the server (``facefuse.serving.pipeline``) analyses the images
concurrently through its L1 cache and micro-batchers and renders in its CPU pool.
Neither decides anything: same request, same faces, same bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import numpy as np

from facefuse.errors import InvalidArgumentError
from facefuse.faces import stages
from facefuse.faces.detectors import Purpose
from facefuse.faces.stages import FaceModels, Stage
from facefuse.faces.types import Face
from facefuse.fusion.mapping import FacePair, MappedFace, detect_purposes, resolve
from facefuse.fusion.quality import compare_faces, identity_similarity, seam_scores
from facefuse.fusion.select import IdentityNeeds, check_reference, select
from facefuse.fusion.types import FusedFace, FuseOptions, FusionResult, SkippedFace

__all__ = ["Analyse", "FuseRequest", "ImageJob", "Planned", "Render", "RunStage", "Step",
           "fuse_plan", "quality"]

T = TypeVar("T")
Role = Literal["source", "target", "reference"]


@dataclass(frozen=True)
class FuseRequest:
    """What one fuse request asks for, before any image is analysed.

    Attributes:
        options: the fusion options (``options.evaluate``: the quality figures of
            every fused face, by re-analysing the output).
        sources: how many source images (one person's photos, or one per mapping index).
        mapping: the parsed face mapping (overrides ``options.mode``), or None.
        reference: a reference image was given (in ``mode="reference"`` only, without
            a mapping: :func:`~facefuse.fusion.select.check_reference`).
        similarity: score the first fused face's identity against the source face
            with one recogniser call at the mesh it was rendered with.
        target_faces: the target's faces when already known (a stored template);
            then the target image is not analysed.
        target_size: ``(width, height)`` those faces were found in.
        target_purpose: the detector purpose of the target's analysis, instead of
            the one the mode implies.
        source_embedding: the swapper ``options.swapper`` names reads the source
            face's identity embedding (its
            :attr:`~facefuse.fusion.swappers.base.Swapper.needs_source_embedding`,
            which the driver looks up).
    """

    options: FuseOptions
    sources: int = 1
    mapping: tuple[FacePair, ...] | None = None
    reference: bool = False
    similarity: bool = False
    target_faces: tuple[Face, ...] | None = None
    target_size: tuple[int, int] | None = None
    target_purpose: Purpose | None = None
    source_embedding: bool = False

    def __post_init__(self) -> None:
        check_reference(self.options.mode, self.reference, bool(self.mapping))

    @property
    def uses_reference(self) -> bool:
        """The reference image is decoded and analysed (given, mode reference, no mapping)."""
        return self.reference and self.options.mode == "reference" and not self.mapping

    @property
    def image_count(self) -> int:
        """How many images the driver decodes: sources, target, then the reference if used."""
        return self.sources + 1 + int(self.uses_reference)


@dataclass(frozen=True)
class ImageJob:
    """One image to analyse.

    Attributes:
        role: which image of the request it is.
        image: its index among the decoded images (sources, target, reference).
        embed: compute identity embeddings.
        purpose: the detector purpose (:func:`facefuse.faces.detectors.detector_for`).
    """

    role: Role
    image: int
    embed: bool
    purpose: Purpose


@dataclass(frozen=True)
class Analyse:
    """Analyse every job's image; answer with a sequence of faces (largest first) per job."""

    jobs: tuple[ImageJob, ...]


@dataclass(frozen=True)
class Render:
    """Render the pairs (:meth:`~facefuse.fusion.engine.FaceFuser.fuse_mapped`); answer
    with its FusionResult. ``in_place``: nothing reads the target image after the
    render (no quality figures are asked for), so it may be drawn into instead of a
    full-frame copy of it."""

    sources_rgb: tuple[np.ndarray, ...]
    pairs: tuple[MappedFace, ...]
    target_rgb: np.ndarray
    target_faces: list[Face]
    options: FuseOptions
    in_place: bool = False


@dataclass(frozen=True)
class RunStage(Generic[T]):
    """Drive an analysis stage (its model calls); answer with its value. The time it
    takes counts as ``evaluate``."""

    stage: Stage[T]


Step = Analyse | Render | RunStage[Any]


@dataclass(frozen=True)
class Planned:
    """The outcome of a plan: the fused image and report, and the similarity figure
    (None when not asked for or nothing was rendered)."""

    result: FusionResult
    similarity: float | None = None


def quality(models: FaceModels, output: np.ndarray, target: np.ndarray, source_face: Face,
            fused: FusedFace) -> Stage[dict[str, float]]:
    """Quality figures of one fused face: re-analysed on ``output`` (RGB uint8
    (H, W, 3)) at the same place, compared with the source and target faces, and
    its seam against ``target``."""
    out_face = yield from stages.reanalyse(models, output, fused.target_face)
    q = compare_faces(out_face, source_face, fused.target_face)
    q.update(seam_scores(output, target, fused.mask, fused.region))
    return q


def _jobs(req: FuseRequest) -> tuple[ImageJob, ...]:
    opts, n = req.options, req.sources
    needs = IdentityNeeds.of(opts, similarity=req.similarity, mapping=bool(req.mapping),
                             source_embedding=req.source_embedding)
    purposes = detect_purposes(opts, req.mapping)
    jobs = [ImageJob("source", i, needs.source, purposes.source) for i in range(n)]
    if req.target_faces is None:
        jobs.append(ImageJob("target", n, needs.target, req.target_purpose or purposes.target))
    if req.uses_reference:
        jobs.append(ImageJob("reference", n + 1, True, purposes.reference))
    return tuple(jobs)


def _pairs(req: FuseRequest, sources: list[list[Face]], targets: list[Face],
           reference: list[Face] | None) -> tuple[list[MappedFace], list[str], list[SkippedFace]]:
    """The (source face → target face) pairs to render, notes and skipped faces."""
    opts = req.options
    if req.mapping:
        pairs, skipped = resolve(req.mapping, sources, targets, opts.min_face_size)
        return pairs, [], skipped
    chosen = select(sources, targets, opts, reference)
    pairs = [MappedFace(chosen.source_index, chosen.source_face, i) for i in chosen.targets]
    return pairs, list(chosen.notes), list(chosen.skipped)


def _rendered(f: FusedFace) -> bool:
    return f.region[2] > f.region[0]


def fuse_plan(req: FuseRequest, models: FaceModels,
              images: Sequence[np.ndarray]) -> Generator[Step, Any, Planned]:
    """The plan of one request over its decoded images (RGB uint8 (H, W, 3): the
    ``req.sources`` source images, the target, then the reference if
    ``req.uses_reference``).

    Raises the typed errors of selection (:func:`facefuse.fusion.select.select`)
    and mapping (:func:`facefuse.fusion.mapping.resolve`), and ``template_mismatch``
    when ``req.target_faces`` were found in an image of another size.
    """
    n, opts = req.sources, req.options
    if len(images) != req.image_count:
        raise ValueError(f"the plan needs {req.image_count} decoded images, not {len(images)}")
    target_rgb = images[n]
    jobs = _jobs(req)
    found: Sequence[Sequence[Face]] = yield Analyse(jobs)
    by_role = {j.role: list(f) for j, f in zip(jobs, found, strict=True) if j.role != "source"}
    sources = [list(f) for j, f in zip(jobs, found, strict=True) if j.role == "source"]
    if req.target_faces is not None:
        w, h = req.target_size or (target_rgb.shape[1], target_rgb.shape[0])
        if target_rgb.shape[:2] != (h, w):
            raise InvalidArgumentError("the stored analysis does not fit the target image",
                                       code="template_mismatch")
        by_role["target"] = list(req.target_faces)
    targets = by_role["target"]
    pairs, notes, skipped = _pairs(req, sources, targets, by_role.get("reference"))
    result: FusionResult = yield Render(tuple(images[:n]), tuple(pairs), target_rgb, targets,
                                        dataclasses.replace(opts, evaluate=False),
                                        in_place=not opts.evaluate)
    result.notes = notes + result.notes
    result.skipped = skipped
    if opts.evaluate:
        for p, ff in zip(pairs, result.fused, strict=True):
            if _rendered(ff):
                ff.quality = yield RunStage(
                    quality(models, result.image, target_rgb, p.source_face, ff))
    sim: float | None = None
    first = result.fused[0] if result.fused else None
    if req.similarity and first is not None and first.landmarks is not None and _rendered(first):
        # One recogniser call at the mesh the face was rendered with: the full
        # re-analysis (mesh, iris, embed) costs twice as much for the same figure
        # to within 0.01 on the benchmark pairs.
        out_face = yield RunStage(stages.embed_at(models.recognizer, result.image,
                                                  first.target_face, first.landmarks))
        sim = identity_similarity(out_face, pairs[0].source_face)
    return Planned(result, sim)
