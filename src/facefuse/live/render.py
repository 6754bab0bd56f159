"""A live session's renders in a forked child process, frames through shared memory.

In one process the frame thread's tracking and blend, the render, aiortc's codec
threads and the event loop take turns at one interpreter lock, and the render
(Python-heavy NumPy/OpenCV work) is slowed by the others. :class:`ForkedRenderer`
runs :meth:`~facefuse.video.engine.ClipFusion.render_faces` in one child process
forked from the session's frame thread, with the clip's state as it was at the
fork (nothing of it pickled). Per frame:

* the parent copies the frame's RGB picture into one of ``slots`` regions of an
  anonymous shared mapping made before the fork (no file, no name: nothing to
  leak), and sends the region, the picture's shape and the faces to render
  (a few kB, pickled) on a pipe;
* the child renders over that region in place and sends the layers back on the
  pipe; a reader thread of the parent completes the frame's future.

A region is reused only once its frame's layers are back, so at most ``slots``
frames are in flight. What the render reads of the clip besides its arguments (the
sources, the render options) is sent again, ahead of the next frame, whenever the
clip's :attr:`~facefuse.video.engine.ClipFusion.revision` moved (a new degree or
source, between two frames): a render already running finishes with what it had.

The child is set up as :mod:`facefuse.video.processes`'s (it dies with the thread
that forked it, ignores SIGINT, takes SIGTERM's default, never collects what it
inherited) and closes every descriptor it inherited but its pipe and its standard
streams: the server's sockets (its listener, other sessions' UDP ports) are not
held open by it. :meth:`ForkedRenderer.close` stops it and waits a bounded time,
then kills it; a child that died fails its frames' futures (:class:`RenderProcessError`)
and :attr:`ForkedRenderer.alive` turns false.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import mmap
import multiprocessing as mp
import os
import threading
import time
from concurrent.futures import Future, InvalidStateError
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from facefuse.fusion.swappers.base import FaceLayer
from facefuse.video import processes
from facefuse.video.engine import ClipFusion, FramePlan

__all__ = ["ForkedRenderer", "RenderProcessError", "forkable"]

log = logging.getLogger("facefuse.live")

#: Seconds :meth:`ForkedRenderer.close` waits for the child to finish its frame and
#: exit before it kills it.
CLOSE_WAIT_S = 2.0
#: The weight of the newest render's time in :attr:`ForkedRenderer.render_s`.
SMOOTH = 0.2


class RenderProcessError(RuntimeError):
    """The render process is gone (killed, out of memory, closed)."""


def forkable(state: Any) -> bool:
    """Whether ``state`` (a clip) can render in a forked child here: Linux, and a
    swapper whose render is safe in one."""
    swapper = getattr(state, "swapper", None)
    return processes.available() and bool(getattr(swapper, "fork_safe", False))


def _serve(state: ClipFusion, conn: Connection, mem: mmap.mmap, parent: int) -> None:
    """The child: render what the pipe asks until it says stop or closes."""
    processes.prepare_child(parent)
    keep = {0, 1, 2, conn.fileno()}
    for fd in _open_descriptors():
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "stop":
            return
        if msg[0] == "inputs":
            state.use_render_inputs(msg[1])
            continue
        _, seq, offset, shape, items = msg
        rgb = np.frombuffer(mem, np.uint8, int(np.prod(shape)), offset).reshape(shape)
        t0 = time.perf_counter()
        try:
            reply: tuple[int, bool, Any, float] = (seq, True, state.render_faces(rgb, items),
                                                   time.perf_counter() - t0)
        except Exception as exc:  # handed to the parent, which passes the frame through
            reply = (seq, False, RuntimeError(f"{type(exc).__name__}: {exc}"),
                     time.perf_counter() - t0)
        del rgb
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


def _open_descriptors() -> list[int]:
    try:
        return [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 1024))


class ForkedRenderer:
    """Renders ``state``'s frames in a child forked now, from the calling thread
    (see the module docstring). ``max_pixels``: the largest frame's width x height;
    ``slots``: frames in flight at most.

    Raises:
        OSError: the fork or the shared mapping failed (out of memory or processes).
    """

    def __init__(self, state: ClipFusion, max_pixels: int, slots: int = 1,
                 name: str = "live-render") -> None:
        self._state = state
        self._slot_bytes = max_pixels * 3
        self._mem = mmap.mmap(-1, self._slot_bytes * slots)
        self._free = list(range(slots))
        self._pending: dict[int, tuple[Future[list[FaceLayer]], int]] = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._revision = state.revision
        self._dead = False
        self._closed = False
        #: A frame's render in the child, seconds (smoothed; its result's way back
        #: not included).
        self.render_s = 0.0
        conn, child = mp.Pipe(duplex=True)
        self._conn = conn
        self._proc = mp.get_context("fork").Process(
            target=_serve, args=(state, child, self._mem, os.getpid()), name=name, daemon=True)
        # Frozen across the fork: the child's collector never frees what it inherits.
        gc.freeze()
        try:
            self._proc.start()
        except BaseException:
            conn.close()
            self._mem.close()
            raise
        finally:
            gc.unfreeze()
            child.close()
        self._reader = threading.Thread(target=self._read, name=f"{name}-in", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        return not (self._dead or self._closed) and self._proc.is_alive()

    def submit(self, plan: FramePlan) -> Future[list[FaceLayer]]:
        """The future of ``state.render(plan)``, rendered in the child. Call it from
        one thread (the frame thread), with fewer than ``slots`` frames in flight."""
        fut: Future[list[FaceLayer]] = Future()
        request = self._state.render_request(plan)
        if request is None:
            fut.set_result([])
            return fut
        rgb, items = request
        if rgb.size > self._slot_bytes:
            raise ValueError(f"a {rgb.shape} frame is over the renderer's {self._slot_bytes} "
                             "bytes")
        with self._lock:
            if self._dead:
                raise RenderProcessError("the render process is gone")
            slot = self._free.pop()
            self._seq += 1
            seq = self._seq
            self._pending[seq] = (fut, slot)
        offset = slot * self._slot_bytes
        view = np.frombuffer(self._mem, np.uint8, rgb.size, offset).reshape(rgb.shape)
        np.copyto(view, rgb)
        del view
        try:
            if self._state.revision != self._revision:
                self._revision = self._state.revision
                self._conn.send(("inputs", self._state.render_inputs()))
            self._conn.send(("render", seq, offset, rgb.shape, items))
        except (OSError, ValueError) as exc:
            self._fail(RenderProcessError(f"the render process is gone: {exc}"))
        return fut

    def _read(self) -> None:
        while True:
            try:
                seq, ok, value, seconds = self._conn.recv()
            except (EOFError, OSError):
                break
            self.render_s += (seconds - self.render_s) * SMOOTH
            with self._lock:
                fut, slot = self._pending.pop(seq)
                self._free.append(slot)
            # A frame dropped at close was cancelled meanwhile: its layers go.
            with contextlib.suppress(InvalidStateError):
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
        self._fail(RenderProcessError("the render process is gone"))

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self._dead = True
            pending, self._pending = list(self._pending.values()), {}
        for fut, _ in pending:
            with contextlib.suppress(InvalidStateError):
                fut.set_exception(exc)

    def close(self, wait: float = CLOSE_WAIT_S) -> None:
        """Stop the child (its frame in hand is finished first, unless it is still
        running after ``wait`` seconds: then it is killed), wait for it and free the
        mapping. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(("stop",))
        # Polled: the child closed its end of the pipe that Process.join(timeout)
        # waits on, with every other descriptor it inherited.
        deadline = time.monotonic() + wait
        while self._proc.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if self._proc.exitcode is None:
            self._proc.kill()
            self._proc.join()
        self._reader.join(wait)  # the child's end is closed: it reads the end
        self._conn.close()
        self._fail(RenderProcessError("the render process was closed"))
        with contextlib.suppress(BufferError):  # a view still open: freed with the last one
            self._mem.close()
        self._proc.close()
