"""The server with its default detector setting (``auto``): ``mode=many`` fuses a
face of a synthetic group that BlazeFace misses (YuNet found it), ``mode=one`` runs
BlazeFace only and ``/v1/faces`` YuNet only (the per-model batch counts of
``/metrics``), and both detectors are loaded, listed and ready."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image
from server_harness import ServerProcess, batch_stats, graceful

from facefuse.config import Settings
from facefuse.imaging.decode import decode_image
from facefuse.imaging.encode import encode_image
from facefuse.toolchain.detection_sets import Case, fetch_face_free, group_photo, pairs

#: The group whose face 4 BlazeFace full-range misses and YuNet finds (about 60 px wide).
SEED, MISSED = 1, 4
DETECTORS = ("blazeface_full", "yunet")


@pytest.fixture(scope="module")
def client(settings: Settings, model_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    # No FACEFUSE_DETECTOR: the harness drops the caller's FACEFUSE_* settings.
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("auto"), name="auto")
    with graceful(proc), proc.client() as c:
        yield c


@pytest.fixture(scope="module")
def groups(settings: Settings, sample_images: dict[str, np.ndarray]) -> dict[int, Case]:
    free = {n: decode_image(p) for n, p in
            fetch_face_free(settings.home / "face-free", settings.downloads_dir).items()}
    return {seed: group_photo(sample_images, free, seed=seed) for seed in (0, SEED)}


def _batches(client: httpx.Client) -> dict[str, float]:
    """Items each detector has run so far (``facefuse_batch_size_sum{model=...}``)."""
    text = client.get("/metrics").text
    return {m: batch_stats(text, m)[0] for m in DETECTORS}


def _fuse(client: httpx.Client, source: Path, target: np.ndarray,
          **data: str) -> httpx.Response:
    return client.post("/v1/fuse", data={"format": "png", **data}, files={
        "source": ("s.png", source.read_bytes(), "image/png"),
        "target": ("t.png", encode_image(target, "png"), "image/png")})


def test_both_detectors_are_loaded_listed_and_ready(client: httpx.Client) -> None:
    assert client.get("/readyz").status_code == 200
    names = {m["name"] for m in client.get("/v1/models").json()["models"]}
    assert set(DETECTORS) <= names


def test_mode_one_runs_blazeface_and_the_listing_yunet(
        client: httpx.Client, sample_paths: dict[str, Path], groups: dict[int, Case]) -> None:
    image = groups[0].image
    before = _batches(client)
    r = _fuse(client, sample_paths["astronaut"], image)
    assert r.status_code == 200, r.text
    after = _batches(client)
    assert after["blazeface_full"] > before["blazeface_full"]
    assert after["yunet"] == before["yunet"]
    listed = client.post("/v1/faces", files={"image": ("g.png", encode_image(image, "png"))})
    assert listed.status_code == 200, listed.text
    final = _batches(client)
    assert final["yunet"] > after["yunet"]
    assert final["blazeface_full"] == after["blazeface_full"]


def test_many_mode_fuses_the_face_blazeface_misses(
        client: httpx.Client, sample_paths: dict[str, Path], groups: dict[int, Case]) -> None:
    group = groups[SEED]
    r = _fuse(client, sample_paths["astronaut"], group.image, mode="many")
    assert r.status_code == 200, r.text
    out = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"))
    x0, y0, x1, y1 = (int(v) for v in group.faces[MISSED])
    assert np.abs(out[y0:y1, x0:x1].astype(int) - group.image[y0:y1, x0:x1]).mean() > 2.0
    # The faces it skips (too small) are reported; the missed face is not among them.
    skipped = json.loads(r.headers.get("x-facefuse-skipped-faces", "[]"))
    boxes = np.array([s["box"] for s in skipped], float).reshape(-1, 4)
    assert MISSED not in {t for _, t in pairs(boxes, group.faces)}
    assert {s["reason"] for s in skipped} <= {"target_face_too_small"}
