"""Reading and writing clips with PyAV, keeping what the fusion does not change.

Security and fidelity spec, in order:

1. **Limits before decoding.** :func:`probe` opens the container, reads the header
   and refuses a clip over :class:`VideoLimits` (bytes, duration, frames, the
   longer side, frames per second) with a typed 413 before a frame of the clip is
   decoded. What FFmpeg decodes to fill in a header (its stream probe) is bounded
   to frames of :data:`PROBE_MAX_SIDE` squared pixels (a frame larger is refused
   by the decoder before it is allocated); a clip whose frame size cannot be read
   within that bound is ``video_resolution_too_high``. The probe then decodes the
   first frame only, bounded to the header's size, and counts the video packets
   (demuxed, not decoded) of a clip whose header declares no frame count, so a
   clip without a duration is measured, not taken for one frame. A file FFmpeg
   cannot open, or one without a video stream, is 400 ``corrupt_video`` /
   ``no_video_stream``.
2. **Bounded decoding.** The reader's decoder may allocate no frame larger than
   the header's size (FFmpeg's ``max_pixels``): a larger frame fails the clip
   (``corrupt_video``) before its pixels exist, a frame of another size after it
   is decoded, and more frames or seconds than the limits stop it
   (``video_too_long``): the header cannot be used to under-declare the work.
3. **Frames.** Every decoded frame is one output frame, with its own
   presentation time (variable frame rates survive), converted to RGB with the
   stream's own colour matrix and range and converted back with the same ones;
   the output is tagged with them. Frames are handed over upright (the display
   matrix's rotation to the nearest quarter turn applied, a mirror taken out of the
   rotation and left as stored) and turned back before encoding; the output
   carries the input's display matrix as it was stored (a mirror, an angle that
   is not a quarter turn), so players show it exactly as the input. A degenerate
   matrix (all zero) is no orientation: the frames are shown as stored.
   When the writer is told which regions of a frame changed (the fused faces)
   and the clip is 8-bit 4:2:0 without a quarter turn, only those regions are
   converted back: the rest of the frame is the decoded picture itself (no
   round trip through RGB, and a fraction of the conversion's cost).
4. **Audio** packets are copied into the output untouched, interleaved in the
   order they were read (never decoded).
5. **Atomic output.** :class:`VideoWriter` writes to a temporary file beside the
   destination and renames it into place only when the clip is complete; a
   failure or cancellation leaves no partial file.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from facefuse.config import Settings
from facefuse.errors import InvalidVideoError, VideoTooLargeError
from facefuse.video.codecs import Encoder, check_container, container_format, pyav

__all__ = ["AudioPacket", "Frame", "VideoInfo", "VideoLimits", "VideoReader", "VideoWriter",
           "probe"]

#: FFmpeg's AVColorSpace values that facefuse converts with (others: by frame height).
_BT709, _BT601 = 1, 6
#: FFmpeg's AVColorRange: unspecified (read as limited), limited (MPEG), full (JPEG).
_RANGE_MPEG, _RANGE_JPEG = 1, 2
#: Decoded layouts (8-bit 4:2:0 planes) the writer can reuse outside the changed regions.
_REUSABLE = frozenset({"yuv420p", "yuvj420p"})
#: The longest side (squared: pixels) of a frame FFmpeg may decode while it reads a
#: clip's header (its stream probe), when the limits' ``max_side`` is smaller: enough
#: for a 4K clip's header to be read and refused by size (25 MB a frame at most).
PROBE_MAX_SIDE = 4096
#: Pixels a decoder may add to a frame's declared size (coded sizes rounded up to
#: macroblocks, rows aligned for SIMD) under the reader's ``max_pixels`` bound.
_CODED_MARGIN = 64


@dataclass(frozen=True)
class VideoLimits:
    """Bounds on one clip (see :mod:`facefuse.config`, ``video_max_*``)."""

    max_bytes: int = 64 * 1024 * 1024
    max_duration_s: float = 300.0
    max_side: int = 1920
    max_fps: float = 60.0
    max_frames: int = 18_000

    @classmethod
    def from_settings(cls, s: Settings) -> VideoLimits:
        return cls(s.video_max_bytes, s.video_max_duration_s, s.video_max_side,
                   s.video_max_fps, s.video_max_frames)


@dataclass(frozen=True)
class VideoInfo:
    """What a clip's header says.

    Attributes:
        width, height: coded frame size, pixels (before the display rotation).
        rotation: the display matrix's counter-clockwise rotation, to the nearest
            quarter turn (halves up), degrees (0, 90, 180, 270), of its rotation part
            (a mirror taken out); frames are handed over turned by it (upright).
        fps: the average frame rate (frames per second, exact fraction).
        time_base: the video stream's time base, seconds per pts tick.
        frames: the frame count the header declares (0: unknown; then estimated
            from the duration).
        duration_s: the clip's duration, seconds.
        codec: the video codec's FFmpeg name.
        audio_codec: the first audio stream's codec name, None without audio.
        colorspace, color_range: FFmpeg's AVColorSpace / AVColorRange of the stream.
        size: bytes of the file.
        display_matrix: the first frame's display matrix as stored (FFmpeg's nine
            integers), which the output carries unchanged (a mirror, an angle that
            is not a quarter turn); None without one, or for a degenerate one
            (all zero: no orientation at all, shown as stored).
    """

    width: int
    height: int
    rotation: int
    fps: Fraction
    time_base: Fraction
    frames: int
    duration_s: float
    codec: str
    audio_codec: str | None
    colorspace: int
    color_range: int
    size: int
    display_matrix: tuple[int, ...] | None = None

    @property
    def upright_size(self) -> tuple[int, int]:
        """(width, height) of the frames as shown (after the rotation)."""
        return (self.height, self.width) if self.rotation % 180 else (self.width, self.height)

    @property
    def expected_frames(self) -> int:
        """The declared frame count, or one estimated from duration × rate."""
        return self.frames or max(1, round(self.duration_s * float(self.fps)))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (for job status and bench reports)."""
        return {"width": self.width, "height": self.height, "rotation": self.rotation,
                "fps": round(float(self.fps), 3), "frames": self.expected_frames,
                "duration_s": round(self.duration_s, 3), "codec": self.codec,
                "audio_codec": self.audio_codec}


