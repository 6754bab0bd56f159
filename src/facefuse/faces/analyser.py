"""The library's driver of the analysis stages: decode → detect → mesh → embed
(→ attributes), each stage from :mod:`facefuse.faces.stages` run synchronously on
the registry's sessions.

:class:`FaceAnalyser` is safe to share across threads: ONNX Runtime sessions are
thread-safe and the analyser keeps no per-call state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from facefuse.config import Settings
from facefuse.faces import stages
from facefuse.faces.detectors import Purpose
from facefuse.faces.stages import FaceModels, Stage
from facefuse.faces.types import Detection, Face
from facefuse.imaging.decode import DecodeLimits, ImageInput, decode_image
from facefuse.runtime.registry import ModelRegistry

T = TypeVar("T")


@dataclass
class StageTimer:
    """Accumulates wall time per named stage, in milliseconds."""

    ms: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, t0: float) -> float:
        """Charge the time since ``t0`` (``time.perf_counter()``) to ``stage``;
        returns now, the start of the next stage."""
        now = time.perf_counter()
        self.ms[stage] = self.ms.get(stage, 0.0) + (now - t0) * 1000.0
        return now


class FaceAnalyser:
    """Detect faces and compute mesh, alignment and identity embedding for each."""

    def __init__(self, settings: Settings | None = None, registry: ModelRegistry | None = None):
        self.settings = settings or Settings.from_env()
        self.registry = registry or ModelRegistry(self.settings)
        self.models = FaceModels.from_registry(self.settings, self.registry)
        self.limits = DecodeLimits.from_settings(self.settings)
        self._runner = stages.registry_runner(self.registry)

    def run(self, stage: Stage[T]) -> T:
        """Drive one stage on the registry's sessions."""
        return stages.run_sync(stage, self._runner)

    def decode(self, image: ImageInput) -> np.ndarray:
        """Any accepted input → RGB uint8 (H, W, 3)."""
        return decode_image(image, self.limits)

    def detect(self, image: np.ndarray, purpose: Purpose = "largest") -> list[Detection]:
        """Detections of an RGB uint8 (H, W, 3) image, best score first, by the
        detector for ``purpose`` (see :func:`facefuse.faces.detectors.detector_for`).
        For ``"largest"`` the tiles of a large image run only when the whole-image
        pass finds no face of a fifth of its long side (``stages.detect``'s
        ``coarse_first``): smaller faces beside a large one are then not searched;
        ask for ``"all"`` to find every face."""
        return self.run(stages.detect(self.models.detectors[purpose], image, self.models.turns,
                                      coarse_first=purpose == "largest"))

    def analyse(
        self,
        image: ImageInput,
        *,
        embed: bool = True,
        attributes: bool | None = None,
        timer: StageTimer | None = None,
        purpose: Purpose = "largest",
    ) -> list[Face]:
        """All faces in ``image`` that the detector for ``purpose`` finds, largest first.

        Args:
            image: RGB uint8 (H, W, 3) array, a path, or encoded JPEG/PNG/WebP bytes.
            purpose: ``"largest"`` when only the largest face will be used (under
                ``detector="auto"``: BlazeFace, fast; the small faces beside a large
                one are not searched, see :meth:`detect`), ``"all"`` when every
                face will (YuNet: finds faces in groups and at the frame's edge).
            embed: compute the identity embedding (skip for geometry-only uses).
            attributes: run age/gender (default: ``settings.attributes``).
            timer: optional per-stage timing sink (decode, detect, mesh, embed, attributes).
        """
        timer = timer or StageTimer()
        t = time.perf_counter()
        rgb = decode_image(image, self.limits, share=True)  # read only here
        t = timer.add("decode", t)
        detections = self.detect(rgb, purpose)
        t = timer.add("detect", t)
        faces = self.run(stages.confirmed(self.models.detectors[purpose], self.models.mesh,
                                          rgb, detections, self.models.turns))
        t = timer.add("mesh", t)
        if embed and faces:
            faces = self.embed(rgb, faces)
            t = timer.add("embed", t)
        if attributes if attributes is not None else self.settings.attributes:
            faces = self.run(stages.attributes(self.models, rgb, faces))
            timer.add("attributes", t)
        return faces

    def face_from_detection(self, rgb: np.ndarray, det: Detection) -> Face:
        """Mesh, five points and chip transform for one detection (no embedding)."""
        return self.run(stages.mesh(self.models.mesh, rgb, [det]))[0]

    def embed(self, rgb: np.ndarray, faces: Sequence[Face]) -> list[Face]:
        """Copies of ``faces`` with ``embedding_raw`` and the unit-norm ``embedding``."""
        return self.run(stages.embed(self.models.recognizer, rgb, faces))

    def reanalyse(self, rgb: np.ndarray, where: Face) -> Face:
        """The face of ``rgb`` at ``where``'s place, meshed and embedded."""
        return self.run(stages.reanalyse(self.models, rgb, where))
