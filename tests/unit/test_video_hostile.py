"""Clips that lie about themselves (made in the test with PyAV): the probe and the
reader refuse them typed, without decoding a frame larger than the header says or
the limits allow, and a failed clip leaves nothing alive behind it.

Peak memory is read from ``/proc/self/status`` (``VmHWM``, reset through
``/proc/self/clear_refs``): a bound on what a refusal allocates, not a speed.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from facefuse.errors import InvalidVideoError, VideoTooLargeError
from facefuse.toolchain.hostile_clips import swollen_clip, undated_clip
from facefuse.video.codecs import encoder
from facefuse.video.fuser import _Pipe
from facefuse.video.io import Frame, VideoLimits, VideoReader, VideoWriter, display, probe

#: What a refused hostile clip may add to the peak resident memory, MB (a 16000 x
#: 16000 frame decoded is 732 MB).
PEAK_GROWTH_MB = 100


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)


def _reset_peak() -> float:
    """Reset the peak resident memory to the current one (Linux); returns it, MB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mb("VmHWM")


def _indices(reader: VideoReader, into: list[int]) -> None:
    """Read every frame, noting each index in ``into`` as it comes."""
    for item in reader:
        assert isinstance(item, Frame)
        into.append(item.index)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile")
    return {
        # One 16000x16000 frame, and a header that says so (a 750 KB file).
        "huge": swollen_clip(d / "huge.mov", (16000, 16000), [(16000, 16000)]),
        # A header of 640x480 and frames that grow to 16000x16000 after three.
        "swollen": swollen_clip(d / "swollen.mov", (640, 480),
                                [(640, 480)] * 3 + [(16000, 16000)] * 3),
        # A header of 640x480, and a smaller frame.
        "shrunk": swollen_clip(d / "shrunk.mov", (640, 480), [(640, 480), (320, 240)]),
        "undated": undated_clip(d / "undated.mkv", 60),
    }


def test_a_huge_header_is_refused_without_decoding_its_frame(hostile: dict[str, Path]
                                                             ) -> None:
    before = _reset_peak()
    with pytest.raises(VideoTooLargeError) as err:
        probe(hostile["huge"])
    assert err.value.code == "video_resolution_too_high" and err.value.http_status == 413
    assert _status_mb("VmHWM") - before < PEAK_GROWTH_MB


def test_a_frame_larger_than_the_header_fails_before_it_is_decoded(
        hostile: dict[str, Path]) -> None:
    info = probe(hostile["swollen"])
    assert (info.width, info.height, info.frames) == (640, 480, 6)
    before = _reset_peak()
    got: list[int] = []
    with pytest.raises(InvalidVideoError) as err:
        _indices(VideoReader(hostile["swollen"], info), got)
    assert err.value.code == "corrupt_video" and "frame 3" in err.value.message
    assert got == [0, 1, 2]
    assert _status_mb("VmHWM") - before < PEAK_GROWTH_MB


def test_a_frame_of_another_size_is_corrupt(hostile: dict[str, Path]) -> None:
    info = probe(hostile["shrunk"])
    with pytest.raises(InvalidVideoError) as err:
        list(VideoReader(hostile["shrunk"], info))
    assert err.value.code == "corrupt_video" and "320x240" in err.value.message


def test_a_clip_without_a_duration_is_counted(hostile: dict[str, Path]) -> None:
    info = probe(hostile["undated"])
    assert info.frames == info.expected_frames == 60
    assert info.duration_s == pytest.approx(60 / 25, abs=0.05)
    with pytest.raises(VideoTooLargeError) as err:
        probe(hostile["undated"], VideoLimits(max_duration_s=1.0))
    assert err.value.code == "video_too_long"
    with pytest.raises(VideoTooLargeError) as err:
        probe(hostile["undated"], VideoLimits(max_frames=59))
    assert err.value.code == "video_too_long"


def test_the_reader_stops_at_the_duration_limit(hostile: dict[str, Path]) -> None:
    """A header that under-declares the clip (as one without a duration did) is
    caught while decoding, at the limit, not at the end of the clip."""
    info = probe(hostile["undated"])
    short = VideoLimits(max_duration_s=1.0)
    seen: list[int] = []
    with pytest.raises(VideoTooLargeError) as err:
        _indices(VideoReader(hostile["undated"], info, short), seen)
    assert err.value.code == "video_too_long" and len(seen) <= 26


def test_a_failed_pipe_leaves_no_reference_cycle() -> None:
    """The decoder thread's error reaches the consumer without keeping the frames its
    traceback saw alive: they go as soon as the error is dropped, with the garbage
    collector off (a cycle would keep them until a collection: a worker held a
    window of huge frames that way)."""
    held: list[weakref.ref[np.ndarray]] = []

    def frames() -> Iterator[int]:
        big = np.zeros((256, 256, 3), np.uint8)
        held.append(weakref.ref(big))
        yield 0
        raise InvalidVideoError("frame 1 cannot be decoded", code="corrupt_video")

    gc.collect()
    gc.disable()
    try:
        pipe = _Pipe(frames(), 2, "decode")
        with pytest.raises(InvalidVideoError):
            list(pipe)
        pipe.stop()
        del pipe
        assert held and held[0]() is None
    finally:
        gc.enable()


def _oriented_clip(path: Path, orient: Callable[[Any], None]) -> Path:
    import av

    with av.open(str(path), "w") as out:
        v = out.add_stream("libx264", rate=25, options={"preset": "ultrafast"})
        v.width, v.height, v.pix_fmt = 64, 48, "yuv420p"
        orient(v)
        for i in range(3):
            rgb = np.zeros((48, 64, 3), np.uint8)
            rgb[:8, :16] = 255  # a mark in a corner: which way the frame lies
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = i
            for p in v.encode(frame):
                out.mux(p)
        for p in v.encode(None):
            out.mux(p)
    return path


def _first_display(path: Path) -> tuple[int, tuple[int, ...] | None]:
    import av

    with av.open(str(path)) as c:
        return display(next(c.decode(c.streams.video[0])))


@pytest.mark.parametrize(("name", "orient", "turn"), [
    ("mirror", lambda v: v.set_display_rotation(0, hflip=True), 0),
    ("mirror-90", lambda v: v.set_display_rotation(90, hflip=True), 90),
    ("turn-270", lambda v: v.set_display_rotation(270), 270),
    ("slant-45", lambda v: v.set_display_rotation(45), 90),
    ("slant-30", lambda v: v.set_display_rotation(30), 0),
    ("zero", lambda v: v.set_display_matrix([0] * 9), 0),
])
def test_the_display_matrix_is_carried_as_stored(tmp_path: Path, name: str,
                                                 orient: Callable[[Any], None],
                                                 turn: int) -> None:
    """Frames are handed over turned by the matrix's rotation to the nearest quarter
    turn (its mirror taken out), and the output carries the matrix as it was: a
    mirror is not a half turn, an angle between quarter turns is not dropped, a
    degenerate matrix is no turn at all."""
    src = _oriented_clip(tmp_path / f"{name}.mp4", orient)
    info = probe(src)
    assert info.rotation == turn
    stored = _first_display(src)[1]
    assert info.display_matrix == (None if name == "zero" else stored)
    out = tmp_path / f"out-{name}.mp4"
    with VideoWriter(out, info, encoder("x264"), src) as writer:
        for item in VideoReader(src, info):
            assert isinstance(item, Frame)
            assert item.rgb.shape[:2] == ((64, 48) if turn % 180 else (48, 64))
            writer.write(item, item.rgb)
    assert _first_display(out) == (turn, info.display_matrix)
