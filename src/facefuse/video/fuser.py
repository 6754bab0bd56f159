"""The clip driver: :class:`VideoFuser` decodes, plans, renders and encodes a clip in
threads joined by bounded queues (the per-frame state is
:class:`~facefuse.video.engine.ClipFusion`'s; :mod:`facefuse.video.engine` says what
is done once and what each frame).

``VideoFuser(fuser).fuse_video(source, clip, out)`` (or ``facefuse video SOURCE
CLIP -o OUT``).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from facefuse.errors import CancelledError
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.mapping import FacePair
from facefuse.fusion.swappers.base import FaceLayer
from facefuse.imaging.decode import ImageInput
from facefuse.video import processes as forked
from facefuse.video.codecs import DEFAULT_ENCODER, encoder
from facefuse.video.engine import ClipFusion, FramePlan
from facefuse.video.io import (
    AudioPacket,
    Frame,
    VideoInfo,
    VideoLimits,
    VideoReader,
    VideoWriter,
    probe,
)
from facefuse.video.options import VideoOptions

__all__ = ["Progress", "VideoFuser", "VideoReport"]


@dataclass
class VideoReport:
    """A fused clip's summary (the CLI prints it, a job stores it)."""

    frames: int = 0
    fused_frames: int = 0
    detections: int = 0
    cuts: int = 0
    tracks: int = 0
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    encoder: str = DEFAULT_ENCODER
    notes: list[str] = field(default_factory=list)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "fused_frames": self.fused_frames,
                "detections": self.detections, "cuts": self.cuts, "tracks": self.tracks,
                "seconds": round(self.seconds, 3), "fps": round(self.fps, 2),
                "encoder": self.encoder, "clip": self.info, "notes": self.notes}


#: ``progress(frames_done, frames_expected, fps)``: called after every frame.
Progress = Callable[[int, int, float], None]


