"""A real ``facefuse serve`` process on a free loopback port, for integration tests.

:class:`ServerProcess` starts ``python -m facefuse.cli serve`` with a clean
environment (no API keys, no Redis unless given), waits until ``/readyz`` answers
(uvicorn only listens after the models are loaded), and stops it with SIGTERM — the
same graceful shutdown a container runtime triggers. Server logs go to a file whose
tail is shown when a start fails.

:func:`photo_variants` makes distinct but face-preserving JPEGs from the sample
photos (flip, crop, resize, brightness), so concurrent requests miss every cache.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import numpy as np
from PIL import Image, ImageEnhance

ADMIN_TOKEN = "admin-token-0123456789abcdef"
USER_TOKEN = "user-token-0123456789abcdef"
#: Exit status after SIGTERM: uvicorn finishes its graceful shutdown, then re-raises
#: the signal it caught (so the status is -SIGTERM); 0 when it exits on its own.
GRACEFUL_EXIT = (0, -signal.SIGTERM)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """One server process; ``env`` adds FACEFUSE_* settings to a clean environment."""

    def __init__(self, home: Path, logdir: Path, env: Mapping[str, str] | None = None,
                 name: str = "server", args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.name = name
        self.args = tuple(args)
        self.log_path = logdir / f"{name}-{self.port}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("FACEFUSE_")}
        base.update({"FACEFUSE_HOME": str(home), "FACEFUSE_THREADS": "1",
                     "FACEFUSE_INFERENCE_WORKERS": "2", "FACEFUSE_CPU_WORKERS": "2"})
        base.update(env or {})
        self.env = base
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 120.0) -> ServerProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "facefuse.cli", "serve", "--host", "127.0.0.1",
                 "--port", str(self.port), *self.args],
                env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        end = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/readyz", timeout=2.0).status_code == 200:
                    return self
            if time.monotonic() > end:
                self.kill()
                raise RuntimeError(f"{self.name} not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.1)

    def client(self, token: str | None = None, timeout: float = 120.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    def terminate(self) -> None:
        """SIGTERM: graceful shutdown (returns at once)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.terminate()
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def peak_rss(self) -> int:
        """VmHWM of the server process, bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0


@contextlib.contextmanager
def graceful(server: ServerProcess) -> Iterator[ServerProcess]:
    """Start ``server``; on leaving, stop it and check that it shut down gracefully
    (its log tail in the failure message otherwise)."""
    server.start()
    try:
        yield server
    finally:
        code = server.stop()
        assert code in GRACEFUL_EXIT, server.log_tail()


@contextlib.contextmanager
def running(server: ServerProcess) -> Iterator[ServerProcess]:
    server.start()
    try:
        yield server
    finally:
        server.stop()


def photo_variants(images: Mapping[str, np.ndarray], n: int, *, seed: int = 0,
                   names: tuple[str, ...] = ("obama", "obama2", "biden", "obama3")) -> list[bytes]:
    """``n`` distinct JPEGs of the sample portraits: mirrored or not, cropped by a few
    percent, scaled 0.5-0.9 and brightened/darkened, each with one face."""
    rng = np.random.default_rng(seed)
    out: list[bytes] = []
    for i in range(n):
        rgb = images[names[i % len(names)]]
        im = Image.fromarray(rgb)
        if rng.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        w, h = im.size
        dx, dy = (int(rng.integers(0, max(1, int(v * 0.04)))) for v in (w, h))
        im = im.crop((dx, dy, w - int(rng.integers(0, max(1, int(w * 0.04)))),
                      h - int(rng.integers(0, max(1, int(h * 0.04))))))
        scale = float(rng.uniform(0.5, 0.9))
        im = im.resize((max(64, int(im.width * scale)), max(64, int(im.height * scale))))
        im = ImageEnhance.Brightness(im).enhance(float(rng.uniform(0.85, 1.15)))
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def metric_values(text: str, name: str) -> dict[str, float]:
    """``{label-string: value}`` of one metric in a Prometheus text exposition."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            rest = key[len(name):]
            if rest and rest[0] not in "{":
                continue
            values[rest] = float(value)
    return values


def batch_stats(text: str, model: str) -> tuple[float, float]:
    """(sum, count) of ``facefuse_batch_size`` for ``model``."""
    label = f'{{model="{model}"}}'
    total = metric_values(text, "facefuse_batch_size_sum").get(label, 0.0)
    count = metric_values(text, "facefuse_batch_size_count").get(label, 0.0)
    return total, count
