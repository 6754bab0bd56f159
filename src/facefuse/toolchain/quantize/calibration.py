"""Calibration and evaluation data: real preprocessed model inputs from the sample photos.

Every quantized model is calibrated, and then judged, on the inputs it really
sees in the pipeline, made by the FP32 pipeline from augmented sample photos:

* detectors: the letterboxed whole image (and its tiles when it is large),
  ``(3, S, S)`` float32 in [-1, 1];
* ``facemesh``: the rotated face ROI, ``(3, 192, 192)`` float32 in [0, 1];
* ``iris``: both eye ROIs, ``(3, 64, 64)`` float32 in [0, 1];
* ``dlib_resnet``: the aligned 150×150 chip as the recognizer feeds it.

Augmentations (:class:`Augmentation`) are drawn from a seeded generator per
photo, so a seed names a data set exactly. Calibration and evaluation sets
are kept disjoint by using different seeds (see :data:`CALIBRATION_SEED`,
:data:`EVALUATION_SEED`) and, by default, by holding one photo out of
calibration (:data:`HELD_OUT_PHOTOS`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.detector_base import Letterbox
from facefuse.faces.detectors import Detector
from facefuse.faces.landmarker import EYE_CORNERS
from facefuse.faces.types import Detection
from facefuse.imaging.decode import decode_image
from facefuse.imaging.encode import encode_image
from facefuse.toolchain.samples import identity_of

#: Seed of the calibration augmentations.
CALIBRATION_SEED = 20240601
#: Seed of the evaluation augmentations (must differ from the calibration seed).
EVALUATION_SEED = 7_777_777
#: Photos that only the evaluation set sees.
HELD_OUT_PHOTOS: tuple[str, ...] = ("obama3",)

#: Augmentation ranges (inclusive bounds).
FLIP_PROBABILITY = 0.5
SCALE_RANGE = (0.6, 1.25)  # zoom about the image centre, canvas size kept
ANGLE_RANGE_DEG = (-20.0, 20.0)  # in-plane rotation about the image centre
BRIGHTNESS_RANGE = (0.65, 1.35)  # multiplicative gain on all channels
JPEG_QUALITY_RANGE = (35, 95)  # re-encoded with this quality

#: The models the quantizer knows how to feed, with the task their data comes from.
MODEL_TASKS: dict[str, str] = {
    "blazeface_full": "detect",
    "blazeface_short": "detect",
    "facemesh": "mesh",
    "iris": "iris",
    "dlib_resnet": "embed",
}


@dataclass(frozen=True)
class Augmentation:
    """One photometric/geometric perturbation of a photo.

    ``scale`` zooms about the image centre (canvas size kept, black borders),
    ``angle`` rotates in degrees counter-clockwise on screen, ``brightness``
    multiplies all channels, ``jpeg_quality`` is the re-encoding quality
    (0: no re-encoding).
    """

    flip: bool = False
    scale: float = 1.0
    angle: float = 0.0
    brightness: float = 1.0
    jpeg_quality: int = 0

    def describe(self) -> str:
        return (f"flip={int(self.flip)} scale={self.scale:.2f} angle={self.angle:+.1f} "
                f"gain={self.brightness:.2f} q={self.jpeg_quality}")


def draw_augmentations(seed: int, photo: str, n: int) -> list[Augmentation]:
    """``n`` augmentations for ``photo``, determined by ``(seed, photo)`` alone."""
    rng = np.random.default_rng([seed, zlib.crc32(photo.encode())])
    out: list[Augmentation] = []
    for _ in range(n):
        out.append(Augmentation(
            flip=bool(rng.random() < FLIP_PROBABILITY),
            scale=float(rng.uniform(*SCALE_RANGE)),
            angle=float(rng.uniform(*ANGLE_RANGE_DEG)),
            brightness=float(rng.uniform(*BRIGHTNESS_RANGE)),
            jpeg_quality=int(rng.integers(JPEG_QUALITY_RANGE[0], JPEG_QUALITY_RANGE[1] + 1)),
        ))
    return out


def augment(rgb: np.ndarray, aug: Augmentation) -> np.ndarray:
    """Apply ``aug`` to an RGB uint8 (H, W, 3) image; returns RGB uint8 of the same size."""

    out = rgb[:, ::-1] if aug.flip else rgb
    h, w = out.shape[:2]
    if aug.scale != 1.0 or aug.angle != 0.0:
        M = cv2.getRotationMatrix2D(((w - 1) / 2.0, (h - 1) / 2.0), aug.angle, aug.scale)
        out = cv2.warpAffine(np.ascontiguousarray(out), M, (w, h), flags=cv2.INTER_LINEAR,
                             borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0))
    if aug.brightness != 1.0:
        out = np.clip(out.astype(np.float32) * aug.brightness + 0.5, 0, 255).astype(np.uint8)
    if aug.jpeg_quality > 0:
        out = decode_image(encode_image(np.ascontiguousarray(out), "jpeg", aug.jpeg_quality))
    return np.ascontiguousarray(out, dtype=np.uint8)


@dataclass(frozen=True)
class DataPlan:
    """Which photos, how many augmentations each, and the seed."""

    role: str  # "calibration" or "evaluation"
    seed: int
    per_photo: int
    photos: tuple[str, ...]

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def calibration_plan(photos: Sequence[str], per_photo: int = 12,
                     held_out: Sequence[str] = HELD_OUT_PHOTOS) -> DataPlan:
    """The default calibration plan: every photo but ``held_out``, :data:`CALIBRATION_SEED`."""
    kept = tuple(p for p in photos if p not in held_out) or tuple(photos)
    return DataPlan("calibration", CALIBRATION_SEED, per_photo, kept)


def evaluation_plan(photos: Sequence[str], per_photo: int = 12) -> DataPlan:
    """The default evaluation plan: every photo, :data:`EVALUATION_SEED`."""
    return DataPlan("evaluation", EVALUATION_SEED, per_photo, tuple(photos))


@dataclass
class DetectorItem:
    """The detector inputs of one image: the whole image, then any tiles.

    ``tensors`` (T, 3, S, S) float32 in [-1, 1]; ``transforms`` their T letterboxes.
    """

    tensors: np.ndarray
    transforms: list[Letterbox]
    image: int  # index into StageData.images


@dataclass
class RoiItem:
    """One mesh or iris input with its image → tensor affine and the face's scale.

    ``iod`` is the FP32 inter-ocular distance (between the eye-corner midpoints)
    in image pixels, the unit of the mesh and iris gates.
    """

    tensor: np.ndarray
    M: np.ndarray  # (2, 3) float64 image pixels → tensor pixels
    iod: float
    image: int


@dataclass
class ChipItem:
    """One recognizer input: the preprocessed chip and who it shows."""

    tensor: np.ndarray  # (3, 150, 150) float32, the recognizer's input
    identity: str
    photo: str
    image: int


@dataclass
class StageData:
    """Real inputs of every quantizable model, made by the FP32 pipeline.

    ``images`` lists ``(photo, augmentation)`` per augmented image;
    ``skipped`` counts augmented images in which the FP32 pipeline found no face.
    """

    plan: DataPlan
    images: list[tuple[str, Augmentation]] = field(default_factory=list)
    detect: dict[str, list[DetectorItem]] = field(default_factory=dict)
    mesh: list[RoiItem] = field(default_factory=list)
    iris: list[RoiItem] = field(default_factory=list)
    embed: list[ChipItem] = field(default_factory=list)
    skipped: int = 0

    def tensors(self, model: str) -> np.ndarray:
        """All inputs of ``model`` stacked: (N, C, H, W) float32 (detectors: every
        letterbox of every image, tiles included)."""
        task = MODEL_TASKS[model]
        items: Sequence[Any]
        if task == "detect":
            parts = [it.tensors for it in self.detect.get(model, [])]
            if not parts:
                raise ValueError(f"no {self.plan.role} inputs for {model}")
            return np.concatenate(parts).astype(np.float32)
        if task == "mesh":
            items = self.mesh
        elif task == "iris":
            items = self.iris
        else:
            items = self.embed
        if not items:
            raise ValueError(f"no {self.plan.role} inputs for {model}")
        return np.stack([it.tensor for it in items]).astype(np.float32)

    def summary(self) -> dict[str, Any]:
        return {
            **self.plan.describe(),
            "images": len(self.images),
            "images_without_face": self.skipped,
            "inputs": {
                **{m: sum(len(it.tensors) for it in v) for m, v in self.detect.items()},
                "facemesh": len(self.mesh), "iris": len(self.iris),
                "dlib_resnet": len(self.embed),
            },
        }


def inter_ocular(landmarks: np.ndarray) -> float:
    """Distance in pixels between the two eye-corner midpoints of a (468+, 2+) mesh."""
    (a, b), (c, d) = EYE_CORNERS
    left = (landmarks[a, :2] + landmarks[b, :2]) / 2.0
    right = (landmarks[c, :2] + landmarks[d, :2]) / 2.0
    return float(np.linalg.norm(np.asarray(right, np.float64) - np.asarray(left, np.float64)))


def build_stage_data(
    analyser: FaceAnalyser,
    photos: Mapping[str, np.ndarray],
    plan: DataPlan,
    *,
    detectors: Mapping[str, Detector] | None = None,
    identities: Mapping[str, str] | None = None,
) -> StageData:
    """Augment the plan's photos and record every model's real input.

    Args:
        analyser: an FP32 :class:`~facefuse.faces.analyser.FaceAnalyser` (it finds
            the faces, meshes and chips the inputs are made from).
        photos: name → RGB uint8 (H, W, 3) sample photo.
        plan: which photos, seed and augmentations per photo.
        detectors: extra detectors to record inputs for, by model name (the
            analyser's own detector is always recorded under its model name).
        identities: photo → person (default :func:`facefuse.toolchain.samples.identity_of`).
    """

    data = StageData(plan)
    dets: dict[str, Detector] = {analyser.models.detector.model.spec.name: analyser.models.detector}
    dets.update(detectors or {})
    for name in dets:
        data.detect[name] = []
    for photo in plan.photos:
        person = identities[photo] if identities is not None else identity_of(photo)
        for aug in draw_augmentations(plan.seed, photo, plan.per_photo):
            rgb = augment(photos[photo], aug)
            index = len(data.images)
            data.images.append((photo, aug))
            for name, det in dets.items():
                items = det.preprocess(rgb)
                tensors = np.stack([t for t, _ in items])
                data.detect[name].append(
                    DetectorItem(tensors, [b for _, b in items], index))
            detections: list[Detection] = analyser.detect(rgb)
            if not detections:
                data.skipped += 1
                continue
            best = max(detections, key=lambda d: d.width * d.height)
            face = analyser.face_from_detection(rgb, best)
            if face.landmarks is None or face.chip_transform is None:
                data.skipped += 1
                continue
            iod = inter_ocular(face.landmarks)
            if not math.isfinite(iod) or iod <= 1.0:
                data.skipped += 1
                continue
            tensor, M = analyser.models.mesh.roi(rgb, best)
            data.mesh.append(RoiItem(tensor, M, iod, index))
            for eye_tensor, eye_M in analyser.models.mesh.eye_rois(rgb, face.landmarks[:468]):
                data.iris.append(RoiItem(eye_tensor, eye_M, iod, index))
            chip = np.asarray(analyser.models.recognizer.preprocess(
                stages.chips(rgb, [face])), np.float32)[0]
            data.embed.append(ChipItem(chip, person, photo, index))
    return data


def load_photos(paths: Mapping[str, Path]) -> dict[str, np.ndarray]:
    """name → RGB uint8 (H, W, 3) for the given sample photo paths."""

    return {name: decode_image(path) for name, path in paths.items()}


class TensorReader(CalibrationDataReader):  # type: ignore[misc]
    """Feeds stacked real inputs to ONNX Runtime's calibrator in batches.

    Args:
        input_name: the model's input name.
        tensors: (N, C, H, W) float32.
        batch_size: inputs per ``get_next`` (the models have a dynamic batch dim).
    """

    def __init__(self, input_name: str, tensors: np.ndarray, batch_size: int = 8) -> None:
        if tensors.ndim != 4 or len(tensors) == 0:
            raise ValueError(f"expected (N, C, H, W) tensors, got shape {tensors.shape}")
        self.input_name = input_name
        self.tensors = np.ascontiguousarray(tensors, dtype=np.float32)
        self.batch_size = max(1, int(batch_size))
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= len(self.tensors):
            return None
        batch = self.tensors[self._next : self._next + self.batch_size]
        self._next += self.batch_size
        return {self.input_name: batch}

    def rewind(self) -> None:
        self._next = 0

    def __len__(self) -> int:
        return math.ceil(len(self.tensors) / self.batch_size)


class DetectorCalibration(TensorReader):
    """Letterboxed whole images of the augmented photos (detector input)."""

    def __init__(self, data: StageData, model: str, input_name: str = "input",
                 batch_size: int = 8) -> None:
        super().__init__(input_name, data.tensors(model), batch_size)


class MeshCalibration(TensorReader):
    """Face ROIs of the augmented photos (``facemesh`` input)."""

    def __init__(self, data: StageData, input_name: str = "input", batch_size: int = 8) -> None:
        super().__init__(input_name, data.tensors("facemesh"), batch_size)


class IrisCalibration(TensorReader):
    """Eye ROIs of the augmented photos (``iris`` input)."""

    def __init__(self, data: StageData, input_name: str = "input", batch_size: int = 8) -> None:
        super().__init__(input_name, data.tensors("iris"), batch_size)


class RecognizerCalibration(TensorReader):
    """Aligned chips of the augmented photos (``dlib_resnet`` input)."""

    def __init__(self, data: StageData, input_name: str = "input", batch_size: int = 8) -> None:
        super().__init__(input_name, data.tensors("dlib_resnet"), batch_size)


def calibration_reader(data: StageData, model: str, input_name: str,
                       batch_size: int = 8) -> TensorReader:
    """The calibration reader for ``model`` (one of :data:`MODEL_TASKS`)."""
    task = MODEL_TASKS[model]
    if task == "detect":
        return DetectorCalibration(data, model, input_name, batch_size)
    if task == "mesh":
        return MeshCalibration(data, input_name, batch_size)
    if task == "iris":
        return IrisCalibration(data, input_name, batch_size)
    return RecognizerCalibration(data, input_name, batch_size)
