"""The live layer without a network: the offer checks, the frame loop's newest-frame
rule and its changes between frames, and the session registry's bounds and owners
(the WebRTC paths run against a real server in tests/integration/test_live.py)."""

from __future__ import annotations

import fractions
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from facefuse.errors import BadRequestError, InvalidOfferError, LiveSessionNotFoundError
from facefuse.live.loop import FrameLoop
from facefuse.live.sdp import check_offer, check_viewer_offer
from facefuse.live.sessions import LiveSources
from facefuse.video.processes import available as forkable_here

TIMEOUT = 30.0


def offer(*media: tuple[str, str, tuple[str, ...]]) -> str:
    """An SDP offer with ``(kind, direction, codecs)`` media sections."""
    lines = ["v=0", "o=- 1 1 IN IP4 0.0.0.0", "s=-", "t=0 0"]
    for i, (kind, direction, codecs) in enumerate(media):
        pts = " ".join(str(96 + j) for j in range(len(codecs)))
        lines += [f"m={kind} 9 UDP/TLS/RTP/SAVPF {pts}", "c=IN IP4 0.0.0.0", f"a=mid:{i}",
                  f"a={direction}"]
        lines += [f"a=rtpmap:{96 + j} {c}/90000" for j, c in enumerate(codecs)]
    return "\r\n".join(lines) + "\r\n"


def test_a_camera_offer_is_taken_and_its_direction_read() -> None:
    o = check_offer(offer(("audio", "sendrecv", ("opus",)), ("video", "sendrecv", ("VP8", "rtx"))))
    assert o.wants_video_back and o.has_audio
    whip = check_offer(offer(("video", "sendonly", ("H264",))).encode())
    assert not whip.wants_video_back and not whip.has_audio


@pytest.mark.parametrize(("sdp", "code"), [
    (offer(("audio", "sendrecv", ("opus",))), "offer_without_video"),
    (offer(("video", "recvonly", ("VP8",))), "offer_without_video"),
    (offer(("video", "sendrecv", ("AV1", "VP9", "rtx"))), "unsupported_codec"),
])
def test_offers_it_cannot_take_are_typed(sdp: str, code: str) -> None:
    with pytest.raises(InvalidOfferError) as err:
        check_offer(sdp)
    assert err.value.code == code and err.value.http_status == 422
    if code == "unsupported_codec":
        assert "av1, vp9" in err.value.message


@pytest.mark.parametrize("sdp", ["", "hello", "v=0\r\nnot a line\r\n", "x" * 70_000,
                                 b"v=0\r\n\xff\xfe"])
def test_malformed_offers_are_bad_requests(sdp: str | bytes) -> None:
    with pytest.raises(BadRequestError) as err:
        check_offer(sdp)
    assert err.value.code == "malformed_offer" and err.value.http_status == 400


def test_a_viewer_must_receive_video() -> None:
    check_viewer_offer(offer(("video", "recvonly", ("VP8",))))
    with pytest.raises(InvalidOfferError):
        check_viewer_offer(offer(("video", "sendonly", ("VP8",))))


# --- the frame loop --------------------------------------------------------------------


@dataclass
class FakeFrame:
    """What the loop reads of a PyAV frame."""

    n: int
    time: float | None = None
    pts: int | None = None
    time_base: Any = None

    def to_ndarray(self, format: str) -> np.ndarray:
        return np.full((8, 8, 3), self.n, np.uint8)


@dataclass
class Stats:
    regions: list[tuple[int, int, int, int]] = field(default_factory=list)
    fused: list[int] = field(default_factory=list)


