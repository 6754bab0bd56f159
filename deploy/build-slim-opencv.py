"""Build OpenCV with only the modules facefuse calls, as a wheel for the images.

The PyPI wheel (opencv-python-headless) is 152 MiB of the API image: its ``cv2`` holds
every module (dnn, video, calib, features, objdetect, ...) and it grafts FFmpeg,
OpenBLAS, libaom and libvpx in ``opencv_python_headless.libs``. facefuse calls only
``core``, ``imgproc`` and ``photo`` (``seamlessClone``); this builds those (and what
they need: ``geometry`` and ``flann``) from the same release's source distribution,
statically linked into one ``cv2`` extension module without FFmpeg, BLAS, image
codecs or downloads, and packs it as ``opencv-python-headless <version>+slim``, which
satisfies facefuse's requirement, so the image installs it in place of the PyPI wheel.

The source is the PyPI sdist of the release pyproject.toml pins (pinned here by sha256;
the interpreter's own OpenCV must be that release, so the image runs the OpenCV the
tests ran), downloaded straight from PyPI's file host (not through pip's index
settings), cached with the wheel in ``FACEFUSE_HOME/slim-opencv``: a second run with
the same FACEFUSE_HOME prints the cached wheel and exits. The compiled module is not
byte-reproducible (it holds its build folder's path and time), so a new FACEFUSE_HOME
(as each CI run has) compiles again and rebuilds the image layers after it.

Differences from the PyPI build: no Intel IPP (its binaries are fetched from GitHub at
configure time); and on x86-64 the code is compiled once, for AVX2 (x86-64-v3: every
x86 server CPU since 2013-2015), where the PyPI wheel compiles SSE3 code plus copies
for five newer levels chosen at run time. With precompiled headers that keeps the
compile to about 9 minutes on two cores (910 s of CPU); on a CPU without AVX2
``import cv2`` fails with OpenCV's own message (build with ``SLIM_OPENCV=0`` for such
hosts). BENCHMARKS.md has the speed and the
pixel differences against the PyPI wheel.

Before packing, the built module is imported and every ``cv2.<name>`` that
``src/facefuse`` uses is looked up in it: a call into a module the build left out
fails here, not in production.

    .venv/bin/python deploy/build-slim-opencv.py [--home DIR] [--jobs N]

Needs cmake, make and a C++ compiler (scripts/install-system-deps.sh). Prints the
wheel's path on stdout.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata
import io
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import urllib.request
import zipfile
from pathlib import Path

from facefuse.runtime.files import sha256_file

ROOT = Path(__file__).resolve().parent.parent
DIST = "opencv-python-headless"
VERSION = "5.0.0.93"
SDIST = f"opencv_python_headless-{VERSION}.tar.gz"
URL = ("https://files.pythonhosted.org/packages/1d/99/"
       "76b7c80252aa83c1af16393454aafd125a0287101afe8deb0a6821af0e30/" + SDIST)
SHA256 = "b82f9831daab90b725c7c1ee1b36cb5732c367096ac76d119e64e14eb70d5f3c"
#: The modules to build (their dependencies, geometry and flann, come with them) and the
#: Python bindings.
MODULES = ("core", "imgproc", "photo", "python3", "python_bindings_generator")
#: Everything else off: no third-party library, no download, no test or app. Precompiled
#: headers (off by default for GCC) halve the compile: each of OpenCV's ~230 sources
#: otherwise parses its module's whole header tree again (opencv_core alone, one job:
#: 436 → 208 s of CPU).
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DENABLE_PRECOMPILED_HEADERS=ON",
    "-DOPENCV_SKIP_PYTHON_LOADER=ON", "-DCV_TRACE=OFF", "-DOPENCV_GENERATE_PKGCONFIG=OFF",
    *(f"-DWITH_{name}=OFF" for name in (
        "IPP", "LAPACK", "EIGEN", "OPENCL", "FFMPEG", "GTK", "QT", "TBB", "OPENMP", "ITT",
        "PROTOBUF", "JPEG", "PNG", "TIFF", "WEBP", "OPENJPEG", "JASPER", "OPENEXR",
        "IMGCODEC_HDR", "V4L", "GSTREAMER", "VA", "VA_INTEL", "FASTCV", "KLEIDICV",
        "CAROTENE", "OBSENSOR", "ADE", "1394", "VTK", "CUDA", "AVIF", "SPNG", "UNIFONT",
        "MLAS")),
    *(f"-DBUILD_{name}=OFF" for name in (
        "TESTS", "PERF_TESTS", "EXAMPLES", "DOCS", "opencv_apps", "JAVA")),
)


#: SIMD on x86-64: AVX2 (x86-64-v3) as the baseline, no runtime-dispatched copies.
X86_64_CPU = ("-DCPU_BASELINE=AVX2", "-DCPU_DISPATCH=")


def log(message: str) -> None:
    print(f"build-slim-opencv: {message}", file=sys.stderr, flush=True)


def fetch_sdist(folder: Path) -> Path:
    """The pinned source distribution, downloaded once and verified every time."""
    path = folder / SDIST
    if not (path.exists() and sha256_file(path) == SHA256):
        folder.mkdir(parents=True, exist_ok=True)
        log(f"downloading {URL}")
        part = path.with_suffix(".part")
        with urllib.request.urlopen(URL, timeout=600) as r, part.open("wb") as f:
            shutil.copyfileobj(r, f)
        if sha256_file(part) != SHA256:
            part.unlink()
            raise SystemExit(f"build-slim-opencv: {SDIST} does not match its pinned sha256")
        part.replace(path)
    return path


def used_names() -> list[str]:
    """Every ``cv2.<name>`` that facefuse's source uses, sorted."""
    names: set[str] = set()
    for py in (ROOT / "src" / "facefuse").rglob("*.py"):
        names.update(re.findall(r"\bcv2\.([A-Za-z_][A-Za-z0-9_]*)", py.read_text()))
    return sorted(names)