class VideoFuser:
    """Fuses a source identity into clips: files in, files out (see the module
    docstring). Thread-safe like the :class:`FaceFuser` it wraps; each clip has its
    own :class:`ClipFusion`."""

    def __init__(self, fuser: FaceFuser | None = None, limits: VideoLimits | None = None) -> None:
        self.fuser = fuser or FaceFuser()
        self.limits = limits or VideoLimits.from_settings(self.fuser.settings)

    def probe(self, clip: Path) -> VideoInfo:
        """The clip's header, checked against the limits (typed 400/413 errors)."""
        return probe(Path(clip), self.limits)

    def fuse_video(
        self,
        source: ImageInput | Sequence[ImageInput],
        clip: Path,
        out: Path,
        options: VideoOptions | None = None,
        *,
        reference: ImageInput | None = None,
        mapping: Sequence[FacePair | dict[str, Any]] | None = None,
        progress: Progress | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> VideoReport:
        """Fuse ``source`` (one photo, or photos of one person; with a mapping, photos
        of different people) into every frame of ``clip``; write ``out`` atomically.

        Raises:
            InvalidArgumentError: ``unknown_swapper`` (before the clip is read).
            InvalidVideoError, VideoTooLargeError: the clip (typed, before any work).
            CancelledError: ``cancelled()`` became true (no output is left).
        """
        options = options or VideoOptions()
        clip, out = Path(clip), Path(out)
        enc = encoder(options.encoder)
        self.fuser.resolve(options.fuse)  # an unknown swapper before the clip is opened
        info = self.probe(clip)
        t0 = time.perf_counter()
        sources: list[ImageInput] = (
            list(source) if isinstance(source, list | tuple) else [source]  # type: ignore[list-item]
        )
        state = ClipFusion(self.fuser, options, sources, reference=reference, mapping=mapping)
        report = VideoReport(info=info.to_dict(), encoder=enc.name, notes=list(state.notes))
        with (VideoWriter(out, info, enc, clip) as writer,
              _render_pool(state, options) as submit):
            reader = _Pipe(iter(VideoReader(clip, info, self.limits)), options.window, "decode")
            sink = _Sink(writer, options.window)
            frames = _InOrder(state, sink, report,
                              _progress_of(progress, info.expected_frames, t0))
            try:
                for item in reader:
                    if isinstance(item, AudioPacket):
                        frames.audio(item)
                        continue
                    if cancelled is not None and cancelled():
                        raise CancelledError("the clip was cancelled")
                    plan = state.plan(item.rgb, item.index, item.time_s)
                    frames.frame(item, plan, submit(plan), ahead=options.threads)
                frames.close()
            except BaseException:
                frames.cancel()
                reader.stop()
                sink.abort()
                raise
        report.seconds = time.perf_counter() - t0
        report.detections, report.cuts = state.detections, state.cuts
        report.tracks = len(state.tracker.tracks)
        if report.fused_frames == 0:
            report.notes.append("no frame had a face that could be fused; the clip is "
                                "re-encoded unchanged")
        return report


def _progress_of(progress: Progress | None, total: int, t0: float
                 ) -> Callable[[int], None] | None:
    """``progress`` as called after each finished frame (with the frames done)."""
    if progress is None:
        return None
    return lambda done: progress(done, max(total, done),
                                 done / max(time.perf_counter() - t0, 1e-6))


class _InOrder:
    """Frames planned, rendering in the pool, not yet finished: each finished in
    frame order and handed to the sink (an audio packet waits behind the frame
    before it, so the file order is kept), at most ``ahead`` frames in flight."""

    def __init__(self, state: ClipFusion, sink: _Sink, report: VideoReport,
                 progress: Callable[[int], None] | None) -> None:
        self.state, self.sink, self.report, self.progress = state, sink, report, progress
        self.pending: deque[tuple[Frame, FramePlan, Future[list[FaceLayer]]]
                            | AudioPacket] = deque()
        self.frames = 0

    def audio(self, packet: AudioPacket) -> None:
        self.pending.append(packet)

    def frame(self, item: Frame, plan: FramePlan, layers: Future[list[FaceLayer]], *,
              ahead: int) -> None:
        self.pending.append((item, plan, layers))
        self.frames += 1
        while self.frames > ahead:
            self._finish_oldest()

    def close(self) -> None:
        """Finish every pending frame; wait until the sink has written them."""
        while self.pending:
            self._finish_oldest()
        self.sink.close()

    def cancel(self) -> None:
        """After a failure: cancel the renders not yet started."""
        for x in self.pending:
            if not isinstance(x, AudioPacket):
                x[2].cancel()

    def _finish_oldest(self) -> None:
        head = self.pending.popleft()
        if isinstance(head, AudioPacket):
            self.sink.put(head)
            return
        self.frames -= 1
        item, plan, layers = head
        fused, stats = self.state.finish(plan, layers.result())
        self.sink.put((item, fused, stats.regions))
        self.report.frames += 1
        self.report.fused_frames += bool(stats.fused)
        if self.progress is not None:
            self.progress(self.report.frames)


@contextlib.contextmanager
def _render_pool(state: ClipFusion, options: VideoOptions
                 ) -> Iterator[Callable[[FramePlan], Future[list[FaceLayer]]]]:
    """``submit(plan)`` -> the future of ``state.render(plan)``, run ``options.threads``
    at a time in forked children (:attr:`VideoOptions.processes`, where the platform
    forks and the swapper's render is safe in a forked child; threads if the fork
    fails) or in threads; the pool is stopped on the way out (on an error, the
    renders not yet started are dropped)."""
    calls: forked.ForkedCalls | None = None
    if options.processes and forked.available() and state.swapper.fork_safe:
        # Out of memory or processes, or no named semaphores (no /dev/shm): threads.
        with contextlib.suppress(OSError, NotImplementedError):
            calls = forked.ForkedCalls(state.render_faces, options.threads)
    if calls is not None:
        with calls:

            def in_child(plan: FramePlan) -> Future[list[FaceLayer]]:
                request = state.render_request(plan)
                if request is None:
                    nothing: Future[list[FaceLayer]] = Future()
                    nothing.set_result([])
                    return nothing
                return calls.submit(*request)

            yield in_child
        return
    with ThreadPoolExecutor(options.threads, thread_name_prefix="render") as pool:
        yield lambda plan: pool.submit(state.render, plan)


_END = object()


def _detached(exc: BaseException) -> BaseException:
    """``exc`` to hand from a helper thread to another: without the helper's own
    frame in its traceback (it holds the helper object, which holds the error: a
    reference cycle only the garbage collector frees, with every array the frames
    below it hold, the decoded frames among them), and with the locals of the
    frames it keeps cleared (their lines stay for the log)."""
    tb = exc.__traceback__
    below = tb.tb_next if tb is not None else None
    if below is not None:
        traceback.clear_frames(below)
    return exc.with_traceback(below)


class _Pipe:
    """Runs an iterator in a thread, ``size`` items ahead; errors re-raise in the
    consumer."""

    def __init__(self, source: Iterator[Any], size: int, name: str) -> None:
        self._q: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(source,), name=name,
                                        daemon=True)
        self._thread.start()

    def _run(self, source: Iterator[Any]) -> None:
        try:
            for item in source:
                if not self._offer(item):
                    return
        except BaseException as exc:
            self._error = _detached(exc)
        self._offer(_END)

    def _offer(self, item: Any) -> bool:
        """Queue ``item`` unless the consumer stopped; False when it did."""
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._q.get()
            if item is _END:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                return
            yield item

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class _Sink:
    """Feeds the writer from a thread through a queue of ``size`` items."""

    def __init__(self, writer: VideoWriter, size: int) -> None:
        self._writer = writer
        self._q: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="encode", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _END:
                return
            if self._error is not None:
                continue  # drain after a failure
            try:
                if isinstance(item, AudioPacket):
                    self._writer.write_audio(item)
                else:
                    self._writer.write(*item)
            except BaseException as exc:
                self._error = _detached(exc)

    def put(self, item: AudioPacket | tuple[Frame, np.ndarray,
                                            list[tuple[int, int, int, int]]]) -> None:
        if self._error is not None:
            raise self._error
        self._q.put(item)

    def close(self) -> None:
        """Wait for every queued item to be written; re-raise a writer error."""
        self._q.put(_END)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Stop after a failure elsewhere: queued items are dropped, not written."""
        self._error = self._error or CancelledError("aborted")
        self._q.put(_END)  # the thread drains the queue, so this cannot block for long
        self._thread.join(timeout=30)