class FakeClip:
    """A clip state whose first plan waits for ``gate``; records what it planned."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.planned: list[int] = []
        self.log: list[str] = []
        self.fail_on: int | None = None

    def plan(self, rgb: np.ndarray, index: int, t: float) -> Any:
        if not self.planned:
            self.entered.set()
            assert self.gate.wait(TIMEOUT)
        n = int(rgb[0, 0, 0])
        if n == self.fail_on:
            raise RuntimeError("a bad frame")
        self.planned.append(n)
        self.log.append(f"plan {n}")
        return rgb

    def render(self, plan: Any) -> list[Any]:
        return []

    def finish(self, plan: Any, layers: Any) -> tuple[np.ndarray, Stats]:
        return plan, Stats()


class Sink:
    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.cond = threading.Condition()

    def __call__(self, frame: Any, received: float) -> None:
        with self.cond:
            self.frames.append(frame)
            self.cond.notify_all()

    def wait(self, n: int) -> list[Any]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.frames) >= n, TIMEOUT)
            return list(self.frames)


def test_a_frame_not_taken_in_time_is_dropped_never_queued() -> None:
    clip, sink = FakeClip(), Sink()
    loop = FrameLoop(clip, sink, workers=1)  # type: ignore[arg-type]
    try:
        loop.offer(FakeFrame(1))
        assert clip.entered.wait(TIMEOUT)  # frame 1 taken, being planned
        for n in (2, 3, 4):  # 1 is being planned: 2 and 3 are replaced by newer ones
            loop.offer(FakeFrame(n))
        clip.gate.set()
        out = sink.wait(2)
        assert [f.n for f in out] == [1, 4]
        assert loop.figures.frames_in == 4 and loop.figures.frames_dropped == 2
        assert clip.planned == [1, 4]
    finally:
        loop.close()
    assert not loop.running


def test_changes_apply_between_frames_and_a_bad_frame_passes_through() -> None:
    clip, sink = FakeClip(), Sink()
    clip.gate.set()
    loop = FrameLoop(clip, sink, workers=2)  # type: ignore[arg-type]
    try:
        loop.offer(FakeFrame(1))
        sink.wait(1)
        loop.change(lambda _: clip.log.append("change"))
        clip.fail_on = 2
        loop.offer(FakeFrame(2))
        out = sink.wait(2)
        assert out[1].n == 2  # unfused, as it came
        loop.offer(FakeFrame(3))
        sink.wait(3)
        assert clip.log == ["plan 1", "change", "plan 3"]
        for _ in range(3):
            loop.sent(0.0)
        figures = loop.figures.to_dict()
        assert figures["frames_out"] == 3 and figures["latency_p50_ms"] is not None
    finally:
        loop.close()


class SlowRender(FakeClip):
    """A clip state whose renders take ``seconds``; records when each frame's plan began."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.gate.set()
        self.seconds = seconds
        self.began: dict[int, float] = {}

    def plan(self, rgb: np.ndarray, index: int, t: float) -> Any:
        self.began[int(rgb[0, 0, 0])] = time.monotonic()
        return super().plan(rgb, index, t)

    def render(self, plan: Any) -> list[Any]:
        time.sleep(self.seconds)
        return []


def test_with_two_in_flight_the_next_frame_is_taken_as_the_render_before_ends() -> None:
    """A frame is not taken the moment the one before starts rendering (it would only
    wait there, older, while a newer one comes): about a render's time later, less
    a plan's."""
    clip, sink = SlowRender(0.3), Sink()
    loop = FrameLoop(clip, sink, workers=2)  # type: ignore[arg-type]
    try:
        for n in (1, 2, 3):  # one by one: the loop learns how long a render takes
            loop.offer(FakeFrame(n))
            sink.wait(n)
        loop.offer(FakeFrame(4))
        deadline = time.monotonic() + TIMEOUT
        while 4 not in clip.began and time.monotonic() < deadline:
            time.sleep(0.005)
        loop.offer(FakeFrame(5))  # one frame in flight of two, its render under way
        out = sink.wait(5)
        assert [f.n for f in out] == [1, 2, 3, 4, 5]
        assert clip.began[5] - clip.began[4] > 0.15, clip.began
    finally:
        loop.close()


# --- the render process -----------------------------------------------------------------


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def moving_face(fuser: Any, sample_images: dict[str, np.ndarray]) -> list[Any]:
    """A 320x240 clip of a head moving, as PyAV frames with camera timestamps."""
    av = pytest.importorskip("av")
    from facefuse.toolchain.clips import Scene, motion_frames

    photo = sample_images["biden"]
    b = fuser.analyser.analyse(photo, embed=False)[0].bbox
    scene = Scene(photo, 12, (float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2,
                              float(b[2] - b[0])), size=(320, 240), face_px=100.0)
    frames = []
    for i, rgb in enumerate(motion_frames(scene)):
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
        frame.pts, frame.time_base = i * 3000, fractions.Fraction(1, 90_000)
        frames.append(frame)
    return frames


def clip(fuser: Any, sample_paths: dict[str, Any], degree: int = 80) -> Any:
    from facefuse.fusion.types import FuseOptions
    from facefuse.live.loop import live_options
    from facefuse.video.engine import ClipFusion

    return ClipFusion(fuser, live_options(FuseOptions(degree=degree)), [sample_paths["obama2"]])


