"""Sample photos from pinned packages, cached under ``<FACEFUSE_HOME>/samples``.

Identities: ``obama``, ``obama2``, ``obama3`` (Barack Obama, three distinct
photos), ``biden`` (Joe Biden) from face_recognition 1.3.0's test images (MIT),
and ``astronaut`` (Eileen Collins, NASA, public domain) from scikit-image.
"""

from __future__ import annotations

from pathlib import Path

from facefuse.toolchain.sources import FACE_RECOGNITION_SDIST, SKIMAGE, PinnedDist, materialise

#: sample name -> (dist, member, file name, identity)
SAMPLES: dict[str, tuple[PinnedDist, str, str, str]] = {
    "obama": (FACE_RECOGNITION_SDIST, "face_recognition-1.3.0/tests/test_images/obama.jpg",
              "obama.jpg", "obama"),
    "obama2": (FACE_RECOGNITION_SDIST, "face_recognition-1.3.0/tests/test_images/obama2.jpg",
               "obama2.jpg", "obama"),
    "obama3": (FACE_RECOGNITION_SDIST, "face_recognition-1.3.0/tests/test_images/obama3.jpg",
               "obama3.jpg", "obama"),
    "biden": (FACE_RECOGNITION_SDIST, "face_recognition-1.3.0/tests/test_images/biden.jpg",
              "biden.jpg", "biden"),
    "astronaut": (SKIMAGE, "skimage/data/astronaut.png", "astronaut.png", "collins"),
}


def identity_of(sample: str) -> str:
    """The person shown in a sample photo."""
    return SAMPLES[sample][3]


def fetch_samples(samples_dir: Path, downloads_dir: Path) -> dict[str, Path]:
    """Fetch (if needed) and verify every sample photo; returns name -> path."""
    return {
        name: materialise(dist, member, samples_dir / filename, downloads_dir)
        for name, (dist, member, filename, _) in SAMPLES.items()
    }