@dataclass
class Frame:
    """One decoded frame: ``rgb`` upright RGB uint8 (H, W, 3); ``pts`` in the
    stream's time base (None: none stored); ``index`` from 0; ``time_s`` seconds;
    ``coded``: the decoded picture (a PyAV frame) when the writer can reuse its
    planes (8-bit 4:2:0, even size, no quarter turn), else None."""

    index: int
    pts: int | None
    time_s: float
    rgb: np.ndarray
    coded: Any = field(default=None, repr=False, compare=False)


@dataclass
class AudioPacket:
    """An audio packet, passed through to the writer untouched."""

    packet: Any


def _open(path: Path, max_pixels: int = PROBE_MAX_SIDE * PROBE_MAX_SIDE) -> Any:
    """``path`` opened for reading; FFmpeg's stream probe decodes no frame over
    ``max_pixels`` (for the streams the container declares before it)."""
    av = pyav()

    try:
        return av.open(str(path), "r", metadata_errors="ignore",
                       options={"max_pixels": str(max_pixels)})
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        raise InvalidVideoError(f"cannot read the clip: {exc}", code="corrupt_video") from None


def _probe_pixels(limits: VideoLimits) -> int:
    side = max(limits.max_side, PROBE_MAX_SIDE)
    return side * side


def decode_bound(stream: Any, width: int, height: int) -> None:
    """Bound ``stream``'s decoder to frames of ``width`` × ``height`` (and the coded
    margin): a larger frame is an error before its buffer is allocated. Call before
    its first decode."""
    stream.codec_context.options = {
        "max_pixels": str((width + _CODED_MARGIN) * (height + _CODED_MARGIN))}