def fuse_one_by_one(loop: FrameLoop, sink: Sink, frames: list[Any],
                    changes: dict[int, Callable[[Any], None]]) -> list[np.ndarray]:
    """Each frame offered once the one before came out (none dropped), with
    ``changes[i]`` asked for before frame ``i``."""
    for i, frame in enumerate(frames):
        if i in changes:
            loop.change(changes[i])
        loop.offer(frame)
        sink.wait(i + 1)
    return [f.to_ndarray(format="rgb24") for f in sink.frames]


@pytest.mark.skipif(not forkable_here(), reason="no forked render processes here")
def test_a_render_process_fuses_as_the_threads_do_takes_changes_and_ends_with_the_loop(
        fuser: Any, sample_paths: dict[str, Any], moving_face: list[Any]) -> None:
    import dataclasses

    outputs = {}
    for processes, changed in ((True, True), (False, True), (True, False)):
        state, sink = clip(fuser, sample_paths), Sink()
        source = state.prepare_source([sample_paths["astronaut"]])

        def new_source(st: Any, source: object = source) -> None:
            st.use_source(source)

        changes: dict[int, Callable[[Any], None]] = {
            4: lambda st: st.retune(dataclasses.replace(st.options.fuse, degree=40)),
            8: new_source,
        } if changed else {}
        loop = FrameLoop(state, sink, workers=1, processes=processes)
        try:
            loop.offer(moving_face[0])
            sink.wait(1)
            pid = loop.render_pid
            assert (pid is not None) == processes
            assert pid is None or alive(pid)
            sink.frames.clear()
            outputs[processes, changed] = fuse_one_by_one(loop, sink, moving_face, changes)
            assert loop.figures.frames_fused == len(moving_face) + 1
        finally:
            loop.close()
        assert not loop.running and loop.render_pid is None
        assert pid is None or not alive(pid)
    # The same pixels, before and after each change: the child took the new degree
    # and the new source between two frames, as the frame thread did.
    for a, b in zip(outputs[True, True], outputs[False, True], strict=True):
        assert np.array_equal(a, b)
    same = [np.array_equal(a, b) for a, b in zip(outputs[True, True], outputs[True, False],
                                                 strict=True)]
    assert same == [True] * 4 + [False] * (len(moving_face) - 4)


@pytest.mark.skipif(not forkable_here(), reason="no forked render processes here")
def test_a_render_process_that_dies_leaves_the_session_fusing_in_threads(
        fuser: Any, sample_paths: dict[str, Any], moving_face: list[Any]) -> None:
    state, sink = clip(fuser, sample_paths), Sink()
    loop = FrameLoop(state, sink, workers=1, processes=True)
    try:
        loop.offer(moving_face[0])
        sink.wait(1)
        pid = loop.render_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for n, frame in enumerate(moving_face[1:6], start=2):
            loop.offer(frame)
            sink.wait(n)
        assert loop.render_pid is None and not alive(pid)
        # the frames in hand when it died went out unfused, the later ones fused
        assert loop.figures.frames_fused >= 4
    finally:
        loop.close()


@pytest.mark.skipif(not forkable_here(), reason="no forked render processes here")
def test_a_render_given_up_while_the_child_works_does_not_stop_the_next(
        fuser: Any, sample_paths: dict[str, Any], moving_face: list[Any]) -> None:
    from facefuse.live.render import ForkedRenderer

    state = clip(fuser, sample_paths)
    plans = [state.plan(f.to_ndarray(format="rgb24"), i, i / 30.0)
             for i, f in enumerate(moving_face[:2])]
    renderer = ForkedRenderer(state, 320 * 240, slots=2)
    try:
        given_up = renderer.submit(plans[0])
        assert given_up.cancel()  # as a closing loop does with its frames in flight
        layers = renderer.submit(plans[1]).result(TIMEOUT)
        assert len(layers) == 1 and renderer.alive
    finally:
        renderer.close()
    assert not renderer.alive


# --- sources -------------------------------------------------------------------------


def test_uploaded_sources_are_per_key_and_bounded() -> None:
    sources = LiveSources(max_count=2, max_bytes=1 << 20)
    a = sources.put("alice", b"one")
    assert sources.put("alice", b"one") == a and sources.get("alice", a) == b"one"
    with pytest.raises(LiveSessionNotFoundError) as err:
        sources.get("bob", a)
    assert err.value.code == "live_source_not_found"
    sources.put("alice", b"two")
    sources.put("bob", b"three")  # the oldest (alice's "one") goes
    with pytest.raises(LiveSessionNotFoundError):
        sources.get("alice", a)
    expired = LiveSources(ttl_s=0.0)
    sid = expired.put("alice", b"x")
    threading.Event().wait(0.01)
    with pytest.raises(LiveSessionNotFoundError):
        expired.get("alice", sid)
