"""The face-analysis pipeline: detect → dense mesh → align → embed (→ attributes).

:class:`FaceAnalyser` owns the models (through the registry) and is safe to
share across threads: ONNX Runtime sessions are thread-safe and the analyser
keeps no per-call state.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from facefuse.config import Settings
from facefuse.faces.align import dlib_chip_transform, warp_chip
from facefuse.faces.attributes import estimate_age, estimate_gender
from facefuse.faces.detectors import detect_any_turn, make_detector, turns_to_try
from facefuse.faces.landmarker import FaceMesh
from facefuse.faces.recognizer import Recognizer, normalize
from facefuse.faces.rotation import REORIENT_BELOW, REORIENT_TURNS, turned_detection
from facefuse.faces.types import MESH_FIVE_POINTS, Detection, Face
from facefuse.imaging.decode import DecodeLimits, ImageInput, decode_image
from facefuse.models.registry import ModelRegistry

CHIP_SIZE = 150
CHIP_PADDING = 0.25


def make_face(det: Detection, landmarks: np.ndarray, presence: float) -> Face:
    """The Face record of one meshed detection: (478, 3) landmarks → five points
    and the dlib chip transform; no embedding yet."""
    return Face(
        bbox=det.bbox.astype(np.float32),
        score=float(det.score),
        keypoints=det.keypoints.astype(np.float32),
        landmarks=landmarks.astype(np.float32),
        landmarks5=landmarks[list(MESH_FIVE_POINTS), :2].astype(np.float32),
        chip_transform=dlib_chip_transform(landmarks, size=CHIP_SIZE, padding=CHIP_PADDING),
        mesh_score=float(presence),
    )


@dataclass
class StageTimer:
    """Accumulates wall time per named stage, in milliseconds."""

    ms: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, t0: float) -> float:
        now = time.perf_counter()
        self.ms[stage] = self.ms.get(stage, 0.0) + (now - t0) * 1000.0
        return now


class FaceAnalyser:
    """Detect faces and compute mesh, alignment and identity embedding for each."""

    def __init__(self, settings: Settings | None = None, registry: ModelRegistry | None = None):
        self.settings = settings or Settings.from_env()
        self.registry = registry or ModelRegistry(self.settings)
        self.detector = make_detector(self.settings, self.registry)
        iris = self.registry.get("iris") if self.registry.has("iris") else None
        self.mesh = FaceMesh(self.registry.get("facemesh"), iris)
        self.recognizer = Recognizer(self.registry.get("dlib_resnet"))
        self.limits = DecodeLimits.from_settings(self.settings)

    def decode(self, image: ImageInput) -> np.ndarray:
        """Any accepted input → RGB uint8 (H, W, 3)."""
        return decode_image(image, self.limits)

    def detect(self, image: np.ndarray) -> list[Detection]:
        """Faces of an RGB uint8 (H, W, 3) image; turned copies are tried when none is upright."""
        return detect_any_turn(self.detector, image, turns_to_try(self.settings))

    def analyse(
        self,
        image: ImageInput,
        *,
        embed: bool = True,
        attributes: bool | None = None,
        timer: StageTimer | None = None,
    ) -> list[Face]:
        """All faces in ``image``, largest first.

        Args:
            image: RGB uint8 (H, W, 3) array, a path, or encoded JPEG/PNG/WebP bytes.
            embed: compute the identity embedding (skip for geometry-only uses).
            attributes: run age/gender (default: ``settings.attributes``).
            timer: optional per-stage timing sink (decode, detect, mesh, embed, attributes).
        """
        timer = timer or StageTimer()
        t = time.perf_counter()
        rgb = self.decode(image)
        t = timer.add("decode", t)
        detections = self.detect(rgb)
        t = timer.add("detect", t)
        faces = [self.face_from_detection(rgb, d) for d in detections]
        t = timer.add("mesh", t)
        faces = [f for f in faces if f.landmarks is not None]
        if embed and faces:
            self.embed(rgb, faces)
            t = timer.add("embed", t)
        if attributes if attributes is not None else self.settings.attributes:
            self.add_attributes(rgb, faces)
            timer.add("attributes", t)
        faces.sort(key=lambda f: -f.area)
        return faces

    def face_from_detection(self, rgb: np.ndarray, det: Detection) -> Face:
        """Mesh, five points and chip transform for one detection (no embedding).

        A mesh with a low face-presence score is tried again in the other three
        quarter turns of its ROI (see :data:`~facefuse.faces.rotation.REORIENT_BELOW`).
        """
        landmarks, presence = self.mesh.landmarks(rgb, det)
        if presence < REORIENT_BELOW:
            turned = [turned_detection(det, k) for k in REORIENT_TURNS]
            for lm, p in self.mesh.landmarks_many(rgb, turned):
                if p > presence:
                    landmarks, presence = lm, p
        return make_face(det, landmarks, presence)

    def chips(self, rgb: np.ndarray, faces: Iterable[Face]) -> np.ndarray:
        """Aligned 150×150 RGB chips, (N, 150, 150, 3) uint8."""
        out = [warp_chip(rgb, f.chip_transform, CHIP_SIZE) for f in faces
               if f.chip_transform is not None]
        if not out:
            return np.zeros((0, CHIP_SIZE, CHIP_SIZE, 3), np.uint8)
        return np.stack(out)

    def embed(self, rgb: np.ndarray, faces: list[Face]) -> None:
        """Fill ``embedding_raw`` and the unit-norm ``embedding`` of each face."""
        raw = self.recognizer.embed_chips(self.chips(rgb, faces))
        for f, v in zip(faces, raw, strict=True):
            f.embedding_raw = v.astype(np.float32)
            f.embedding = normalize(v).astype(np.float32)

    def add_attributes(self, rgb: np.ndarray, faces: list[Face]) -> None:
        """Fill ``age``, ``gender`` and ``gender_score`` where the models are installed."""
        age = self.registry.get("age") if self.registry.has("age") else None
        gender = self.registry.get("gender") if self.registry.has("gender") else None
        for f in faces:
            if f.landmarks is None:
                continue
            if age is not None:
                f.age = estimate_age(rgb, f.landmarks, age)
            if gender is not None:
                f.gender, f.gender_score = estimate_gender(rgb, f.landmarks, gender)