def _first_frame(container: Any, stream: Any, info: VideoInfo
                 ) -> tuple[int, tuple[int, ...] | None]:
    """Decode the first frame (bounded to the header's size) and return its display
    rotation and matrix (see :func:`display`).

    Raises:
        InvalidVideoError: ``corrupt_video``: the first frame cannot be decoded
            within the header's size, or has another size.
    """
    av = pyav()

    decode_bound(stream, info.width, info.height)
    try:
        for frame in container.decode(stream):
            _check_frame_size(frame, 0, info)
            return display(frame)
    except av.error.FFmpegError as exc:
        raise InvalidVideoError(f"the first frame cannot be decoded within the header's "
                                f"{info.width}x{info.height}: {exc}",
                                code="corrupt_video") from None
    return 0, None


def display(frame: Any) -> tuple[int, tuple[int, ...] | None]:
    """(quarter turn, matrix) of a decoded frame's display matrix: the counter-
    clockwise rotation of the matrix with any mirror taken out, to the nearest
    quarter turn (halves up), degrees; and the nine integers as stored. (0, None)
    without a matrix or with a degenerate one (all zero)."""
    for side in frame.side_data:
        if getattr(side.type, "name", "") != "DISPLAYMATRIX":
            continue
        raw = bytes(side)
        if len(raw) != 36:
            return 0, None
        m = struct.unpack("=9i", raw)
        a, b, c, d = m[0], m[1], m[3], m[4]
        det = a * d - b * c
        if det == 0:
            return 0, None
        if det < 0:  # mirrored: the rotation is that of the matrix with its mirror undone
            a, c = -a, -c
        angle = -math.degrees(math.atan2(b, a))
        return (math.floor(angle / 90.0 + 0.5) % 4) * 90, m
    return 0, None


def _check_frame_size(frame: Any, index: int, info: VideoInfo) -> None:
    if frame.width != info.width or frame.height != info.height:
        raise InvalidVideoError(f"frame {index} is {frame.width}x{frame.height}, the header "
                                f"says {info.width}x{info.height}", code="corrupt_video")


def _count(path: Path, limits: VideoLimits) -> tuple[int, float]:
    """(video packets, seconds from the first to past the last) of ``path``'s first
    video stream, demuxed without decoding; the count stops past ``max_frames``."""
    av = pyav()

    with contextlib.closing(_open(path, _probe_pixels(limits))) as c:
        v = c.streams.video[0]
        tb = Fraction(v.time_base or Fraction(1, 90000))
        step = 1 / float(v.average_rate or v.guessed_rate or v.base_rate or 1)
        n, first, last = 0, math.inf, -math.inf
        try:
            for packet in c.demux(v):
                if packet.size == 0:  # the demuxer's end-of-stream packet
                    continue
                n += 1
                if packet.pts is not None:
                    t = float(packet.pts * tb)
                    first, last = min(first, t), max(last, t)
                if n > limits.max_frames:
                    break
        except av.error.FFmpegError:
            pass  # a truncated tail: counted up to it, the reader stops there too
    span = last - first + step if last >= first else n * step
    return n, span


