"""Without PyAV (the API image ships no FFmpeg): video entry points raise a typed
``video_unavailable``, and the job route still queues a clip, leaving its header
checks to the worker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from video_clips import blank

from facefuse.errors import VideoTooLargeError, VideoUnavailableError
from facefuse.serving.routes.jobs import _probe_clip
from facefuse.video.codecs import encoder
from facefuse.video.io import VideoLimits, VideoWriter, probe


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return blank(tmp_path_factory.mktemp("noav") / "wall.mp4", 6)


@pytest.fixture
def no_av(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import av`` fails as it does where the package is not installed."""
    monkeypatch.setitem(sys.modules, "av", None)


def test_probe_without_av_is_typed(clip_path: Path, no_av: None) -> None:
    with pytest.raises(VideoUnavailableError) as exc:
        probe(clip_path)
    assert exc.value.code == "video_unavailable"
    assert exc.value.http_status == 501 and exc.value.exit_code == 5
    # The byte limit needs no codec and still comes first.
    with pytest.raises(VideoTooLargeError):
        probe(clip_path, VideoLimits(max_bytes=10))


def test_encoder_and_writer_without_av_are_typed(clip_path: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    info, enc = probe(clip_path), encoder("vp9")
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(VideoUnavailableError):
        encoder("vp9")
    with pytest.raises(VideoUnavailableError):
        VideoWriter(tmp_path / "out.mp4", info, enc, clip_path).__enter__()
    assert not list(tmp_path.iterdir())  # nothing written


def test_job_route_defers_the_header_to_the_worker(clip_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    data = clip_path.read_bytes()
    limits = VideoLimits(max_frames=3)
    with pytest.raises(VideoTooLargeError):  # with PyAV: the header is checked here
        _probe_clip(data, limits)
    info = _probe_clip(data, VideoLimits())
    assert info is not None and info.expected_frames == 6
    monkeypatch.setitem(sys.modules, "av", None)
    assert _probe_clip(data, limits) is None  # unknown: the worker probes it
    with pytest.raises(VideoTooLargeError):  # bytes are still refused before queueing
        _probe_clip(data, VideoLimits(max_bytes=len(data) - 1))
