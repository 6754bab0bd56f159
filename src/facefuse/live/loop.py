"""The frame loop of a live session: latest frame wins, rendered off the event loop.

A camera does not wait. :class:`FrameLoop` holds **one** slot for the newest
frame received: :meth:`FrameLoop.offer` (on the event loop, never blocking) puts
a frame there, and a frame still waiting in it is dropped (counted), never
queued behind. The session's thread takes the slot's frame whenever fewer than
``workers`` frames are rendering, plans it with the video engine's per-frame state
machine (:class:`~facefuse.video.engine.ClipFusion`: tracking, landmark
smoothing, the per-track source; in frame order), renders it in a small pool,
then finishes (tone smoothing, blend) and hands out the frames in order. So a
slow frame delays only itself, and the frame fused next is always the newest
there is: latency stays about one frame's work, whatever the camera's rate. With
``workers`` 2 the next frame is planned while the one before renders, taken late
enough that its plan ends about when that render does (taken earlier it would
only wait, older): the renders follow one another, each frame's plan hidden
behind the render before, for more frames a second where a second core is free.

With ``processes``, where the clip's swapper can
(:func:`~facefuse.live.render.forkable`), the renders run in a child process forked
by that thread instead of the pool (:class:`~facefuse.live.render.ForkedRenderer`,
frames through shared memory): they no longer take turns at the interpreter lock
with the tracking, aiortc's codec threads and the event loop. The child ends with
the thread; one that dies leaves the session rendering in its threads.

Changes asked for while frames flow (a degree, a new source) are queued as
callables and applied by that thread between two plans, in order (a render
already running finishes with what it started with).

A session's clip state is made with :func:`live_options`: a small face (a 640x480
camera's) is rendered at a lower working resolution than a clip's, and a face's
glasses and facial hair looked for half as often (the CPU a frame takes is what
bounds a session's fps on a few shared cores).

Output frames keep the input's timestamps. Where faces were fused only their
regions are converted back to the camera's 4:2:0 picture
(:func:`~facefuse.video.io.patched_picture`); a frame with no face fused is the
decoded picture itself, passed through.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import cv2
import numpy as np

from facefuse.fusion.swappers.base import FaceLayer
from facefuse.fusion.types import FuseOptions
from facefuse.live.render import ForkedRenderer, forkable
from facefuse.video.engine import ClipFusion, FramePlan, VideoOptions
from facefuse.video.io import patched_picture

__all__ = ["LIVE_MIN_SCALE", "LIVE_REGIONS_EVERY", "LIVE_WORK_EYE_PX", "FrameLoop",
           "LiveFigures", "LiveObserver", "live_options"]

log = logging.getLogger("facefuse.live")

#: Frames of 4:2:0 layouts whose picture is reused outside the fused regions.
_REUSABLE = frozenset({"yuv420p", "yuvj420p"})
#: Latencies kept for the percentiles of a session's figures.
LATENCY_WINDOW = 600
#: Seconds over which a session's frame rates are measured.
RATE_WINDOW_S = 2.0
#: The weight of the newest time in the smoothed plan and render times.
_SMOOTH = 0.2
#: The eye distance (pixels) a live frame's face is rendered at when it is larger (a
#: clip's: :data:`~facefuse.fusion.swappers.classic.swapper.CLIP_WORK_EYE_PX`); the
#: layer is still put together at the camera's resolution, its detail from the
#: source at its own. See docs/live.md, "Where a frame's time goes", for what it
#: saved and what it changed.
LIVE_WORK_EYE_PX = 56.0
#: ... for a face it shrinks to no less than this share of its own resolution (a
#: 640x480 camera's face, ~67 px between the eyes: the same identity). A larger face
#: (720p) renders as a clip's frames do: shrunk to 0.56 or 0.64 of its own, its
#: embedding moved toward the target's in three of four strangers' pairs.
LIVE_MIN_SCALE = 0.8
#: Frames a face's glasses, facial hair and iris colour are carried (a clip's: 4);
#: sooner when the face turns, changes expression or size.
LIVE_REGIONS_EVERY = 8


def live_options(fuse: FuseOptions) -> VideoOptions:
    """The clip options a live session's frames are fused with: ``fuse``, rendered
    at :data:`LIVE_WORK_EYE_PX` (within :data:`LIVE_MIN_SCALE`), the worn regions
    carried :data:`LIVE_REGIONS_EVERY` frames (the frame loop renders, not the clip
    engine's workers)."""
    return VideoOptions(fuse=fuse, threads=1, processes=False,
                        regions_every=LIVE_REGIONS_EVERY, work_eye_px=LIVE_WORK_EYE_PX,
                        work_min_scale=LIVE_MIN_SCALE)


class LiveObserver(Protocol):
    """What the frame loop reports (the server's metrics implement it)."""

    def observe_live_frame(self, kind: str, count: int = 1) -> None:
        """``kind``: ``in`` (received), ``out`` (sent fused), ``dropped`` (never fused)."""

    def observe_live_latency(self, seconds: float) -> None:
        """One frame's time from received to its fused frame handed to the encoder."""


class _NoObserver:
    def observe_live_frame(self, kind: str, count: int = 1) -> None:
        pass

    def observe_live_latency(self, seconds: float) -> None:
        pass


@dataclass
class _InFlight:
    """A frame taken from the slot: planned, its render running."""

    frame: Any
    received: float
    t0: float
    plan: FramePlan | None
    scaled: bool
    layers: Future[list[FaceLayer]]
    #: Seconds its conversion and plan took.
    plan_s: float = 0.0


@dataclass
class LiveFigures:
    """A session's counts and recent timings (thread-safe: one lock)."""

    frames_in: int = 0
    frames_out: int = 0
    frames_dropped: int = 0
    frames_fused: int = 0
    #: Seconds from a frame received to its fused frame handed to the encoder.
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    #: Seconds one fusion took (the frame thread's work).
    work: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    _in_times: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    _out_times: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    size: tuple[int, int] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def received(self, now: float) -> None:
        with self._lock:
            self.frames_in += 1
            self._in_times.append(now)

    def dropped(self) -> None:
        with self._lock:
            self.frames_dropped += 1

    def fused(self, seconds: float, faces: bool, size: tuple[int, int]) -> None:
        with self._lock:
            self.work.append(seconds)
            self.frames_fused += faces
            self.size = size

    def sent(self, now: float, latency: float) -> None:
        with self._lock:
            self.frames_out += 1
            self._out_times.append(now)
            self.latencies.append(latency)

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """Counts, rates (fps over the last :data:`RATE_WINDOW_S`) and the latency and
        work percentiles (ms, over the last :data:`LATENCY_WINDOW` frames)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            lat = np.asarray(self.latencies, np.float64) * 1000.0
            work = np.asarray(self.work, np.float64) * 1000.0
            out = {
                "frames_in": self.frames_in, "frames_out": self.frames_out,
                "frames_dropped": self.frames_dropped, "frames_with_faces": self.frames_fused,
                "fps_in": _rate(self._in_times, now), "fps_out": _rate(self._out_times, now),
                "width": self.size[0] if self.size else None,
                "height": self.size[1] if self.size else None,
            }
        for name, values in (("latency", lat), ("fusion", work)):
            for q in (50, 95):
                out[f"{name}_p{q}_ms"] = (round(float(np.percentile(values, q)), 1)
                                         if values.size else None)
        return out


def _rate(times: deque[float], now: float) -> float:
    recent = [t for t in times if now - t <= RATE_WINDOW_S]
    if len(recent) < 2:
        return 0.0
    return round((len(recent) - 1) / max(recent[-1] - recent[0], 1e-6), 2)


#: ``emit(frame, received)``: a fused frame (PyAV) and when its input was received
#: (``time.monotonic()``), called from the frame thread.
Emit = Callable[[Any, float], None]


class FrameLoop:
    """Fuses the newest frame offered, in a thread of its own (see the module
    docstring). ``max_side``: frames whose longer side is over it are fused scaled
    down to it. ``workers``: frames in flight at once (the render of one overlaps
    the tracking of the next; 1: one frame at a time). ``processes``: render in a
    forked child process where the clip can (else, or if it fails, in threads)."""

    def __init__(self, state: ClipFusion, emit: Emit, *, observer: LiveObserver | None = None,
                 max_side: int = 1920, workers: int = 2, processes: bool = False,
                 name: str = "live") -> None:
        self.state = state
        self._workers = workers
        self._processes = processes
        self._renderer: ForkedRenderer | None = None
        #: The render process's id while there is one (else None).
        self.render_pid: int | None = None
        self.figures = LiveFigures()
        self._emit = emit
        self._observer = observer or _NoObserver()
        self._max_side = max_side
        self._cond = threading.Condition()
        self._slot: tuple[Any, float] | None = None
        self._changes: list[Callable[[ClipFusion], None]] = []
        self._stop = False
        self._index = 0
        self._t0: float | None = None
        #: A frame's conversion and plan, seconds (smoothed).
        self._plan_s = 0.0
        #: A frame's render in the pool, seconds (smoothed).
        self._render_s = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # --- the event loop's side -----------------------------------------------------------

    def offer(self, frame: Any, received: float | None = None) -> None:
        """The newest camera frame (a PyAV ``VideoFrame``); a frame not yet taken is
        dropped. Never blocks."""
        now = time.monotonic() if received is None else received
        self.figures.received(now)
        self._observer.observe_live_frame("in")
        with self._cond:
            if self._slot is not None:
                self.figures.dropped()
                self._observer.observe_live_frame("dropped")
            self._slot = (frame, now)
            self._cond.notify()

    def change(self, apply: Callable[[ClipFusion], None]) -> None:
        """Run ``apply(state)`` in the frame thread before the next frame is fused."""
        with self._cond:
            self._changes.append(apply)
            self._cond.notify()

    def sent(self, received: float) -> None:
        """A fused frame whose input came at ``received`` went to the encoder now."""
        now = time.monotonic()
        self.figures.sent(now, now - received)
        self._observer.observe_live_frame("out")
        self._observer.observe_live_latency(now - received)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (the frame in hand is finished first); a frame left in the
        slot is dropped."""
        with self._cond:
            self._stop = True
            if self._slot is not None:
                self._slot = None
                self.figures.dropped()
                self._observer.observe_live_frame("dropped")
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # --- the frame thread ----------------------------------------------------------------

    def _run(self) -> None:
        if self._processes and forkable(self.state):
            try:
                self._renderer = ForkedRenderer(self.state, self._max_side ** 2,
                                                self._workers, name=f"{self._thread.name}-r")
                self.render_pid = self._renderer.pid
            except OSError:
                log.warning("no render process (the fork failed): rendering in threads")
        try:
            self._frames()
        finally:
            self._drop_renderer()

    def _drop_renderer(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer, self.render_pid = None, None

    def _frames(self) -> None:
        """Take the newest frame whenever fewer than ``workers`` are rendering, plan it
        (tracking, in frame order), render it (in the child or the pool), and finish
        and emit the frames in order as their renders complete."""
        pending: deque[_InFlight] = deque()
        with ThreadPoolExecutor(self._workers, thread_name_prefix=self._thread.name) as pool:
            while True:
                with self._cond:
                    while True:
                        wait = self._take_in(pending) if self._slot is not None else None
                        if (self._stop or self._changes or (wait is not None and wait <= 0)
                                or (pending and pending[0].layers.done())):
                            break
                        self._cond.wait(wait)
                    if self._stop:
                        for x in pending:
                            x.layers.cancel()
                        return
                    changes, self._changes = self._changes, []
                    item = None
                    if self._slot is not None and self._take_in(pending) == 0.0:
                        item, self._slot = self._slot, None
                for apply in changes:
                    try:
                        apply(self.state)
                    except Exception:
                        log.exception("a live change failed")
                if item is not None:
                    pending.append(self._start(item, pool))
                while pending and pending[0].layers.done():
                    self._emit(*self._finish(pending.popleft()))

    def _take_in(self, pending: deque[_InFlight]) -> float | None:
        """Seconds until the slot's frame is to be taken (0.0: now; None: not before a
        frame in flight is done): when fewer than ``workers`` are in flight, once the
        last one's render is about a plan's time from its end (taken earlier, the
        frame would only wait, older, for that render: in the child, or for the
        cores its thread and this one share)."""
        if not pending:
            return 0.0
        if len(pending) >= self._workers:
            return None
        last = pending[-1]
        if last.layers.done():
            return 0.0
        render_s = self._render_s if self._renderer is None else self._renderer.render_s
        due = last.t0 + last.plan_s + render_s - self._plan_s
        return max(0.0, due - time.monotonic())

    def _wake(self, _: object = None) -> None:
        with self._cond:
            self._cond.notify()

    def _start(self, item: tuple[Any, float], pool: ThreadPoolExecutor) -> _InFlight:
        """Plan the frame and start its render (a frame that cannot be planned goes
        out as it came)."""
        frame, received = item
        t0 = time.monotonic()
        try:
            rgb, scaled = self._rgb(frame)
            t = frame.time
            if t is None:
                self._t0 = t0 if self._t0 is None else self._t0
                t = t0 - self._t0
            plan = self.state.plan(rgb, self._index, float(t))
            self._index += 1
            plan_s = time.monotonic() - t0
            self._plan_s += (plan_s - self._plan_s) * _SMOOTH
            if self._renderer is not None and not self._renderer.alive:
                log.warning("the render process died: rendering in threads")
                self._drop_renderer()
            layers = (self._renderer.submit(plan) if self._renderer is not None
                      else pool.submit(self._render, plan))
        except Exception:
            log.exception("a live frame could not be planned; passed through unfused")
            plan, scaled, layers, plan_s = None, False, Future(), 0.0
            layers.set_result([])
        layers.add_done_callback(self._wake)
        return _InFlight(frame, received, t0, plan, scaled, layers, plan_s)

    def _render(self, plan: FramePlan) -> list[FaceLayer]:
        """A pool thread's render of ``plan``, timed."""
        t0 = time.monotonic()
        layers = self.state.render(plan)
        seconds = time.monotonic() - t0
        # (The first render's time as it is: smoothed from 0, the next frames would
        # be taken too early for a while.)
        self._render_s += (seconds - self._render_s) * (_SMOOTH if self._render_s else 1.0)
        return layers

    def _finish(self, x: _InFlight) -> tuple[Any, float]:
        """(the output picture, when its input came)."""
        if x.plan is None:
            return x.frame, x.received
        try:
            fused, stats = self.state.finish(x.plan, x.layers.result())
            out = self._picture(x.frame, fused, stats.regions, x.scaled)
        except Exception:
            # One bad frame (a decoder glitch, a model error) is passed through.
            log.exception("a live frame failed; passed through unfused")
            return x.frame, x.received
        self.figures.fused(time.monotonic() - x.t0, bool(stats.fused),
                           (fused.shape[1], fused.shape[0]))
        return out, x.received

    def _rgb(self, frame: Any) -> tuple[np.ndarray, bool]:
        """The frame as RGB, scaled down to ``max_side`` (and whether it was)."""
        rgb: np.ndarray = frame.to_ndarray(format="rgb24")
        h, w = rgb.shape[:2]
        scale = self._max_side / max(h, w)
        if scale >= 1.0:
            return rgb, False
        size = (max(2, round(w * scale)) & ~1, max(2, round(h * scale)) & ~1)
        return cv2.resize(rgb, size, interpolation=cv2.INTER_AREA), True

    @staticmethod
    def _picture(frame: Any, fused: np.ndarray, regions: list[tuple[int, int, int, int]],
                 scaled: bool) -> Any:
        """The output picture with ``frame``'s times: the decoded picture itself when no
        face was fused, else only the fused regions converted back where it can."""
        from facefuse.video.codecs import pyav

        if not regions and not scaled:
            return frame
        if (not scaled and frame.format.name in _REUSABLE and frame.width % 2 == 0
                and frame.height % 2 == 0):
            # WebRTC cameras send BT.601 limited range (what to_ndarray read with).
            out = patched_picture(frame, fused, regions, "ITU601", "MPEG")
        else:
            out = pyav().VideoFrame.from_ndarray(fused, format="rgb24")
        with contextlib.suppress(AttributeError, ValueError):
            out.pts, out.time_base = frame.pts, frame.time_base
        return out