def probe(path: Path, limits: VideoLimits | None = None) -> VideoInfo:
    """Read ``path``'s header (and its first frame's display matrix) and check it
    against ``limits``.

    Raises:
        InvalidVideoError: ``corrupt_video``, ``no_video_stream``, ``video_not_found``
            (no such file, or one that cannot be read).
        VideoTooLargeError: over a limit (``video_too_large``, ``video_too_long``,
            ``video_resolution_too_high``, ``video_fps_too_high``).
        VideoUnavailableError: no PyAV in this install (checked after the byte limit).
    """
    limits = limits or VideoLimits()
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise InvalidVideoError(f"clip file not found: {path}", code="video_not_found") from None
    except OSError as exc:
        raise InvalidVideoError(f"cannot read the clip {path}: {exc.strerror or exc}",
                                code="video_not_found") from None
    if size > limits.max_bytes:
        raise VideoTooLargeError(f"the clip is {size} bytes; the limit is {limits.max_bytes}",
                                 code="video_too_large")
    with contextlib.closing(_open(path, _probe_pixels(limits))) as c:
        if not c.streams.video:
            raise InvalidVideoError("the file has no video stream", code="no_video_stream")
        if c.format.name == "image2" or c.format.name.endswith("_pipe"):
            raise InvalidVideoError("the file is a still image, not a clip (send images as "
                                    "a target)", code="no_video_stream")
        v = c.streams.video[0]
        cc = v.codec_context
        fps = Fraction(v.average_rate or v.guessed_rate or v.base_rate or 0)
        tb = Fraction(v.time_base or Fraction(1, 90000))
        if v.duration is not None:
            duration = float(v.duration * tb)
        elif c.duration is not None:
            duration = c.duration / 1_000_000
        else:
            duration = 0.0
        audio = c.streams.audio[0].codec_context.name if c.streams.audio else None
        width, height = int(cc.width or 0), int(cc.height or 0)
        if width <= 0 or height <= 0:
            # FFmpeg's probe forgets the size of a frame it was not allowed to decode.
            side = max(limits.max_side, PROBE_MAX_SIDE)
            raise VideoTooLargeError(
                f"the clip's frame size cannot be read from frames of at most {side}x{side} "
                f"pixels; the longer side may be at most {limits.max_side}",
                code="video_resolution_too_high")
        if fps <= 0:
            raise InvalidVideoError("the video stream has no frame rate", code="corrupt_video")
        info = VideoInfo(width, height, 0, fps, tb, int(v.frames or 0), duration, cc.name,
                         audio, int(cc.colorspace or 0), int(cc.color_range or 0), size)
        _check_limits(info, limits)
        rotation, matrix = _first_frame(c, v, info)
    if not info.frames:
        # No count in the header (a live-written Matroska, a raw stream): count the
        # packets rather than trust a duration that may be missing.
        frames, span = _count(path, limits)
        info = VideoInfo(**{**info.__dict__, "frames": frames,
                            "duration_s": max(info.duration_s, span)})
        _check_limits(info, limits)
    return VideoInfo(**{**info.__dict__, "rotation": rotation, "display_matrix": matrix})


def _check_limits(info: VideoInfo, limits: VideoLimits) -> None:
    if max(info.width, info.height) > limits.max_side:
        raise VideoTooLargeError(
            f"the clip is {info.width}x{info.height}; the longer side may be at most "
            f"{limits.max_side}", code="video_resolution_too_high")
    if float(info.fps) > limits.max_fps + 1e-6:
        raise VideoTooLargeError(f"the clip runs at {float(info.fps):.2f} fps; the limit is "
                                 f"{limits.max_fps:g}", code="video_fps_too_high")
    if info.duration_s > limits.max_duration_s or info.expected_frames > limits.max_frames:
        raise VideoTooLargeError(
            f"the clip lasts {info.duration_s:.1f} s ({info.expected_frames} frames); the "
            f"limits are {limits.max_duration_s:g} s and {limits.max_frames} frames",
            code="video_too_long")


def conversion(info: VideoInfo) -> tuple[str, str]:
    """(colour matrix, range) names for PyAV's reformatter: the stream's own, or by
    frame height when unspecified (BT.709 from 720 lines up, else BT.601)."""
    if info.colorspace == _BT709:
        matrix = "ITU709"
    elif info.colorspace in (5, _BT601):
        matrix = "ITU601"
    else:
        matrix = "ITU709" if min(info.width, info.height) >= 720 else "ITU601"
    return matrix, ("JPEG" if info.color_range == _RANGE_JPEG else "MPEG")


