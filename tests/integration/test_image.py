"""The built container images start from their own filesystems: the API serves a
fuse, and a clip job goes through the API image (no PyAV) and the worker image.

The images are named by ``FACEFUSE_IMAGE`` (the API) and ``FACEFUSE_WORKER_IMAGE``
(``make image`` builds both and runs this module; ``.ci/run`` does both on every
run). Without them the tests are skipped: a plain ``pytest`` does not build images.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from image_rootfs import ChrootProcess, ImageConfig, can_mount, inspect, mounted
from server_harness import free_port
from worker_harness import wait_state

from facefuse.faces.analyser import FaceAnalyser
from facefuse.toolchain.clips import Scene, motion_frames, write_clip

IMAGE = os.environ.get("FACEFUSE_IMAGE", "")
WORKER_IMAGE = os.environ.get("FACEFUSE_WORKER_IMAGE", "")
needs_worker = pytest.mark.skipif(not WORKER_IMAGE, reason="FACEFUSE_WORKER_IMAGE not set")

pytestmark = [
    pytest.mark.image,
    pytest.mark.skipif(not IMAGE, reason="FACEFUSE_IMAGE not set (make image builds one)"),
]


@pytest.fixture(scope="module")
def config() -> ImageConfig:
    if shutil.which("podman") is None or not can_mount():
        pytest.fail("the image smoke test needs podman and root (scripts/install-system-deps.sh)")
    return inspect(IMAGE)


@pytest.fixture(scope="module")
def rootfs(config: ImageConfig) -> Iterator[Path]:
    with mounted(IMAGE) as root:
        yield root


@pytest.fixture(scope="module")
def worker_config(config: ImageConfig) -> ImageConfig:
    return inspect(WORKER_IMAGE)


@pytest.fixture(scope="module")
def worker_rootfs(worker_config: ImageConfig) -> Iterator[Path]:
    with mounted(WORKER_IMAGE) as root:
        yield root


def site_packages(root: Path) -> Path:
    return next((root / "opt/facefuse/lib").glob("python3*/site-packages"))


def test_image_metadata(config: ImageConfig) -> None:
    assert config.user not in ("", "0", "root", "0:0")
    assert config.labels["org.opencontainers.image.version"]
    assert config.labels["org.opencontainers.image.revision"] not in ("", "unknown")
    assert "/healthz" in " ".join(config.healthcheck)
    assert config.stop_signal == "SIGTERM"
    assert config.env["FACEFUSE_MODELS_DIR"] == "/models"


def test_image_holds_no_build_tools(rootfs: Path) -> None:
    venv = rootfs / "opt/facefuse"
    site = site_packages(rootfs)
    for gone in ("pip", "onnx", "tflite2onnx", "onnxconverter_common", "sympy"):
        assert not (site / gone).exists(), gone
    # Bytecode only as the runtime stage compiles it: the start-up modules, hash-based
    # and never checked against the sources (flags 0b01 in the .pyc header).
    pycs = list(venv.rglob("*.pyc"))
    assert pycs and all(int.from_bytes(p.read_bytes()[4:8], "little") == 1 for p in pycs)
    for tool in ("gcc", "cc", "g++", "make"):
        assert not (rootfs / "usr/bin" / tool).exists(), tool
    assert not list((rootfs / "var/lib/apt/lists").glob("*_Packages"))
    manifest = (rootfs / "models/manifest.json").read_text()
    assert '"int8"' in manifest  # the gated INT8 variants ship in the image


def test_image_serves_from_its_own_filesystem(
    rootfs: Path, config: ImageConfig, sample_paths: dict[str, Path], tmp_path: Path
) -> None:
    port = free_port()
    proc = ChrootProcess(rootfs, config, ["--host", "127.0.0.1", "--port", str(port)],
                         tmp_path / "server.log")
    try:
        proc.wait_ready(f"http://127.0.0.1:{port}/readyz")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            assert client.get("/healthz").status_code == 200
            models = client.get("/v1/models").json()
            assert "int8" in str(models)
            r = client.post("/v1/fuse", files={
                "source": ("s.jpg", sample_paths["obama"].read_bytes(), "image/jpeg"),
                "target": ("t.jpg", sample_paths["biden"].read_bytes(), "image/jpeg"),
            }, data={"degree": "80"})
            assert r.status_code == 200, r.text
            assert r.headers["content-type"].startswith("image/")
            assert len(r.content) > 10_000
    finally:
        rc = proc.stop()
    assert rc in (0, -15, 143), proc.log_tail()


def test_api_image_has_no_ffmpeg(rootfs: Path, config: ImageConfig, tmp_path: Path) -> None:
    """The API leaves clips to the worker image: no PyAV, no FFmpeg libraries, and
    the CLI's video command says so, typed."""
    site = site_packages(rootfs)
    assert not (site / "av").exists() and not (site / "av.libs").exists()
    # (The PyPI OpenCV wheel, with SLIM_OPENCV=0, links its own FFmpeg into cv2.)
    assert not [p for p in site.glob("*.libs/libavcodec*") if "opencv" not in p.parent.name]
    cli = dataclasses.replace(config, entrypoint=["facefuse"])
    proc = ChrootProcess(rootfs, cli, ["video", "--list-encoders"], tmp_path / "video.log")
    assert proc.proc.wait(120) == 5, proc.log_tail()
    assert "video_unavailable" in proc.log_tail()


