"""Synthetic clips made from the sample photos, for tests and bench/video.py.

Every clip is real video written by PyAV (H.264 in MP4 unless asked otherwise):
a photo's face moved by smooth affine warps (head motion: drift, turn, nod as
in-plane rotation and scale), with optional scene cuts to another photo, a
second face entering and leaving, a lighting ramp, an audio track (a tone),
a display rotation (a phone held upright) and a variable frame rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import cv2
import numpy as np

__all__ = ["Scene", "motion_frames", "write_clip"]


@dataclass(frozen=True)
class Scene:
    """One shot: ``photo`` (RGB uint8) placed with its face about ``face_px`` wide
    on a ``size`` = (width, height) canvas, moving for ``frames`` frames.

    ``face`` = (centre x, centre y, width) of the photo's face in its own pixels
    (e.g. from its analysis), so the face, not the photo, is placed. ``guest``: a
    second photo (its face described by ``guest_face``) that slides in from the
    right edge and back out over the shot (a second face entering and leaving).
    ``light``: (start, end) gain of a brightness ramp over the shot.
    """

    photo: np.ndarray
    frames: int
    face: tuple[float, float, float]
    size: tuple[int, int] = (640, 480)
    face_px: float = 160.0
    guest: np.ndarray | None = None
    guest_face: tuple[float, float, float] = (0.0, 0.0, 1.0)
    light: tuple[float, float] = (1.0, 1.0)
    amplitude: float = 1.0
    background: tuple[int, int, int] = (70, 80, 90)


def _place(canvas: np.ndarray, photo: np.ndarray, anchor: tuple[float, float], scale: float,
           centre: tuple[float, float], angle_deg: float) -> None:
    """Warp ``photo`` (scaled, rotated about ``anchor``, its pixels) onto ``canvas``
    so that ``anchor`` lands at ``centre``."""
    h, w = photo.shape[:2]
    M = cv2.getRotationMatrix2D(anchor, angle_deg, scale)
    M[:, 2] += np.array(centre) - np.array(anchor)
    H, W = canvas.shape[:2]
    warped = cv2.warpAffine(photo, M, (W, H), flags=cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_CONSTANT, borderValue=(0, 0, 0))
    alpha = cv2.warpAffine(np.full((h, w), 255, np.uint8), M, (W, H), flags=cv2.INTER_LINEAR)
    a = (alpha.astype(np.float32) / 255.0)[..., None]
    canvas[:] = (canvas * (1.0 - a) + warped * a).astype(np.uint8)


def motion_frames(scene: Scene) -> Iterator[np.ndarray]:
    """The shot's frames, RGB uint8 (height, width, 3): the face drifts a few
    percent of the frame, turns in-plane by up to ±6° and breathes in scale by
    ±4 %, smoothly (sums of slow sines, so there is real motion every frame)."""
    W, H = scene.size
    base = scene.face_px / scene.face[2]
    for i in range(scene.frames):
        t = i / 25.0
        a = scene.amplitude
        canvas = np.empty((H, W, 3), np.uint8)
        canvas[:] = scene.background
        cx = W * (0.36 + 0.05 * a * math.sin(1.3 * t))
        cy = H * (0.5 + 0.03 * a * math.sin(0.9 * t + 1.0))
        angle = 6.0 * a * math.sin(0.8 * t)
        scale = base * (1.0 + 0.04 * a * math.sin(1.7 * t))
        _place(canvas, scene.photo, scene.face[:2], scale, (cx, cy), angle)
        if scene.guest is not None:
            # Slides in over the first half of the shot and back out over the second.
            phase = math.sin(math.pi * i / max(scene.frames - 1, 1))
            gx = W * (1.25 - 0.39 * phase)
            g = scene.guest_face
            _place(canvas, scene.guest, g[:2], scene.face_px * 0.7 / g[2], (gx, H * 0.45), 0.0)
        lo, hi = scene.light
        gain = lo + (hi - lo) * i / max(scene.frames - 1, 1)
        if gain != 1.0:
            canvas = np.clip(canvas.astype(np.float32) * gain, 0, 255).astype(np.uint8)
        yield canvas


def write_clip(path: Path, frames: Sequence[np.ndarray] | Iterator[np.ndarray], *,
               fps: int = 25, codec: str = "libx264", audio: bool = False,
               rotation: int = 0, times: Sequence[float] | None = None) -> Path:
    """Encode RGB frames (upright as shown) into ``path``.

    ``rotation``: a display rotation (counter-clockwise degrees): frames are stored
    turned back by it, so a player that honours the display matrix shows them
    upright (a phone clip). ``times``: presentation times in seconds per frame
    (a variable frame rate); default ``i / fps``. ``audio``: a 440 Hz mono AAC tone
    over the clip's length.
    """
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    tb = Fraction(1, 12800)
    out = av.open(str(path), "w")
    v: Any = None
    a: Any = None
    last = 0.0
    for i, rgb in enumerate(frames):
        turns = (rotation // 90) % 4
        coded = np.ascontiguousarray(np.rot90(rgb, -turns)) if turns else rgb
        if v is None:
            v = out.add_stream(codec, rate=fps, options={"preset": "ultrafast", "crf": "18"}
                               if codec == "libx264" else {})
            v.height, v.width = coded.shape[:2]
            v.pix_fmt = "yuv420p"
            v.time_base = tb
            v.codec_context.time_base = tb
            if rotation:
                v.set_display_rotation(rotation)
            if audio:
                a = out.add_stream("aac", rate=48000)
                a.layout = "mono"
        frame = av.VideoFrame.from_ndarray(coded, format="rgb24")
        last = times[i] if times is not None else i / fps
        frame.pts = round(last / tb)
        frame.time_base = tb
        for p in v.encode(frame):
            out.mux(p)
    if v is None:
        out.close()
        raise ValueError("no frames")
    if a is not None:
        samples = int(48000 * (last + 1.0 / fps))
        tone = (0.1 * np.sin(2 * np.pi * 440 * np.arange(samples) / 48000)).astype(np.float32)
        for k in range(0, samples, 1024):
            af = av.AudioFrame.from_ndarray(tone[None, k:k + 1024], format="fltp", layout="mono")
            af.sample_rate = 48000
            af.pts = k
            for p in a.encode(af):
                out.mux(p)
        for p in a.encode(None):
            out.mux(p)
    for p in v.encode(None):
        out.mux(p)
    out.close()
    return path
