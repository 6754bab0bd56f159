"""One function of this process's state run in forked child processes.

A clip's renders are Python-heavy NumPy/OpenCV work that holds the GIL for about
half of its time, so two render threads of one process use about 1.7 of two
cores. :class:`ForkedCalls` runs them in child processes forked from the
process that holds the clip's state instead: a child inherits that state as it
was at the fork (the models, the source photos and their analysis; nothing of it
is pickled), and only each call's arguments and result cross a pipe (a frame
and its faces in, the rendered layers out).

The children are forked when a :class:`ForkedCalls` is made (after the state
they read is made) and live until :meth:`ForkedCalls.close`. They die with
their parent, even when it is killed (Linux's parent-death signal), and ignore
SIGINT and SIGTERM: a signal sent to the whole process group (a Ctrl-C, an init
that forwards a stop to the group) is the parent's to handle (the job worker
finishes or hands back its job, then stops them), and a parent's handler is not
theirs to run.

A fork has a cost in the parent too: a page it writes first after the fork is
copied then (its next face analysis took ~4 800 such faults, 25 → 42 ms), once
per set of children.

Only POSIX ``fork`` serves: :func:`available` says whether this platform has it.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

__all__ = ["ForkedCalls", "available"]

#: Linux's ``prctl`` option that sends a signal to a process when its parent dies.
_PR_SET_PDEATHSIG = 1

#: The function a child runs, set in the child when it starts.
_CALL: Callable[..., Any] | None = None


def available() -> bool:
    """Whether child processes can be forked here (POSIX with ``fork``)."""
    return sys.platform != "win32" and "fork" in mp.get_all_start_methods()


def _die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux only; a
    no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _start_child(fn: Callable[..., Any]) -> None:
    global _CALL
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _CALL = fn


def _call(*args: Any) -> Any:
    assert _CALL is not None, "not in a child of ForkedCalls"
    return _CALL(*args)


class ForkedCalls:
    """``fn(*args)`` in ``workers`` forked children (see the module docstring).

    ``fn`` is never pickled: the children are forked from this process and find it
    there. Its arguments and results must pickle. A child that dies makes every
    pending and later call raise
    :class:`concurrent.futures.process.BrokenProcessPool`.
    """

    def __init__(self, fn: Callable[..., Any], workers: int) -> None:
        if not available():
            raise RuntimeError("forked child processes are not available here")
        self._pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"),
                                         initializer=_start_child, initargs=(fn,))
        # The children are forked now, by a first call that does nothing: they
        # start up while the caller goes on (a clip: its first frame is decoded
        # and tracked meanwhile), not when its first real call comes.
        self._pool.submit(int)

    def submit(self, *args: Any) -> Future[Any]:
        """``fn(*args)`` in a free child (queued while every child is busy)."""
        return self._pool.submit(_call, *args)

    def close(self, cancel: bool = False) -> None:
        """Stop the children once their calls are done (``cancel``: calls not yet
        started are dropped) and wait for them to exit."""
        self._pool.shutdown(wait=True, cancel_futures=cancel)

    def __enter__(self) -> ForkedCalls:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(cancel=exc[0] is not None)
