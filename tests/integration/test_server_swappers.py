"""A registered ONNX swapper everywhere: over HTTP (``/v1/fuse``, a template's fuse,
``/v1/jobs`` run by a worker, ``/v1/capabilities``) and from the CLI, with
``unknown_swapper`` at the door of each.

The swap model is a tiny one built to the contract (``swap_models``: it paints the
face one colour), registered in the manifest of a model directory beside the real
zoo, as docs/swappers.md tells a user to; servers, workers and the CLI are real
processes pointed at that directory.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
from server_harness import ADMIN_TOKEN, USER_TOKEN, ServerProcess, graceful
from worker_harness import WorkerProcess, wait_state

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.clips import Scene, motion_frames, write_clip
from swap_models import TINY, middle_third, painted, tiny_swap_dir

Box = tuple[int, int, int, int]


@pytest.fixture(scope="module")
def tiny_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_swap_dir(tmp_path_factory.mktemp("tiny_models"), model_dir)


@pytest.fixture(scope="module")
def server(settings: Settings, tiny_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("swappers"), {
        "FACEFUSE_MODELS_DIR": str(tiny_dir),
        "FACEFUSE_API_KEYS": f"tests:{USER_TOKEN}",
        "FACEFUSE_ADMIN_KEYS": f"ops:{ADMIN_TOKEN}",
        "FACEFUSE_TEMPLATES_DIR": str(tmp_path_factory.mktemp("templates")),
    }, name="swappers")
    with graceful(proc):
        yield proc


@pytest.fixture(scope="module")
def target_box(analyser: FaceAnalyser, sample_images: dict[str, np.ndarray]) -> Box:
    """The middle of the target's (obama's) face."""
    return middle_third(analyser.analyse(sample_images["obama"], embed=False)[0].bbox)


def _fuse(client: httpx.Client, photos: dict[str, bytes], **data: str) -> httpx.Response:
    return client.post("/v1/fuse", files={"source": ("s.jpg", photos["biden"]),
                                          "target": ("t.jpg", photos["obama"])},
                       data={"format": "png", **data})


def _unknown(r: httpx.Response) -> str:
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "unknown_swapper", error
    return str(error["message"])


def test_capabilities_list_the_swappers(client: httpx.Client) -> None:
    caps = client.get("/v1/capabilities").json()
    assert caps["swappers"] == {"default": "classic", "choices": [
        {"name": "classic", "kind": "classic", "needs_source_embedding": False},
        {"name": TINY, "kind": "onnx", "needs_source_embedding": True}]}
    assert caps["options"]["swapper"] == {"type": "string", "default": "classic",
                                          "enum": ["classic", TINY]}


def test_fuse_with_the_registered_swapper(client: httpx.Client, photos: dict[str, bytes],
                                          target_box: Box) -> None:
    r = _fuse(client, photos, swapper=TINY)
    assert r.status_code == 200, r.text
    assert r.headers["x-facefuse-cache"] == "miss"
    assert painted(decode_image(r.content), target_box)
    # The same images and options with another swapper: not the cached result.
    classic = _fuse(client, photos)
    assert classic.status_code == 200 and classic.headers["x-facefuse-cache"] == "miss"
    assert not painted(decode_image(classic.content), target_box)
    # The default named or not is one result; the tiny one's is still its own.
    named = _fuse(client, photos, swapper="classic")
    assert named.headers["x-facefuse-cache"] == "hit" and named.content == classic.content
    again = _fuse(client, photos, swapper=TINY)
    assert again.headers["x-facefuse-cache"] == "hit" and again.content == r.content
    # JSON bodies take it too.
    body = {"source": base64.b64encode(photos["biden"]).decode(),
            "target": base64.b64encode(photos["obama"]).decode(),
            "format": "png", "swapper": TINY}
    assert client.post("/v1/fuse", json=body).content == r.content


def test_template_fuse_with_the_registered_swapper(
        server: ServerProcess, client: httpx.Client, photos: dict[str, bytes],
        target_box: Box) -> None:
    with server.client(ADMIN_TOKEN) as admin:
        made = admin.post("/v1/templates", files={"image": ("t.jpg", photos["obama"])})
    assert made.status_code == 201, made.text
    route = f"/v1/templates/{made.json()['id']}/fuse"
    source = {"source": ("s.jpg", photos["biden"])}
    r = client.post(route, files=source, data={"swapper": TINY, "format": "png"})
    assert r.status_code == 200, r.text
    assert painted(decode_image(r.content), target_box)
    classic = client.post(route, files=source, data={"format": "png"})
    assert classic.headers["x-facefuse-cache"] == "miss"
    assert not painted(decode_image(classic.content), target_box)
    assert TINY in _unknown(client.post(route, files=source, data={"swapper": "nope"}))


def test_an_unknown_swapper_is_422_at_fuse(client: httpx.Client,
                                           photos: dict[str, bytes]) -> None:
    message = _unknown(_fuse(client, photos, swapper="inswapper_128"))
    assert "'inswapper_128'" in message and "classic" in message and TINY in message
    assert _unknown(_fuse(client, photos, swapper=""))


# --- jobs ---------------------------------------------------------------------------------


@pytest.fixture
def job_stack(settings: Settings, tiny_dir: Path, redis_factory: Callable[..., Any],
              tmp_path: Path) -> Iterator[tuple[ServerProcess, WorkerProcess]]:
    """An API (default classic) and a worker whose own default is the tiny swapper,
    on one job queue."""
    queue = redis_factory("--maxmemory-policy", "noeviction")
    api = ServerProcess(settings.home, tmp_path, {
        "FACEFUSE_MODELS_DIR": str(tiny_dir), "FACEFUSE_JOBS_REDIS_URL": queue.url},
        name="swapper-jobs-api")
    worker = WorkerProcess(settings.home, tmp_path, queue.url, {
        "FACEFUSE_MODELS_DIR": str(tiny_dir), "FACEFUSE_SWAPPER": TINY},
        name="swapper-worker")
    api.start()
    try:
        worker.start()
        yield api, worker
    finally:
        worker.kill()
        api.kill()


def _first_frame(data: bytes) -> np.ndarray:
    with contextlib.closing(av.open(io.BytesIO(data), "r")) as c:
        frame = next(c.decode(c.streams.video[0]))
        return np.asarray(frame.to_ndarray(format="rgb24"))


@pytest.mark.slow
def test_jobs_carry_the_swapper_to_the_worker(
        job_stack: tuple[ServerProcess, WorkerProcess], photos: dict[str, bytes],
        sample_images: dict[str, np.ndarray], analyser: FaceAnalyser, target_box: Box,
        tmp_path: Path) -> None:
    api, _ = job_stack
    photo = sample_images["obama"]
    b = analyser.analyse(photo, embed=False)[0].bbox
    face = (float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2, float(b[2] - b[0]))
    frames = list(motion_frames(Scene(photo, 6, face, size=(480, 360), face_px=130)))
    clip = write_clip(tmp_path / "clip.mp4", frames).read_bytes()
    clip_box = middle_third(analyser.analyse(frames[0], embed=False)[0].bbox)
    source = ("s.jpg", photos["biden"])
    with api.client() as c:
        assert TINY in _unknown(c.post("/v1/jobs", files={
            "source": source, "clip": ("c.mp4", clip)}, data={"swapper": "nope"}))
        assert _unknown(c.post("/v1/jobs", files={
            "source": source, "target": ("t.jpg", photos["obama"])}, data={"swapper": "nope"}))
        named = c.post("/v1/jobs", files={"source": source, "clip": ("c.mp4", clip)},
                       data={"swapper": TINY})
        # Named by none: the API's default (classic), not the worker's own.
        unnamed = c.post("/v1/jobs", files={"source": source,
                                            "target": ("t.jpg", photos["obama"])},
                         data={"format": "png"})
        assert named.status_code == unnamed.status_code == 202, (named.text, unnamed.text)
        results = []
        for r in (named, unnamed):
            done = wait_state(c, r.headers["location"], {"succeeded", "failed"})
            assert done["status"] == "succeeded", done
            results.append(c.get(r.headers["location"] + "/result").content)
    assert painted(_first_frame(results[0]), clip_box, tol=12.0)
    assert not painted(decode_image(results[1]), target_box)


# --- the CLI ------------------------------------------------------------------------------


def _cli(settings: Settings, tiny_dir: Path, *args: str, swapper: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FACEFUSE_")}
    env.update({"FACEFUSE_HOME": str(settings.home), "FACEFUSE_THREADS": "1",
                "FACEFUSE_MODELS_DIR": str(tiny_dir)})
    if swapper is not None:
        env["FACEFUSE_SWAPPER"] = swapper
    return subprocess.run([sys.executable, "-m", "facefuse.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_cli_fuses_with_the_default_and_the_named_swapper(
        settings: Settings, tiny_dir: Path, sample_paths: dict[str, Path], tmp_path: Path,
        target_box: Box) -> None:
    pair = (str(sample_paths["biden"]), str(sample_paths["obama"]))
    default = _cli(settings, tiny_dir, "fuse", *pair, "-o", str(tmp_path / "d.png"),
                   swapper=TINY)
    assert default.returncode == 0, default.stderr
    assert painted(decode_image(tmp_path / "d.png"), target_box)
    classic = _cli(settings, tiny_dir, "fuse", *pair, "-o", str(tmp_path / "c.png"),
                   "--swapper", "classic", swapper=TINY)
    assert classic.returncode == 0, classic.stderr
    assert not painted(decode_image(tmp_path / "c.png"), target_box)


def test_cli_refuses_an_unknown_swapper_at_the_door(
        settings: Settings, tiny_dir: Path, sample_paths: dict[str, Path],
        tmp_path: Path) -> None:
    src, tgt = str(sample_paths["biden"]), str(sample_paths["obama"])
    runs = {
        "default": _cli(settings, tiny_dir, "fuse", src, tgt, "-o", str(tmp_path / "o.png"),
                        swapper="nope"),
        # A batch: one refusal, not a failure per target.
        "batch": _cli(settings, tiny_dir, "fuse", src, "--targets", tgt, "--out-dir",
                      str(tmp_path / "batch"), "--no-progress", "--swapper", "nope"),
        # A clip: before the clip is looked for.
        "video": _cli(settings, tiny_dir, "video", src, str(tmp_path / "absent.mp4"), "-o",
                      str(tmp_path / "o.mp4"), "--no-progress", "--swapper", "nope"),
    }
    for name, run in runs.items():
        assert run.returncode == 2, (name, run.stderr)
        assert "error[unknown_swapper]" in run.stderr and TINY in run.stderr, (name, run.stderr)
    assert "FACEFUSE_SWAPPER='nope'" in runs["default"].stderr
    assert not (tmp_path / "batch").exists() or not any((tmp_path / "batch").iterdir())
