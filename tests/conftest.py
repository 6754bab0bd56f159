"""Shared fixtures: settings, the built model zoo and the sample photos.

The zoo and samples live under FACEFUSE_HOME (``make test`` sets it up; these
fixtures build whatever is missing, idempotently, so plain ``pytest`` works too).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.engine import FaceFuser
from facefuse.runtime.registry import ModelRegistry


@pytest.fixture(scope="session")
def settings() -> Settings:
    # FP32 pinned: a zoo quantized by hand under FACEFUSE_HOME must not change what
    # the reference comparisons measure; INT8 selection has its own tests.
    return Settings.from_env(threads=1, precision="fp32")


@pytest.fixture(scope="session")
def sample_paths(settings: Settings) -> dict[str, Path]:
    """name -> path for obama, obama2, obama3, biden, astronaut."""
    from facefuse.toolchain.samples import fetch_samples

    return fetch_samples(settings.samples_dir, settings.downloads_dir)


@pytest.fixture(scope="session")
def sample_images(sample_paths: dict[str, Path]) -> dict[str, np.ndarray]:
    """name -> RGB uint8 (H, W, 3) decoded sample photo."""
    from facefuse.imaging.decode import decode_image

    return {name: decode_image(path) for name, path in sample_paths.items()}


@pytest.fixture(scope="session")
def model_dir(settings: Settings) -> Path:
    from facefuse.toolchain.build.zoo import build_zoo

    build_zoo(settings)
    return settings.model_dir


@pytest.fixture(scope="session")
def registry(settings: Settings, model_dir: Path) -> ModelRegistry:
    return ModelRegistry(settings)


@pytest.fixture(scope="session")
def analyser(settings: Settings, registry: ModelRegistry) -> FaceAnalyser:
    return FaceAnalyser(settings, registry)


@pytest.fixture(scope="session")
def fuser(settings: Settings, analyser: FaceAnalyser) -> FaceFuser:
    return FaceFuser(settings, analyser)