class VideoReader:
    """Decodes a clip into upright RGB :class:`Frame` s and its audio into
    :class:`AudioPacket` s, in file order. One pass; iterate once."""

    def __init__(self, path: Path, info: VideoInfo, limits: VideoLimits | None = None) -> None:
        self.path = path
        self.info = info
        self.limits = limits or VideoLimits()

    def __iter__(self) -> Iterator[Frame | AudioPacket]:
        av = pyav()

        info = self.info
        limits = self.limits
        matrix, rng = conversion(info)
        turns = info.rotation // 90
        with contextlib.closing(_open(self.path, _probe_pixels(limits))) as c:
            v = c.streams.video[0]
            decode_bound(v, info.width, info.height)
            v.thread_type = "AUTO"
            streams = [v] + ([c.streams.audio[0]] if c.streams.audio else [])
            audio = streams[1] if len(streams) > 1 else None
            index = 0
            start = v.start_time or 0
            try:
                for packet in c.demux(*streams):
                    if audio is not None and packet.stream is audio:
                        if packet.dts is not None:
                            yield AudioPacket(packet)
                        continue
                    for frame in packet.decode():
                        _check_frame_size(frame, index, info)
                        pts = frame.pts
                        t = (float((pts - start) * info.time_base) if pts is not None
                             else index / float(info.fps))
                        if index >= limits.max_frames or t > limits.max_duration_s:
                            raise VideoTooLargeError(
                                f"the clip has more than {limits.max_frames} frames or lasts "
                                f"more than {limits.max_duration_s:g} s (frame {index} at "
                                f"{t:.1f} s)", code="video_too_long")
                        rgb = frame.reformat(format="rgb24", src_colorspace=matrix,
                                             src_color_range=rng).to_ndarray()
                        if turns:
                            rgb = np.ascontiguousarray(np.rot90(rgb, turns))
                        reusable = (not turns and frame.format.name in _REUSABLE
                                    and frame.width % 2 == 0 and frame.height % 2 == 0)
                        yield Frame(index, pts, t, rgb, frame if reusable else None)
                        index += 1
            except av.error.FFmpegError as exc:
                raise InvalidVideoError(f"frame {index} cannot be decoded within the header's "
                                        f"{info.width}x{info.height}: {exc}",
                                        code="corrupt_video") from None
            if index == 0:
                raise InvalidVideoError("the clip has no decodable frame", code="corrupt_video")


class VideoWriter:
    """Encodes upright RGB frames into ``dest`` with ``encoder``, copying the audio
    packets it is given; atomic (see the module docstring). Use as a context
    manager: leaving it with an exception discards the partial file."""

    def __init__(self, dest: Path, info: VideoInfo, encoder: Encoder,
                 source: Path, *, threads: int = 0) -> None:
        self.dest = dest
        self.info = info
        self.encoder = encoder
        check_container(dest.suffix, encoder, info.audio_codec)
        self._format = container_format(dest)
        self._source = source
        self._threads = threads
        self._tmp: Path | None = None
        self._out: Any = None
        self._video: Any = None
        self._audio: Any = None
        self._src: Any = None
        self._last_pts: int | None = None
        self.frames = 0

    def __enter__(self) -> VideoWriter:
        av = pyav()

        self.dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.dest.name}.", suffix=self.dest.suffix,
                                   dir=self.dest.parent)
        os.close(fd)
        self._tmp = Path(tmp)
        info = self.info
        out = av.open(str(self._tmp), "w", format=self._format)
        self._out = out
        v: Any = out.add_stream(self.encoder.codec, rate=info.fps,
                           options=dict(self.encoder.options))
        v.width, v.height = info.width, info.height
        v.pix_fmt = "yuv420p"
        v.time_base = info.time_base
        v.codec_context.time_base = info.time_base
        if self._threads:
            v.codec_context.thread_count = self._threads
        v.codec_context.color_range = (_RANGE_JPEG if info.color_range == _RANGE_JPEG
                                       else _RANGE_MPEG)
        v.codec_context.colorspace = _BT709 if conversion(info)[0] == "ITU709" else _BT601
        if info.display_matrix is not None:
            v.set_display_matrix(info.display_matrix)
        elif info.rotation:
            v.set_display_rotation(info.rotation)
        self._video = v
        if info.audio_codec is not None:
            # The source's audio stream parameters, copied (its packets come from the reader).
            self._src = _open(self._source)
            self._audio = out.add_stream_from_template(self._src.streams.audio[0])
        return self

    def write(self, frame: Frame, rgb: np.ndarray,
              changed: Sequence[tuple[int, int, int, int]] | None = None) -> None:
        """Encode ``rgb`` (upright RGB uint8, the frame's size) at ``frame``'s time.

        ``changed``: the boxes (x0, y0, x1, y1) outside which ``rgb`` is
        ``frame.rgb`` (None: anywhere); with them, and a reusable decoded picture,
        only they are converted (see the module docstring)."""
        av = pyav()

        turns = self.info.rotation // 90
        matrix, rng = conversion(self.info)
        if changed is not None and frame.coded is not None and not turns:
            vf = patched_picture(frame.coded, rgb, changed, matrix, rng)
        else:
            coded = np.ascontiguousarray(np.rot90(rgb, -turns)) if turns else rgb
            vf = av.VideoFrame.from_ndarray(coded, format="rgb24").reformat(
                format="yuv420p", dst_colorspace=matrix, dst_color_range=rng)
        pts = frame.pts
        if pts is None:
            pts = round(frame.index / float(self.info.fps) / float(self.info.time_base))
        if self._last_pts is not None and pts <= self._last_pts:
            pts = self._last_pts + 1  # encoders need strictly increasing times
        self._last_pts = pts
        vf.pts = pts
        vf.time_base = self.info.time_base
        for p in self._video.encode(vf):
            self._out.mux(p)
        self.frames += 1

    def write_audio(self, item: AudioPacket) -> None:
        """Copy one audio packet into the output."""
        if self._audio is None:
            return
        packet = item.packet
        packet.stream = self._audio
        self._out.mux(packet)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        assert self._tmp is not None
        try:
            if exc_type is None:
                for p in self._video.encode(None):
                    self._out.mux(p)
            self._out.close()
        except BaseException:
            self._tmp.unlink(missing_ok=True)
            raise
        finally:
            if self._src is not None:
                self._src.close()
        if exc_type is None:
            os.replace(self._tmp, self.dest)
        else:
            self._tmp.unlink(missing_ok=True)


