"""One function of this process's state run in forked child processes (Linux).

A clip's renders are Python-heavy NumPy/OpenCV work that holds the GIL for about
half of its time, so two render threads of one process use about 1.7 of two
cores. :class:`ForkedCalls` runs them in child processes forked from the
process that holds the clip's state instead: a child inherits that state as it
was at the fork (the source photos and their analysis; nothing of it is
pickled), and only each call's arguments and result cross a pipe (a frame and
its faces in, the rendered layers out). What the function runs must be safe in
a forked child: no ONNX Runtime session, GPU context or thread pool of the
parent's (:attr:`facefuse.fusion.swappers.base.Swapper.fork_safe`).

The children are forked when a :class:`ForkedCalls` is made (after the state
they read is made) and live until :meth:`ForkedCalls.close`, which is bounded: a
child still running :data:`CLOSE_WAIT_S` after it, or any child once one has
died (its pipe may be left full), is killed. They die with the thread that made
them, and so with their parent even when it is SIGKILLed (Linux's parent-death
signal); they ignore SIGINT (a Ctrl-C reaches the whole process group: the
parent decides when they stop) and take SIGTERM's default (containers send it
to the parent alone; a parent's handler, such as the job worker's hand-back, is
not theirs to run). A child writes to its own standard streams: another thread
of the parent may have held the old ones' locks at the fork. Its garbage collector
never looks at what it inherited (:func:`gc.freeze`, across the fork): releasing an
inherited PyAV frame would wait for the parent's scaler threads, which a fork does
not copy (the children drop no reference of the parent's to one either).

A fork has a cost in the parent too: a page it writes first after the fork is
copied then (its next face analysis took ~4 800 such faults, 25 → 42 ms), once
per set of children.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

__all__ = ["CLOSE_WAIT_S", "ForkedCalls", "available", "prepare_child"]

#: Linux's ``prctl`` option that sends a signal to a process when its parent dies.
_PR_SET_PDEATHSIG = 1
#: Seconds :meth:`ForkedCalls.close` waits for the children to finish their calls
#: and exit before it kills them.
CLOSE_WAIT_S = 30.0

#: The function a child runs, set in the child when it starts.
_CALL: Callable[..., Any] | None = None


def available() -> bool:
    """Whether child processes can be forked here: Linux (fork is unsafe in a
    threaded process on macOS, and there is no parent-death signal there)."""
    return sys.platform.startswith("linux")


def _die_with_parent(parent: int) -> None:
    """Ask the kernel to kill this process when the thread that forked it dies;
    exit now if the parent is already gone."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it died before the signal was asked for
        os._exit(1)


def _start_child(fn: Callable[..., Any], parent: int) -> None:
    global _CALL
    prepare_child(parent)
    _CALL = fn


def prepare_child(parent: int) -> None:
    """Set up a child just forked from process ``parent`` (with :func:`gc.freeze`
    called across the fork) as the module docstring says: it dies with the thread
    that forked it, ignores SIGINT, takes SIGTERM's default, writes to fresh
    standard streams and never collects what it inherited."""
    # The cyclic garbage collector leaves alone every object this child inherited
    # (frozen by the parent across the fork; what the start-up made too): an
    # unreachable cycle of the parent's could hold a decoded PyAV frame, whose
    # release frees a scaler that joins the parent's worker threads, which do not
    # exist here, and the child would wait for them forever.
    gc.freeze()
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Fresh stream objects on the same descriptors: their buffers' locks were
    # copied as the parent's threads held them at the fork.
    sys.stdout, sys.stderr = _stream(1, -1), _stream(2, 1)


def _stream(fd: int, buffering: int) -> Any:
    """A new text stream on descriptor ``fd`` (not closed with it), or on the null
    device when ``fd`` is not open."""
    try:
        return open(fd, "w", buffering=buffering, closefd=False)
    except OSError:
        return open(os.devnull, "w")


def _call(*args: Any) -> Any:
    assert _CALL is not None, "not in a child of ForkedCalls"
    return _CALL(*args)


class ForkedCalls:
    """``fn(*args)`` in ``workers`` forked children (see the module docstring).

    ``fn`` is never pickled: the children are forked from this process and find it
    there. Its arguments and results must pickle. A child that dies makes every
    pending and later call raise
    :class:`concurrent.futures.process.BrokenProcessPool`.

    Raises:
        RuntimeError: not :func:`available` here.
        OSError: the fork failed (out of memory or processes), or the pool's
            semaphores could not be made (no ``/dev/shm``).
        NotImplementedError: this system has no named semaphores.
    """

    def __init__(self, fn: Callable[..., Any], workers: int) -> None:
        if not available():
            raise RuntimeError("forked child processes are not available here")
        self._pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"),
                                         initializer=_start_child, initargs=(fn, os.getpid()))
        # The children are forked now, by a first call that does nothing: they
        # start up while the caller goes on (a clip: its first frame is decoded
        # and tracked meanwhile), not when its first real call comes. Every object
        # of this process is frozen across the fork, so the children's collectors
        # never free one of them (see _start_child) from their first step on.
        gc.freeze()
        try:
            self._pool.submit(int)
        except BaseException:
            self._pool.shutdown(wait=False, cancel_futures=True)
            raise
        finally:
            gc.unfreeze()
        # (CPython's pool keeps them here; with fork, all are started at once.)
        self._children: list[Any] = list(getattr(self._pool, "_processes", {}).values())

    def submit(self, *args: Any) -> Future[Any]:
        """``fn(*args)`` in a free child (queued while every child is busy)."""
        return self._pool.submit(_call, *args)

    def close(self, cancel: bool = False) -> None:
        """Stop the children once their calls are done and wait for them to exit
        (``cancel``: calls not yet handed to a child are dropped; the pool hands one
        call more than it has children ahead). Bounded: see the module docstring."""
        self._pool.shutdown(wait=False, cancel_futures=cancel)
        broken = bool(getattr(self._pool, "_broken", False))
        deadline = time.monotonic() + (0.0 if broken else CLOSE_WAIT_S)
        for p in self._children:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._children:
            if p.is_alive():
                p.kill()
                p.join()

    def __enter__(self) -> ForkedCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=exc[0] is not None)
