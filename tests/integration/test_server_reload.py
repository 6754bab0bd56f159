"""Model hot reload on a real server with its own copy of the model directory.

A new recognizer file (same weights, new bytes, so a new sha256) is published while
four clients keep sending requests: the watcher swaps it in, no request fails and the
embeddings stay the same. A bad model on disk is refused — by the watcher and by the
admin route — and the old models keep serving.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from server_harness import ServerProcess, graceful, photo_variants

from facefuse.config import Settings
from facefuse.runtime.manifest import Manifest

MODEL = "dlib_resnet"


@pytest.fixture
def models(private_models: Path) -> Path:
    return private_models


@pytest.fixture
def server(settings: Settings, models: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp_path, {
        "FACEFUSE_MODELS_DIR": str(models), "FACEFUSE_RELOAD_POLL_S": "0.2",
        "FACEFUSE_L1_CACHE_BYTES": "0",  # every request runs the models
        "FACEFUSE_PRECISION": "fp32",  # the variant this test republishes
        "FACEFUSE_ADMIN_OPEN": "true",  # no keys here: the reload route must be open
    }, name="reload")
    with graceful(proc):
        yield proc


def publish(models: Path, name: str, data: bytes, filename: str) -> str:
    """Write a model file, then point the manifest at it (the safe order)."""
    (models / filename).write_bytes(data)
    manifest = Manifest.load(models)
    spec = manifest.models[name]
    digest = hashlib.sha256(data).hexdigest()
    manifest.models[name] = type(spec)(**{**spec.__dict__, "file": filename, "sha256": digest,
                                          "size": len(data)})
    manifest.save(models)
    return digest


def version_of(c: httpx.Client, name: str) -> str:
    rows = {m["name"]: m for m in c.get("/v1/models").json()["models"]}
    return str(rows[name]["sha256"])


def embedding(c: httpx.Client, image: bytes) -> np.ndarray:
    r = c.post("/v1/embed", files={"image": ("i.jpg", image)})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["faces"][0]["embedding"])


def test_hot_reload_under_load_fails_no_request(
    server: ServerProcess, models: Path, sample_images: dict[str, np.ndarray]
) -> None:
    images = photo_variants(sample_images, 8, seed=11)
    with server.client() as c:
        old = version_of(c, MODEL)
        reference = embedding(c, images[0])
    stop = threading.Event()
    swapped = threading.Event()
    after_swap = [0] * 4

    def client_loop(k: int) -> list[int]:
        statuses = []
        with server.client() as c:
            i = k
            while not stop.is_set():
                kind = i % 2
                if kind == 0:
                    r = c.post("/v1/embed", files={"image": ("i.jpg", images[i % 8])})
                else:
                    r = c.post("/v1/fuse", files={"source": ("s.jpg", images[i % 8]),
                                                  "target": ("t.jpg", images[(i + 3) % 8])},
                               data={"degree": str(30 + i % 50)})
                statuses.append(r.status_code)
                if swapped.is_set():
                    after_swap[k] += 1
                i += 4
        return statuses

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(client_loop, k) for k in range(4)]
        time.sleep(0.5)  # let the load start before publishing
        proto = onnx.load(str(models / f"{MODEL}.onnx"))
        proto.doc_string = "republished by test_server_reload"
        new = publish(models, MODEL, proto.SerializeToString(), f"{MODEL}.v2.onnx")
        assert new != old
        with server.client() as c:
            end = time.monotonic() + 60
            while version_of(c, MODEL) != new:
                assert time.monotonic() < end, server.log_tail()
                time.sleep(0.1)
        swapped.set()
        end = time.monotonic() + 120
        while min(after_swap) < 2 and time.monotonic() < end:
            time.sleep(0.1)
        stop.set()
        statuses = [s for f in futures for s in f.result(timeout=120)]
    assert min(after_swap) >= 2
    assert statuses and set(statuses) == {200}, statuses
    with server.client() as c:
        body = c.get("/v1/models").json()
        assert body["last_reload"]["ok"] is True and MODEL in body["last_reload"]["changed"]
        np.testing.assert_allclose(embedding(c, images[0]), reference, atol=1e-5)


def test_a_bad_model_on_disk_is_refused_and_the_old_one_keeps_serving(
    server: ServerProcess, models: Path, sample_images: dict[str, np.ndarray]
) -> None:
    image = photo_variants(sample_images, 1, seed=12)[0]
    with server.client() as c:
        old = version_of(c, MODEL)
        reference = embedding(c, image)
        # Not an ONNX model, but the manifest's sha256 matches: loading must fail.
        publish(models, MODEL, b"definitely not an onnx graph" * 100, f"{MODEL}.bad.onnx")
        end = time.monotonic() + 60
        while c.get("/v1/models").json()["last_reload"]["ok"] is not False:
            assert time.monotonic() < end, server.log_tail()
            time.sleep(0.1)
        body = c.get("/v1/models").json()
        assert body["last_reload"]["error"] == "model_corrupt"
        assert version_of(c, MODEL) == old
        np.testing.assert_allclose(embedding(c, image), reference, atol=1e-6)
        r = c.post("/v1/models/reload")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_corrupt"

        # The manifest names a file whose bytes do not match: refused as well.
        manifest = Manifest.load(models)
        spec = manifest.models[MODEL]
        manifest.models[MODEL] = type(spec)(**{**spec.__dict__, "file": f"{MODEL}.onnx",
                                               "sha256": "0" * 64})
        manifest.save(models)
        r = c.post("/v1/models/reload")
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_corrupt"
        assert version_of(c, MODEL) == old
        assert c.get("/readyz").json()["status"] == "ready"
        np.testing.assert_allclose(embedding(c, image), reference, atol=1e-6)