@pytest.mark.skipif(os.environ.get("SLIM_OPENCV", "1") != "1",
                    reason="built with SLIM_OPENCV=0: the PyPI OpenCV wheel")
def test_image_carries_the_slim_opencv(rootfs: Path) -> None:
    """The OpenCV of deploy/build-slim-opencv.py: one cv2 module, nothing grafted
    beside it (the PyPI wheel's FFmpeg, OpenBLAS and codecs), its own version."""
    site = site_packages(rootfs)
    assert not (site / "opencv_python_headless.libs").exists()
    assert [p.name for p in site.glob("cv2*.so")], sorted(p.name for p in site.glob("cv2*"))
    assert [p.name for p in site.glob("opencv_python_headless-*+slim.dist-info")]
    assert sum(p.stat().st_size for p in site.glob("cv2*.so")) < 30 * 2**20


@needs_worker
def test_worker_image_metadata(worker_config: ImageConfig, worker_rootfs: Path) -> None:
    assert worker_config.user not in ("", "0", "root", "0:0")
    assert worker_config.labels["org.opencontainers.image.title"] == "facefuse-worker"
    assert worker_config.labels["org.opencontainers.image.revision"] not in ("", "unknown")
    assert worker_config.entrypoint == ["facefuse", "worker"]
    assert "9101/metrics" in " ".join(worker_config.healthcheck)
    assert worker_config.stop_signal == "SIGTERM"
    assert worker_config.env["FACEFUSE_MODELS_DIR"] == "/models"
    site = site_packages(worker_rootfs)
    assert (site / "av").is_dir() and list((site / "av.libs").glob("libavcodec*"))
    assert not (site / "pip").exists()


def _clip(path: Path, analyser: FaceAnalyser, photo: np.ndarray, frames: int) -> bytes:
    b = analyser.analyse(photo, embed=False)[0].bbox
    face = (float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2, float(b[2] - b[0]))
    scene = Scene(photo, frames, face, size=(320, 240), face_px=110)
    return write_clip(path, list(motion_frames(scene))).read_bytes()


@needs_worker
def test_clip_job_through_the_api_and_worker_images(
    rootfs: Path, config: ImageConfig, worker_rootfs: Path, worker_config: ImageConfig,
    redis_server: Any, analyser: FaceAnalyser, sample_images: dict[str, np.ndarray],
    sample_paths: dict[str, Path], tmp_path: Path,
) -> None:
    """The API image (no PyAV) queues clips; the worker image fuses them, and refuses a
    clip over the limits with the typed error the API could not check."""
    env = {"FACEFUSE_JOBS_REDIS_URL": redis_server.url, "FACEFUSE_VIDEO_MAX_FRAMES": "10",
           "FACEFUSE_MAX_BODY_BYTES": str(16 << 20)}
    port, mport = free_port(), free_port()
    api = ChrootProcess(rootfs, config, ["--host", "127.0.0.1", "--port", str(port)],
                        tmp_path / "api.log", env)
    worker = ChrootProcess(worker_rootfs, worker_config, ["--metrics-port", str(mport)],
                           tmp_path / "worker.log", {**env, "FACEFUSE_THREADS": "1"})
    short = _clip(tmp_path / "short.mp4", analyser, sample_images["obama"], 8)
    long = _clip(tmp_path / "long.mp4", analyser, sample_images["obama"], 14)
    source = sample_paths["biden"].read_bytes()
    try:
        api.wait_ready(f"http://127.0.0.1:{port}/readyz")
        worker.wait_ready(f"http://127.0.0.1:{mport}/metrics")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            locs = {}
            for name, clip in (("short", short), ("long", long)):
                r = client.post("/v1/jobs", files={"source": ("s.jpg", source),
                                                   "clip": ("c.mp4", clip)},
                                data={"degree": "80"})
                assert r.status_code == 202, r.text  # queued: the API cannot read clips
                locs[name] = r.headers["location"]
            done = wait_state(client, locs["short"], {"succeeded", "failed"})
            assert done["status"] == "succeeded", done
            assert done["progress"]["frames_done"] == done["progress"]["frames_total"] == 8
            res = client.get(locs["short"] + "/result")
            assert res.status_code == 200 and res.headers["content-type"] == "video/mp4"
            assert len(res.content) > 1000
            refused = wait_state(client, locs["long"], {"succeeded", "failed"})
            assert refused["status"] == "failed", refused
            assert refused["error"]["code"] == "video_too_long", refused
    finally:
        rcs = worker.stop(), api.stop()
    assert all(rc in (0, -15, 143) for rc in rcs), worker.log_tail() + api.log_tail()
