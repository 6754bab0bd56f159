"""deploy/build-slim-opencv.py: the wheel it packs is one pip installs in place of the
PyPI OpenCV, and the check of the built module names what facefuse would miss."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import cv2
import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "build-slim-opencv.py"


@pytest.fixture(scope="module")
def slim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_slim_opencv", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(
        b"=").decode()


def test_the_packed_wheel_installs_and_satisfies_facefuses_requirement(
        slim: ModuleType, tmp_path: Path) -> None:
    module = tmp_path / "cv2.cpython-311-x86_64-linux-gnu.so"
    module.write_bytes(b"\x7fELF not really a module")
    licence = tmp_path / "LICENSE"
    licence.write_text("Apache License 2.0\n")
    tag = "cp311-cp311-linux_x86_64"
    wheel = tmp_path / f"opencv_python_headless-{slim.VERSION}+slim-{tag}.whl"
    slim.pack(module, licence, wheel, tag)

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = f"opencv_python_headless-{slim.VERSION}+slim.dist-info"
        rows = list(csv.reader(io.StringIO(z.read(f"{info}/RECORD").decode())))
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                continue
            data = z.read(name)
            assert digest == _hash(data) and int(size) == len(data), name
        assert {r[0] for r in rows} == set(names)
        assert {i.date_time for i in z.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        metadata = z.read(f"{info}/METADATA").decode()
    version = next(line.split(": ", 1)[1] for line in metadata.splitlines()
                   if line.startswith("Version: "))
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = next(Requirement(d) for d in deps if d.startswith("opencv-python-headless"))
    assert wanted.specifier.contains(version)
    # The same bytes again (podman's layer cache).
    again = tmp_path / "again.whl"
    slim.pack(module, licence, again, tag)
    assert again.read_bytes() == wheel.read_bytes()
    # pip accepts it as a wheel of this name and version.
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--no-index", "--platform", "linux_x86_64", "--only-binary=:all:",
                           "--python-version", "3.11", "--target", str(target), str(wheel)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (target / module.name).read_bytes() == module.read_bytes()


def test_the_names_facefuse_uses_are_found_and_real(slim: ModuleType) -> None:
    names = slim.used_names()
    assert {"remap", "GaussianBlur", "seamlessClone", "INTER_AREA", "setNumThreads"} <= set(names)
    assert [n for n in names if not hasattr(cv2, n)] == []


def test_a_module_missing_a_used_name_is_refused(slim: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "cv2.py").write_text("remap = None\n")
    with pytest.raises(SystemExit, match="seamlessClone"):
        slim.check_module(tmp_path)
    (tmp_path / "cv2.py").write_text("def __getattr__(name):\n    return None\n")
    slim.check_module(tmp_path)
