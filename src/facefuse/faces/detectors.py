"""Which face detector runs, chosen by ``Settings.detector``, and which quarter turns
the detect stage (:func:`facefuse.faces.stages.detect`) tries when none is upright.

``full`` / ``short``: BlazeFace (MediaPipe) full- or short-range;
``yunet``: libfacedetection's YuNet. Every detector has the same shape
(:class:`Detector`), so the analyser and the server's micro-batchers drive
them alike.
"""

from __future__ import annotations

from facefuse.config import Settings
from facefuse.faces.detector import BatchedDetector, FaceDetector
from facefuse.faces.rotation import RETRY_TURNS
from facefuse.faces.yunet import YuNetDetector
from facefuse.runtime.registry import ModelRegistry

#: ``Settings.detector`` → the model it runs.
DETECTOR_MODELS: dict[str, str] = {
    "full": "blazeface_full",
    "short": "blazeface_short",
    "yunet": "yunet",
}


#: What every detector is (preprocess → batched run → postprocess).
Detector = BatchedDetector


def detector_model(settings: Settings) -> str:
    """The model name ``settings.detector`` runs."""
    return DETECTOR_MODELS[settings.detector]


def make_detector(settings: Settings, registry: ModelRegistry) -> Detector:
    """The detector ``settings.detector`` names, over the registry's model."""
    model = registry.get(detector_model(settings))
    if settings.detector == "yunet":
        return YuNetDetector(
            model, score_threshold=settings.det_yunet_score_threshold,
            tile_above=max(settings.det_tile_above, 640),
        )
    return FaceDetector(
        model,
        score_threshold=settings.det_score_threshold,
        nms_iou=settings.det_nms_iou,
        tile_above=settings.det_tile_above,
        variant="short" if settings.detector == "short" else "full",
    )


def turns_to_try(settings: Settings) -> tuple[int, ...]:
    """Quarter turns to try in order, stopping at the first that finds a face."""
    return RETRY_TURNS if settings.det_rotations else (0,)
