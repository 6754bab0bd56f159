"""Real servers on loopback for integration tests.

``client`` is a module's ``server`` (each server test module starts its own, with
the settings it tests) seen through an HTTP client holding the user API key;
``photos`` are the sample photos' encoded bytes.

``redis_server`` starts the Debian ``redis-server`` binary (installed by
``scripts/install-system-deps.sh``, which ``make test`` runs) on a free loopback
port, with persistence off and its files in a temporary directory, and yields a
:class:`RedisServer` handle that can kill, stop, restart, pause and resume it.
``redis_factory`` makes more, each with its own directory and extra arguments
(``("--appendonly", "yes")`` for a persistent one).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from server_harness import USER_TOKEN, ServerProcess


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client(USER_TOKEN) as c:
        yield c


@pytest.fixture(scope="module")
def photos(sample_paths: dict[str, Path]) -> dict[str, bytes]:
    return {name: path.read_bytes() for name, path in sample_paths.items()}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis_ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A redis-server process on ``127.0.0.1:<port>``; the port survives restarts."""

    def __init__(self, binary: str, workdir: Path, args: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.workdir = workdir
        self.extra = args
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> None:
        """Start (or restart) the server and wait until it answers PING."""
        if self.proc is not None and self.proc.poll() is None:
            return
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--logfile",
            str(self.log_path),
            "--protected-mode",
            "yes",
            *self.extra,
        ]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        end = time.monotonic() + timeout
        while not _redis_ping(self.port):
            if self.proc.poll() is not None:
                log = (
                    self.log_path.read_text(errors="replace")[-2000:]
                    if self.log_path.exists()
                    else ""
                )
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {log}")
            if time.monotonic() > end:
                raise RuntimeError(f"redis-server did not answer on port {self.port}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the server (an unclean crash) and reap it."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM: a clean shutdown (a persistent server writes its files first)."""
        if self.proc is None:
            return
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.proc = None

    def info(self, section: str) -> dict[str, str]:
        """``INFO <section>`` as a dict (through a plain socket)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(f"INFO {section}\r\n".encode())
            data = b""
            while b"\r\n" not in data:
                data += s.recv(65536)
            head, _, data = data.partition(b"\r\n")
            size = int(head[1:])  # a bulk string: $<length>
            while len(data) < size + 2:
                data += s.recv(65536)
        out = {}
        for line in data[:size].decode().splitlines():
            key, sep, value = line.partition(":")
            if sep:
                out[key] = value
        return out

    def pause(self) -> None:
        """SIGSTOP: the port stays open but nothing answers (a 'slow' Redis)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


def _redis_binary() -> str:
    binary = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if binary is None:
        pytest.fail("redis-server is not installed: run `bash scripts/install-system-deps.sh`")
    return binary


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free loopback port, stopped after the test."""
    server = RedisServer(_redis_binary(), tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """``make(*args)``: another started redis-server (own directory, extra arguments,
    which may override the defaults: the last ``--save`` / ``--appendonly`` wins)."""
    made: list[RedisServer] = []

    def make(*args: str) -> RedisServer:
        workdir = tmp_path / f"redis-{len(made)}"
        workdir.mkdir()
        server = RedisServer(_redis_binary(), workdir, args)
        made.append(server)
        server.start()
        return server

    try:
        yield make
    finally:
        for server in made:
            server.kill()