def check_module(folder: Path) -> None:
    """Import the built ``cv2`` from ``folder`` in a fresh interpreter and look up every
    name facefuse uses; exit with the missing ones."""
    code = ("import cv2, sys\n"
            "missing = [n for n in sys.argv[1:] if not hasattr(cv2, n)]\n"
            "print(' '.join(missing)); sys.exit(1 if missing else 0)")
    env = {**os.environ, "PYTHONPATH": str(folder)}
    proc = subprocess.run([sys.executable, "-c", code, *used_names()], env=env,
                          capture_output=True, text=True, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise SystemExit("build-slim-opencv: the built cv2 lacks what facefuse uses: "
                         f"{proc.stdout.strip() or proc.stderr.strip()}")


def build(sdist: Path, work: Path, jobs: int) -> Path:
    """Configure and compile; returns the built ``cv2`` extension module."""
    log(f"extracting {sdist.name}")
    with tarfile.open(sdist) as tar:
        top = f"opencv_python_headless-{VERSION}/"
        members = [m for m in tar.getmembers() if m.name.startswith(top + "opencv/")]
        # (The "data" filter exists from Python 3.11.4; Debian bookworm has 3.11.2.)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(work, members=members, filter="data")
        else:  # (the archive is pinned by sha256)
            tar.extractall(work, members=members)
    src = work / top / "opencv"
    paths = sysconfig.get_paths()
    library = Path(sysconfig.get_config_var("LIBDIR") or "") / str(
        sysconfig.get_config_var("LDLIBRARY") or "")
    import numpy  # the headers the bindings compile against

    out = work / "build"
    configure = ["cmake", "-S", str(src), "-B", str(out), "-G", "Unix Makefiles",
                 f"-DBUILD_LIST={','.join(MODULES)}", *CMAKE_OPTIONS,
                 *(X86_64_CPU if platform.machine() == "x86_64" else ()),
                 f"-DPYTHON3_EXECUTABLE={sys.executable}",
                 f"-DPYTHON3_INCLUDE_DIR={paths['include']}",
                 f"-DPYTHON3_LIBRARY={library}",
                 f"-DPYTHON3_NUMPY_INCLUDE_DIRS={numpy.get_include()}"]
    log("configuring (cmake)")
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    log(f"compiling with {jobs} jobs (about 9 minutes on two cores)")
    subprocess.run(["cmake", "--build", str(out), "--target", "opencv_python3",
                    "--", f"-j{jobs}"], check=True, stdout=subprocess.DEVNULL)
    found = sorted((out / "lib").rglob("cv2*.so"))
    if len(found) != 1:
        raise SystemExit(f"build-slim-opencv: expected one cv2 module, found {found}")
    return found[0]


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def pack(module: Path, licence: Path, wheel: Path, tag: str) -> None:
    """Write the wheel (fixed timestamps: the same module gives the same bytes)."""
    info = f"opencv_python_headless-{VERSION}+slim.dist-info"
    metadata = "\n".join([
        "Metadata-Version: 2.1", f"Name: {DIST}", f"Version: {VERSION}+slim",
        "Summary: OpenCV core, imgproc and photo only, built for facefuse's images",
        "License: Apache-2.0", "Requires-Python: >=3.11", "Requires-Dist: numpy>=2", "", ""])
    files = {
        module.name: module.read_bytes(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": (f"Wheel-Version: 1.0\nGenerator: facefuse build-slim-opencv\n"
                          f"Root-Is-Purelib: false\nTag: {tag}\n\n").encode(),
        f"{info}/top_level.txt": b"cv2\n",
        f"{info}/LICENSE.txt": licence.read_bytes(),
    }
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in files.items():
        writer.writerow([name, record_hash(data), len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue().encode()
    part = wheel.with_suffix(".part")
    with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            entry.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, data)
    part.replace(wheel)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, default=Path(os.environ.get(
        "FACEFUSE_HOME", Path.home() / ".cache" / "facefuse")))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    # Stopped (CI's trap sends SIGTERM): exit through the clean-up of the build folder.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    have = importlib.metadata.version(DIST)
    if have.split("+")[0] != VERSION:
        raise SystemExit(f"build-slim-opencv: this interpreter has {DIST} {have}, the pin is "
                         f"{VERSION}: update VERSION, URL and SHA256 to the installed release")
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    tag = f"{py}-{py}-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"
    # Apart from FACEFUSE_HOME/downloads, which the image's build context copies.
    wheels = args.home / "slim-opencv"
    wheel = wheels / f"opencv_python_headless-{VERSION}+slim-{tag}.whl"
    if not wheel.exists():
        sdist = fetch_sdist(wheels)
        with tempfile.TemporaryDirectory(prefix="slim-opencv-") as tmp:
            module = build(sdist, Path(tmp), args.jobs)
            check_module(module.parent)
            wheels.mkdir(parents=True, exist_ok=True)
            pack(module, Path(tmp) / f"opencv_python_headless-{VERSION}" / "opencv" / "LICENSE",
                 wheel, tag)
        log(f"built {wheel.name} ({wheel.stat().st_size / 2**20:.1f} MiB)")
    print(wheel)


if __name__ == "__main__":
    main()
