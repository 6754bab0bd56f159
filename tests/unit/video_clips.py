"""Clips for the video tests, made with PyAV from the sample photos (see
:mod:`facefuse.toolchain.clips`): each is written once per session."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from facefuse.faces.analyser import FaceAnalyser
from facefuse.toolchain.clips import Scene, motion_frames, write_clip

#: Canvas of the test clips (small: the machine is shared) and their face width.
SIZE = (480, 360)
FACE_PX = 130.0


def face_of(analyser: FaceAnalyser, photo: np.ndarray) -> tuple[float, float, float]:
    """(centre x, centre y, width) of the photo's largest face, its pixels."""
    b = analyser.analyse(photo, embed=False)[0].bbox
    return float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2, float(b[2] - b[0])


def scene(analyser: FaceAnalyser, photo: np.ndarray, frames: int, *,
          guest: np.ndarray | None = None, light: tuple[float, float] = (1.0, 1.0),
          amplitude: float = 1.0) -> Scene:
    return Scene(photo, frames, face_of(analyser, photo), size=SIZE, face_px=FACE_PX,
                 guest=guest, guest_face=face_of(analyser, guest) if guest is not None
                 else (0.0, 0.0, 1.0), light=light, amplitude=amplitude)


def clip(path: Path, scenes: Sequence[Scene], **kwargs: object) -> Path:
    """The scenes one after another (each boundary a cut) written to ``path``."""
    frames = [f for s in scenes for f in motion_frames(s)]
    return write_clip(path, frames, **kwargs)  # type: ignore[arg-type]


def blank(path: Path, frames: int, **kwargs: object) -> Path:
    """A clip of a plain grey-blue wall (no face)."""
    w, h = SIZE
    wall = np.empty((h, w, 3), np.uint8)
    wall[:] = (90, 100, 120)
    return write_clip(path, [wall] * frames, **kwargs)  # type: ignore[arg-type]