def picture_plane(frame: Any, i: int) -> np.ndarray:
    """A writable (h, w) uint8 view of plane ``i`` of a PyAV frame."""
    p = frame.planes[i]
    rows: np.ndarray = np.frombuffer(p, np.uint8)[:p.line_size * p.height]
    return rows.reshape(p.height, p.line_size)[:, :p.width]


def patched_picture(decoded: Any, rgb: np.ndarray, changed: Sequence[tuple[int, int, int, int]],
             matrix: str, rng: str) -> Any:
    """A yuv420p copy of the ``decoded`` picture (8-bit 4:2:0, even size) with each
    ``changed`` box (grown to even pixels) replaced by ``rgb`` converted with the
    stream's colour ``matrix`` and range ``rng``."""
    av = pyav()

    h, w = rgb.shape[:2]
    out = av.VideoFrame(w, h, "yuv420p")
    planes = [picture_plane(out, i) for i in range(3)]
    for i, dst in enumerate(planes):
        dst[...] = picture_plane(decoded, i)
    for bx0, by0, bx1, by1 in changed:
        x0, y0 = max(0, bx0) & ~1, max(0, by0) & ~1
        x1, y1 = min(w, bx1 + (bx1 & 1)), min(h, by1 + (by1 & 1))
        if x1 <= x0 or y1 <= y0:
            continue
        sub = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb[y0:y1, x0:x1]),
                                         format="rgb24").reformat(
            format="yuv420p", dst_colorspace=matrix, dst_color_range=rng)
        planes[0][y0:y1, x0:x1] = picture_plane(sub, 0)
        for i in (1, 2):
            planes[i][y0 // 2:y1 // 2, x0 // 2:x1 // 2] = picture_plane(sub, i)
    return out


def frame_count(path: Path) -> int:
    """Frames of ``path``'s first video stream, counted by decoding (tests, bench)."""
    with contextlib.closing(_open(path)) as c:
        return sum(1 for _ in c.decode(c.streams.video[0]))


def seconds(value: float) -> str:
    """``"1:05"``-style duration for progress lines."""
    if not math.isfinite(value) or value < 0:
        return "?"
    m, s = divmod(round(value), 60)
    return f"{m}:{s:02d}"
