"""Which face detector runs, chosen by ``Settings.detector``, and which quarter turns
the detect stage (:func:`facefuse.faces.stages.detect`) tries when none is upright.

``full`` / ``short``: BlazeFace (MediaPipe) full- or short-range;
``yunet``: libfacedetection's YuNet. Every detector has the same shape
(:class:`Detector`), so the analyser and the server's micro-batchers drive
them alike.

``auto`` (the default) picks one per :data:`Purpose` (:func:`detector_for`):
BlazeFace full-range where only the largest face of an image is used (fusion
sources, the target in ``one`` mode, a reference photo, ``/v1/verify``), YuNet
where every face is (the target in ``many`` mode, with a mapping or a face index,
face listings). YuNet finds the faces BlazeFace misses in groups, at the frame's
edge and filling the frame, at about 2.4x BlazeFace's detect time
(BENCHMARKS.md, "detect" and "groups"); the one-face path keeps BlazeFace's speed.
Both the library (:class:`~facefuse.faces.analyser.FaceAnalyser`) and the server
(:class:`~facefuse.serving.pipeline.Pipeline`) ask :func:`detector_for`.
"""

from __future__ import annotations

from typing import Literal

from facefuse.config import Settings
from facefuse.faces.blazeface import BlazeFaceDetector
from facefuse.faces.detector_base import BatchedDetector
from facefuse.faces.rotation import RETRY_TURNS
from facefuse.faces.yunet import YuNetDetector
from facefuse.runtime.batch_policy import batch_policy
from facefuse.runtime.providers import device_of
from facefuse.runtime.registry import ModelRegistry

#: ``Settings.detector`` → the model it runs.
DETECTOR_MODELS: dict[str, str] = {
    "full": "blazeface_full",
    "short": "blazeface_short",
    "yunet": "yunet",
}


#: Which faces of an image the caller uses: ``largest`` (only the largest face) or
#: ``all`` (every face: listings, ``many`` mode, mappings, a chosen face index).
Purpose = Literal["largest", "all"]
PURPOSES: tuple[Purpose, ...] = ("largest", "all")

#: ``Settings.detector = "auto"``: the detector each purpose runs.
AUTO_DETECTORS: dict[Purpose, str] = {"largest": "full", "all": "yunet"}

#: What every detector is (preprocess → batched run → postprocess).
Detector = BatchedDetector


def detector_for(settings: Settings, purpose: Purpose) -> str:
    """The detector (``full`` | ``short`` | ``yunet``) that runs for ``purpose``:
    the one ``settings.detector`` forces, or under ``auto`` :data:`AUTO_DETECTORS`'s."""
    if settings.detector == "auto":
        return AUTO_DETECTORS[purpose]
    return settings.detector


def detectors_in_use(settings: Settings) -> tuple[str, ...]:
    """Every detector some purpose runs under ``settings``, in :data:`PURPOSES` order."""
    return tuple(dict.fromkeys(detector_for(settings, p) for p in PURPOSES))


def make_detector(settings: Settings, registry: ModelRegistry, name: str) -> Detector:
    """The detector ``name`` (``full`` | ``short`` | ``yunet``) over the registry's
    model, with ``settings``' thresholds; its passes run in chunks of the batch
    policy's largest batch where the model runs (8 on the CPU by default)."""
    model = registry.get(DETECTOR_MODELS[name])
    detector: Detector
    if name == "yunet":
        detector = YuNetDetector(
            model, score_threshold=settings.det_yunet_score_threshold,
            tile_above=max(settings.det_tile_above, 640),
        )
    else:
        detector = BlazeFaceDetector(
            model,
            score_threshold=settings.det_score_threshold,
            nms_iou=settings.det_nms_iou,
            tile_above=settings.det_tile_above,
            variant="short" if name == "short" else "full",
        )
    gpu = device_of(model.provider) != "cpu"
    detector.pass_chunk = batch_policy(settings, gpu=gpu).max_batch_size
    return detector


def turns_to_try(settings: Settings) -> tuple[int, ...]:
    """Quarter turns to try in order, stopping at the first that finds a face."""
    return RETRY_TURNS if settings.det_rotations else (0,)
