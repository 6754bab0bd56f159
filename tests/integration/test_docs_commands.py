"""Every shell and Python example of README.md and docs/ runs as written.

The examples (found and classified by :mod:`doc_commands`) run in document order, in
one folder holding the files they name, made from the real sample photos (``me.jpg``,
``poster.jpg``, a group of three people as ``group.jpg``, ...), with ``.venv``,
``deploy/`` and ``scripts/`` linked in as a checkout has them; the CLI's model
directory is a copy, so ``models build`` and friends cannot touch the shared one.
Those that need the API get a live server (``facefuse serve`` on a free loopback
port; the example's ``localhost:8000`` is pointed at it). Each runs under
``bash -euo pipefail``; then every image or JSON file it wrote must decode, so a
``curl -s -o out.jpg`` that saved an error body fails here even though curl exits 0.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from doc_commands import ROOT, Example, examples
from server_harness import ADMIN_TOKEN, GRACEFUL_EXIT, USER_TOKEN, ServerProcess, free_port

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.imaging.decode import decode_image
from facefuse.imaging.encode import encode_image

EXAMPLES = examples()
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp"}
#: The face mapping examples' rectangle, target pixels of group.jpg.
MAPPING_BOX = (410, 80, 560, 260)
#: Where each file an example names comes from (sample photo names).
PHOTOS = {"me.jpg": "obama", "poster.jpg": "biden", "alice.jpg": "obama2", "bob.jpg": "biden",
          "photo.jpg": "obama3", "source.jpg": "obama", "target.jpg": "biden",
          "posters/biden.jpg": "biden", "posters/obama3.jpg": "obama3",
          "more/astronaut.png": "astronaut", "them.jpg": "biden",
          "a.jpg": "obama", "b.jpg": "obama2"}


def test_every_example_is_classified() -> None:
    kinds = {e.kind for e in EXAMPLES}
    assert {"local", "server", "keys", "serve", "skip"} <= kinds
    assert len([e for e in EXAMPLES if e.kind not in ("skip", "slow")]) >= 12
    for e in EXAMPLES:
        assert e.code.strip(), e.id
        if e.kind == "skip":
            assert len(e.reason) > 10, e.id


@pytest.fixture(scope="module")
def doc_home(settings: Settings, model_dir: Path, sample_paths: dict[str, Path],
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A FACEFUSE_HOME for the CLI examples: the models copied, the rest linked."""
    home = tmp_path_factory.mktemp("doc-home")
    shutil.copytree(model_dir, home / "models")
    for name in ("samples", "downloads", "sources"):
        if (settings.home / name).exists():
            (home / name).symlink_to(settings.home / name)
    return home


@pytest.fixture(scope="module")
def workdir(sample_paths: dict[str, Path], sample_images: dict[str, np.ndarray],
            analyser: FaceAnalyser, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the examples run in: the files they name, and a checkout's links."""
    from facefuse.toolchain.detection_sets import lineup

    work = tmp_path_factory.mktemp("doc-examples")
    for name, sample in PHOTOS.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sample_paths[sample], work / name)
    # three people, face sizes chosen so the examples' mapping is meaningful: face 2
    # exists and the rectangle covers another one (face 0)
    group = lineup(sample_images, (("obama2", 110.0), ("biden", 130.0), ("obama3", 120.0)),
                   height=380).image
    (work / "group.jpg").write_bytes(encode_image(group, "jpeg", 92))
    # a short clip of two people (the video examples: one track each)
    from facefuse.toolchain.clips import Scene, motion_frames, write_clip

    def face(photo: np.ndarray) -> tuple[float, float, float]:
        b = analyser.analyse(photo, embed=False)[0].bbox
        return float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2, float(b[2] - b[0])

    host, guest = sample_images["biden"], sample_images["obama3"]
    write_clip(work / "clip.mp4", motion_frames(Scene(
        host, 12, face(host), size=(320, 240), face_px=90.0, guest=guest,
        guest_face=face(guest))), fps=12)
    (work / ".venv").symlink_to(Path(sys.prefix))
    for name in ("deploy", "scripts"):
        (work / name).symlink_to(ROOT / name)
    return work


def _server(settings: Settings, tmp: pytest.TempPathFactory, name: str,
            env: dict[str, str]) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp.mktemp(name), {
        "FACEFUSE_TEMPLATES_DIR": str(tmp.mktemp(f"{name}-templates")), **env}, name=name)
    proc.start()
    yield proc
    assert proc.stop() in GRACEFUL_EXIT, proc.log_tail()


