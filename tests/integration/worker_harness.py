"""Real ``facefuse worker`` processes for the job tests.

:class:`WorkerProcess` starts ``python -m facefuse.cli worker`` with a clean
environment pointed at a test Redis, waits for its "ready" line (printed once the
models are loaded and it consumes the queue), and can be stopped with SIGTERM or
killed with SIGKILL, as a container runtime or a lost node would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx


class WorkerProcess:
    """One worker process; ``env`` adds FACEFUSE_* settings to a clean environment."""

    def __init__(self, home: Path, logdir: Path, redis_url: str,
                 env: Mapping[str, str] | None = None, name: str = "worker") -> None:
        self.name = name
        self.log_path = logdir / f"{name}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("FACEFUSE_")}
        base.update({"FACEFUSE_HOME": str(home), "FACEFUSE_THREADS": "1",
                     "FACEFUSE_JOBS_REDIS_URL": redis_url, "FACEFUSE_JOBS_HEARTBEAT_S": "2",
                     "FACEFUSE_SHUTDOWN_GRACE_S": "1", "PYTHONUNBUFFERED": "1"})
        base.update(env or {})
        self.env = base
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> WorkerProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "facefuse.cli", "worker"],
                                         env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        wait_for(lambda: "ready" in self.log_tail() or self.proc.poll() is not None,  # type: ignore[union-attr]
                 timeout, f"{self.name} not ready")
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                               f"{self.log_tail()}")
        return self

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def wait(self, timeout: float = 60.0) -> int:
        """The exit status; a process still running after ``timeout`` s fails the
        test with its log, every thread's stack first written there (SIGUSR1)."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            raise AssertionError(f"{self.name} still running after {timeout:.0f} s:\n"
                                 f"{self.log_tail(20000)}") from None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def wait_for(predicate: Callable[[], bool], timeout: float, what: str,
             every: float = 0.2) -> None:
    """Poll ``predicate`` until true; RuntimeError(``what``) after ``timeout`` seconds
    (a bound on a hang, not a speed check)."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise RuntimeError(what)
        time.sleep(every)


def job_state(client: httpx.Client, location: str) -> dict[str, Any]:
    r = client.get(location)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def wait_state(client: httpx.Client, location: str, states: set[str],
               timeout: float = 240.0) -> dict[str, Any]:
    """Poll the job until its status is one of ``states``; returns its body."""
    seen: dict[str, Any] = {}

    def done() -> bool:
        seen.update(job_state(client, location))
        return seen["status"] in states

    with contextlib.suppress(RuntimeError):
        wait_for(done, timeout, "job state")
    assert seen.get("status") in states, seen
    return seen
