"""The server with YuNet selected (FACEFUSE_DETECTOR=yunet): its batched detect stage
finds every face of a synthetic group photo and a photo turned upside down, and the
mesh of the turned face lands where the library's analyser puts it."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from server_harness import ServerProcess, graceful

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.imaging.decode import decode_image
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.detection_sets import fetch_face_free, group_photo, match


@pytest.fixture(scope="module")
def client(
    settings: Settings, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("yunet"),
                         {"FACEFUSE_DETECTOR": "yunet"}, name="yunet")
    with graceful(proc), proc.client() as c:
        yield c


def _png(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def _boxes(r: httpx.Response) -> np.ndarray:
    assert r.status_code == 200, r.text
    return np.array([f["bbox"] for f in r.json()["faces"]], float).reshape(-1, 4)


def test_group_photo_every_face_through_the_batched_detector(
    client: httpx.Client, settings: Settings, sample_images: dict[str, np.ndarray]
) -> None:
    free = {n: decode_image(p) for n, p in
            fetch_face_free(settings.home / "face-free", settings.downloads_dir).items()}
    group = group_photo(sample_images, free, seed=1)
    found, false = match(_boxes(client.post("/v1/faces", files={
        "image": ("g.png", _png(group.image))})), group.faces)
    assert (found, false) == (len(group.faces), 0)


def test_upside_down_photo_is_found_and_meshed_like_the_library(
    client: httpx.Client, settings: Settings, registry: ModelRegistry,
    sample_images: dict[str, np.ndarray],
) -> None:
    turned = np.ascontiguousarray(np.rot90(sample_images["obama"], 2))
    r = client.post("/v1/faces", files={"image": ("t.png", _png(turned))},
                    data={"landmarks": "true"})
    faces = r.json()["faces"]
    assert len(faces) == 1, r.text
    local = FaceAnalyser(settings.replace(detector="yunet"), registry).analyse(
        turned, embed=False)
    assert len(local) == 1 and local[0].landmarks is not None
    server_mesh = np.asarray(faces[0]["landmarks"])[:, :2]
    np.testing.assert_allclose(server_mesh, local[0].landmarks[:, :2], atol=1.0)
    # Upside down: the eyes are below the nose tip.
    assert server_mesh[[33, 263], 1].min() > server_mesh[1, 1]
