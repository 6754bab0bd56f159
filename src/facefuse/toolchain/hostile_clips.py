"""Clips that lie, made with PyAV, for the tests of the video path's defences.

* :func:`swollen_clip`: a QuickTime clip of PNG frames whose header declares one
  size and whose frames are whatever sizes are asked for (a tiny file whose frames
  decode to hundreds of megabytes: zlib squeezes a plain 16000 x 16000 frame into
  about 750 KB). The PNGs are written a row at a time, so a huge frame never
  exists in the writer's memory.
* :func:`undated_clip`: a Matroska clip written as a live stream, whose header
  declares neither a duration nor a frame count.
* :func:`pcm_clip`: a Matroska clip with uncompressed PCM audio (which MP4 and
  WebM cannot hold as a copied stream).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np

__all__ = ["pcm_clip", "png_bytes", "swollen_clip", "undated_clip"]

#: Rows compressed at once while a plain PNG is written.
_ROWS = 256


def png_bytes(width: int, height: int, grey: int = 0) -> bytes:
    """A plain ``width`` x ``height`` RGB PNG of one grey level, written a band of
    rows at a time (its pixels are never all in memory)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    z = zlib.compressobj(9)
    band = (b"\x00" + bytes([grey]) * (3 * width)) * _ROWS
    parts = [z.compress(band) for _ in range(height // _ROWS)]
    parts.append(z.compress(band[: (height % _ROWS) * (1 + 3 * width)]))
    parts.append(z.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(parts))
            + chunk(b"IEND", b""))


def swollen_clip(path: Path, header: tuple[int, int], frames: Sequence[tuple[int, int]],
                 fps: int = 25) -> Path:
    """A ``.mov`` of PNG frames of the sizes ``frames`` (width, height) whose header
    says every frame is ``header`` (width, height)."""
    import av

    tb = Fraction(1, fps)
    with av.open(str(path), "w", format="mov") as out:
        v = out.add_stream("png", rate=fps)
        v.width, v.height = header
        v.pix_fmt = "rgb24"
        v.time_base = tb
        for i, (w, h) in enumerate(frames):
            packet = av.Packet(png_bytes(w, h, grey=40 + 10 * (i % 8)))
            packet.stream = v
            packet.pts = packet.dts = i
            packet.time_base = tb
            out.mux(packet)
    return path


def undated_clip(path: Path, frames: int, size: tuple[int, int] = (64, 48),
                 fps: int = 25) -> Path:
    """A ``.mkv`` of ``frames`` plain H.264 frames written as a live stream: no
    duration and no frame count in its header."""
    return _plain_mkv(path, frames, size, fps, {"live": "1"}, pcm=False)


def pcm_clip(path: Path, frames: int, size: tuple[int, int] = (64, 48), fps: int = 25
             ) -> Path:
    """A ``.mkv`` of ``frames`` plain H.264 frames and silent 16-bit PCM audio."""
    return _plain_mkv(path, frames, size, fps, {}, pcm=True)


def _plain_mkv(path: Path, frames: int, size: tuple[int, int], fps: int,
               options: dict[str, str], *, pcm: bool) -> Path:
    import av

    w, h = size
    rate = 8000
    with av.open(str(path), "w", format="matroska", container_options=options) as out:
        v = out.add_stream("libx264", rate=fps, options={"preset": "ultrafast"})
        v.width, v.height, v.pix_fmt = w, h, "yuv420p"
        a = out.add_stream("pcm_s16le", rate=rate) if pcm else None
        if a is not None:
            a.layout = "mono"
        for i in range(frames):
            rgb = np.full((h, w, 3), i % 256, np.uint8)
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            for p in v.encode(frame):
                out.mux(p)
            if a is not None:
                sound = av.AudioFrame.from_ndarray(np.zeros((1, rate // fps), np.int16),
                                                   format="s16", layout="mono")
                sound.sample_rate = rate
                sound.pts = i * (rate // fps)
                for p in a.encode(sound):
                    out.mux(p)
        for p in v.encode(None):
            out.mux(p)
        if a is not None:
            for p in a.encode(None):
                out.mux(p)
    return path
