"""Forked child processes running a function of the parent's state."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
from child_processes import alive, children

from facefuse.errors import ModelError
from facefuse.video.processes import ForkedCalls, available

pytestmark = pytest.mark.skipif(not available(), reason="needs fork")


def test_a_child_runs_the_parents_state_and_exits_when_closed() -> None:
    """The function and what it reads are the parent's, never pickled (a lock and a
    lambda would not pickle); arguments and results cross; the children are gone
    after close."""
    before = children()
    lock = threading.Lock()
    state = {"scale": 3, "lock": lock, "fn": lambda x: x + 1}

    def work(x: int) -> tuple[int, int]:
        with state["lock"]:  # type: ignore[attr-defined]
            return state["fn"](x) * state["scale"], os.getpid()  # type: ignore[operator]

    with ForkedCalls(work, 2) as calls:
        out = [calls.submit(i).result(timeout=60) for i in range(6)]
        kids = children() - before
    assert [v for v, _ in out] == [3 * (i + 1) for i in range(6)]
    assert {pid for _, pid in out} <= kids and os.getpid() not in {pid for _, pid in out}
    assert len(kids) == 2
    assert not any(alive(p) for p in kids)


def test_a_typed_error_in_a_child_reaches_the_caller_with_its_code() -> None:
    def fail(_: int) -> None:
        raise ModelError("model run failed", code="model_failed")

    with ForkedCalls(fail, 1) as calls, pytest.raises(ModelError) as err:
        calls.submit(0).result(timeout=60)
    assert err.value.code == "model_failed" and err.value.message == "model run failed"


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    """SIGKILL of the parent (a worker killed mid-job) leaves no child behind."""
    script = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / "src")!r})
        from facefuse.video.processes import ForkedCalls
        calls = ForkedCalls(lambda _: os.getpid(), 2)
        pids = {{calls.submit(i).result() for i in range(8)}}
        print(" ".join(map(str, sorted(pids))), flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids and all(alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()


def test_a_ctrl_c_to_the_group_is_the_parents_to_handle() -> None:
    """SIGINT (a Ctrl-C reaches the whole process group) leaves the children
    serving: the parent decides when they stop."""
    with ForkedCalls(lambda _: os.getpid(), 1) as calls:
        pid = calls.submit(0).result(timeout=60)
        os.kill(pid, signal.SIGINT)
        time.sleep(0.2)
        assert calls.submit(0).result(timeout=60) == pid


def test_a_child_that_dies_fails_the_calls_and_close_still_returns() -> None:
    """A child killed mid-call (a crash, an operator's kill): the calls raise
    BrokenProcessPool, and close ends the other child, whose large result nobody
    reads any more, instead of waiting for it for ever."""
    before = children()

    def work(n: int) -> bytes:
        time.sleep(0.5)
        return bytes(n)

    calls = ForkedCalls(work, 2)
    pending = [calls.submit(8 << 20) for _ in range(2)]
    time.sleep(0.1)
    os.kill(sorted(children() - before)[0], signal.SIGKILL)
    errors = [f.exception(timeout=60) for f in pending]
    assert all(isinstance(e, BrokenProcessPool) for e in errors), errors
    t0 = time.monotonic()
    calls.close()
    assert time.monotonic() - t0 < 20
    assert not any(alive(p) for p in children() - before)


def test_a_child_never_frees_the_parents_pyav_frames() -> None:
    """Unreachable PyAV frames of the parent (a cycle the parent's collector had not
    reached at the fork) are left alone by the child's collector: freeing one frees a
    scaler that waits for the parent's slice threads, which a fork does not copy, and
    the child hung there for good (a clip job that never finished)."""
    script = textwrap.dedent(f"""
        import gc, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2] / "src")!r})
        import av, numpy as np
        from facefuse.video.processes import ForkedCalls
        gc.disable()
        frame = av.VideoFrame.from_ndarray(np.zeros((480, 640, 3), np.uint8), format="rgb24")
        scaled = frame.reformat(width=320, height=240, format="yuv420p")
        scaled.to_ndarray(format="rgb24")
        cycle = [frame, scaled]
        cycle.append(cycle)
        del frame, scaled, cycle
        with ForkedCalls(gc.collect, 1) as calls:
            print("done", calls.submit().result(timeout=30) >= 0)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done True"
