"""Ctrl-C for a batch: the first stops it cleanly, the second stops it now.

:class:`FirstInterruptStops` replaces the SIGINT handler for the duration of a
batch (main thread only):

1. the first SIGINT sets :attr:`FirstInterruptStops.event`: no new target starts,
   the ones in flight finish, the report is written and the CLI exits 130;
2. a second SIGINT removes the output temporaries being written
   (:func:`facefuse.batch.remove_temporaries`) and exits 130 at once, without
   waiting for the jobs in flight (their outputs are never half-written: only
   temporaries are, and those are gone).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any

from facefuse.batch import remove_temporaries

__all__ = ["FirstInterruptStops"]


class FirstInterruptStops:
    """Context manager: SIGINT handling for one batch (see the module docstring)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.event.is_set():
            self.event.set()
            print("\nstopping: finishing the images in flight (Ctrl-C again to stop now)",
                  file=sys.stderr, flush=True)
            return
        removed = remove_temporaries()
        print(f"\nstopped now ({removed} partial output(s) removed)", file=sys.stderr,
              flush=True)
        os._exit(130)

    def __enter__(self) -> FirstInterruptStops:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
