"""The built container image starts from its own filesystem and serves a fuse.

The image is named by ``FACEFUSE_IMAGE`` (``make image`` builds it and runs this
module; ``.ci/run`` does both on every run). Without it the tests are skipped: a
plain ``pytest`` does not build images.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from image_rootfs import ChrootProcess, ImageConfig, can_mount, inspect, mounted
from server_harness import free_port

IMAGE = os.environ.get("FACEFUSE_IMAGE", "")

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


def test_image_metadata(config: ImageConfig) -> None:
    assert config.user not in ("", "0", "root", "0:0")
    assert config.labels["org.opencontainers.image.version"]
    assert config.labels["org.opencontainers.image.revision"] not in ("", "unknown")
    assert "/healthz" in " ".join(config.healthcheck)
    assert config.stop_signal == "SIGTERM"
    assert config.env["FACEFUSE_MODELS_DIR"] == "/models"


def test_image_holds_no_build_tools(rootfs: Path) -> None:
    venv = rootfs / "opt/facefuse"
    site = next((venv / "lib").glob("python3*/site-packages"))
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