@pytest.fixture(scope="module")
def open_server(settings: Settings, model_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The server of a laptop: no keys, admin routes open."""
    yield from _server(settings, tmp_path_factory, "docs-open", {"FACEFUSE_ADMIN_OPEN": "true"})


@pytest.fixture(scope="module")
def keyed_server(settings: Settings, model_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from _server(settings, tmp_path_factory, "docs-keys", {
        "FACEFUSE_API_KEYS": f"docs:{USER_TOKEN}", "FACEFUSE_ADMIN_KEYS": f"ops:{ADMIN_TOKEN}"})


def test_the_group_photo_fits_the_mapping_examples(workdir: Path,
                                                   open_server: ServerProcess) -> None:
    """The setup, not the docs: without it the mapping examples would prove little."""
    with open_server.client() as c:
        faces = c.post("/v1/faces", files={"image": (
            "group.jpg", (workdir / "group.jpg").read_bytes())}).json()["faces"]
    assert len(faces) == 3
    x0, y0, x1, y1 = MAPPING_BOX
    centres = [((f["bbox"][0] + f["bbox"][2]) / 2, (f["bbox"][1] + f["bbox"][3]) / 2)
               for f in faces]
    inside = [i for i, (cx, cy) in enumerate(centres) if x0 <= cx <= x1 and y0 <= cy <= y1]
    assert inside == [0]


def _files(root: Path) -> dict[Path, tuple[int, int]]:
    """Regular files under ``root`` (not through its links): path -> (mtime, size)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
        for f in filenames:
            p = Path(dirpath) / f
            if not p.is_symlink():
                st = p.stat()
                found[p] = (st.st_mtime_ns, st.st_size)
    return found


def _check_outputs(before: dict[Path, tuple[int, int]], after: dict[Path, tuple[int, int]],
                   where: str) -> None:
    for path, stamp in after.items():
        if before.get(path) == stamp:
            continue
        if path.suffix.lower() in IMAGE_SUFFIXES:
            try:
                decode_image(path.read_bytes())
            except Exception as exc:
                head = path.read_bytes()[:300]
                raise AssertionError(f"{where} wrote {path.name}, not an image ({exc}): "
                                     f"{head!r}") from None
        elif path.suffix == ".json":
            json.loads(path.read_text())


def _pointed(code: str, port: int) -> str:
    """The example with its ``localhost:8000`` pointed at the test's server."""
    code = re.sub(r"^\s*make serve\b.*$", ":  # the test's server", code, flags=re.M)
    return re.sub(r"\b(localhost|127\.0\.0\.1):8000\b", rf"\g<1>:{port}", code)


def _env(doc_home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FACEFUSE_")}
    env.update({"FACEFUSE_HOME": str(doc_home), "FACEFUSE_THREADS": "1",
                "API_KEY": USER_TOKEN, "ADMIN_KEY": ADMIN_TOKEN})
    return env


def _run_serve(example: Example, cwd: Path, env: dict[str, str]) -> None:
    """Start the example's server on a free loopback port, see it ready, stop it."""
    port = free_port()
    code = re.sub(r"--host\s+\S+", "--host 127.0.0.1", example.code)
    code = re.sub(r"--port\s+\d+", f"--port {port}", code)
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", code], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        end = time.monotonic() + 180
        while True:
            assert proc.poll() is None, (example.id, proc.communicate()[0][-3000:])
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < end, f"{example.id}: not ready after 180 s"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the group this test started
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example_runs_as_written(example: Example, workdir: Path, doc_home: Path,
                                 request: pytest.FixtureRequest) -> None:
    if example.kind == "skip":
        pytest.skip(example.reason)
    if example.kind == "slow" and os.environ.get("FACEFUSE_DOCTEST_SLOW") != "1":
        pytest.skip("minutes of CPU: FACEFUSE_DOCTEST_SLOW=1 runs it")
    for tool in ("curl", "jq", "exiftool", "kubectl"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: run scripts/install-system-deps.sh")
    env = _env(doc_home)
    if example.kind == "serve":
        _run_serve(example, workdir, env)
        return
    code = example.code
    if example.kind in ("server", "keys"):
        server = request.getfixturevalue("open_server" if example.kind == "server"
                                         else "keyed_server")
        code = _pointed(code, server.port)
    argv = (["bash", "-euo", "pipefail", "-c", code] if example.language == "shell"
            else [sys.executable, "-c", code])
    before = _files(workdir)
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=3600 if example.kind == "slow" else 600)
    assert proc.returncode == 0, (f"{example.id} exited {proc.returncode}:\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    _check_outputs(before, _files(workdir), example.id)
