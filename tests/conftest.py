"""Shared fixtures: settings, the built model zoo and the sample photos.

The zoo and samples live under FACEFUSE_HOME (``make test`` sets it up; these
fixtures build whatever is missing, idempotently, so plain ``pytest`` works too).

Hypothesis runs under one of two profiles: ``ci`` (selected when ``CI=true``, as
``.ci/run`` sets it) is derandomized and keeps no example database, so every CI
run draws the same examples; ``dev`` (the default elsewhere) draws new random
examples each run and replays the failures it saved in ``.hypothesis/``.
``HYPOTHESIS_PROFILE`` picks one explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis.database import DirectoryBasedExampleDatabase

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.engine import FaceFuser
from facefuse.runtime.registry import ModelRegistry

hypothesis_settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
hypothesis_settings.register_profile(
    "dev",
    database=DirectoryBasedExampleDatabase(Path(__file__).resolve().parents[1] / ".hypothesis"),
)
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") == "true" else "dev")
)


@pytest.fixture
def anyio_backend() -> str:
    """``pytest.mark.anyio`` tests run on asyncio (the server's loop), not trio."""
    return "asyncio"


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


@pytest.fixture
def private_models(model_dir: Path, tmp_path: Path) -> Path:
    """A model directory of the test's own: the model files linked, the manifest
    copied (so a test may republish or break a model without touching the zoo)."""
    import shutil

    from facefuse.runtime.manifest import MANIFEST_NAME

    out = tmp_path / "models"
    out.mkdir()
    for f in model_dir.iterdir():
        if f.suffix == ".onnx":
            (out / f.name).symlink_to(f)
    shutil.copy(model_dir / MANIFEST_NAME, out / MANIFEST_NAME)
    return out


@pytest.fixture(scope="session")
def registry(settings: Settings, model_dir: Path) -> ModelRegistry:
    return ModelRegistry(settings)


@pytest.fixture(scope="session")
def analyser(settings: Settings, registry: ModelRegistry) -> FaceAnalyser:
    return FaceAnalyser(settings, registry)


@pytest.fixture(scope="session")
def fuser(settings: Settings, analyser: FaceAnalyser) -> FaceFuser:
    return FaceFuser(settings, analyser)


def group_photo(images: dict[str, np.ndarray], names: list[str], height: int = 700) -> np.ndarray:
    """The named sample photos side by side at one height: a real multi-face image."""
    import cv2

    tiles = []
    for n in names:
        img = images[n]
        w = round(img.shape[1] * height / img.shape[0])
        tiles.append(cv2.resize(img, (w, height), interpolation=cv2.INTER_AREA))
    return np.ascontiguousarray(np.concatenate(tiles, axis=1))


#: A group of three with known face sizes: faces 0 and 1 fusable, face 2 (the smallest,
#: about 35 px between the outer eye corners) just below the default limit of 40.
SMALL_FACE_LINEUP = (("obama", 110.0), ("biden", 100.0), ("obama3", 60.0))


@pytest.fixture(scope="session")
def small_face_group(sample_images: dict[str, np.ndarray]) -> np.ndarray:
    """RGB uint8 (280, W, 3): :data:`SMALL_FACE_LINEUP` side by side on grey."""
    from facefuse.toolchain.detection_sets import lineup

    return lineup(sample_images, SMALL_FACE_LINEUP, height=280).image


@pytest.fixture(scope="session")
def make_group(sample_images: dict[str, np.ndarray]) -> Callable[..., np.ndarray]:
    """``make_group(["biden", "obama2"])``: see :func:`group_photo`."""
    return lambda names, height=700: group_photo(sample_images, names, height)
