"""The job worker's main thread wakes up for a SIGTERM whichever thread took it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# A SIGTERM handed to another thread (pthread_kill): its handler runs only when the
# main thread runs Python again.
CHILD = textwrap.dedent("""
    import signal, sys, threading, time
    from facefuse.serving.jobs.worker import wait_for_stop
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    other = threading.Thread(target=time.sleep, args=(60,), daemon=True)
    other.start()
    threading.Timer(0.3, signal.pthread_kill, (other.ident, signal.SIGTERM)).start()
    if sys.argv[1] == "untimed":
        stop.wait()
    else:
        wait_for_stop(stop)
    print("stopped", flush=True)
""")


def _stops_within(mode: str, seconds: float) -> bool:
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True,
                             text=True, timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return out.stdout.strip() == "stopped"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX threads and signals")
def test_a_signal_another_thread_took_stops_the_worker() -> None:
    assert not _stops_within("untimed", 5.0)  # the hang: an untimed wait never returns
    assert _stops_within("slices", 30.0)
