"""Run a built container image's entrypoint without a container runtime.

``podman run`` cannot start containers in this sandbox, so the image is checked the
way a runtime would start it, minus the namespaces: its root filesystem is mounted
(``podman image mount``, read-only), ``/proc`` and ``/dev`` are bound in, ``/tmp``
is a fresh tmpfs (what Kubernetes' ``readOnlyRootFilesystem`` plus an ``emptyDir``
gives), and the entrypoint runs under ``chroot`` as the image's ``USER`` with exactly
the image's ``ENV``. Only loopback networking is shared with the host. Nothing from
the host's Python, virtual environment or models is visible to it.

Needs root (mounts and chroot) and podman.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an OCI image config that decide how its process starts."""

    user: str
    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    workdir: str
    labels: dict[str, str]
    healthcheck: list[str]
    stop_signal: str


def inspect(ref: str) -> ImageConfig:
    out = subprocess.run(["podman", "image", "inspect", ref], check=True,
                         capture_output=True, text=True).stdout
    info = json.loads(out)[0]
    cfg = info["Config"]
    env = dict(item.split("=", 1) for item in cfg.get("Env") or [])
    # podman reports it at the top level; docker under Config.
    health = info.get("Healthcheck") or cfg.get("Healthcheck") or {}
    return ImageConfig(
        user=cfg.get("User") or "0:0",
        env=env,
        entrypoint=list(cfg.get("Entrypoint") or []),
        cmd=list(cfg.get("Cmd") or []),
        workdir=cfg.get("WorkingDir") or "/",
        labels=dict(cfg.get("Labels") or {}),
        healthcheck=list(health.get("Test") or []),
        stop_signal=cfg.get("StopSignal") or "",
    )


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


@contextlib.contextmanager
def mounted(ref: str) -> Iterator[Path]:
    """The image's root filesystem, with /proc, /dev and a tmpfs /tmp mounted in."""
    root = Path(subprocess.run(["podman", "image", "mount", ref], check=True,
                               capture_output=True, text=True).stdout.strip())
    done: list[Path] = []
    try:
        for src, dst in (("/proc", root / "proc"), ("/dev", root / "dev")):
            _run("mount", "--rbind", src, str(dst))
            done.append(dst)
        _run("mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "tmpfs", str(root / "tmp"))
        done.append(root / "tmp")
        yield root
    finally:
        for path in reversed(done):
            subprocess.run(["umount", "-R", "-l", str(path)], check=False, capture_output=True)
        subprocess.run(["podman", "image", "unmount", ref], check=False, capture_output=True)


class ChrootProcess:
    """The image's entrypoint running under chroot as the image's user."""

    def __init__(self, root: Path, config: ImageConfig, args: Sequence[str], log_path: Path,
                 extra_env: dict[str, str] | None = None) -> None:
        user = config.user if ":" in config.user else f"{config.user}:{config.user}"
        env = {**config.env, **(extra_env or {})}
        argv = [*config.entrypoint, *args]
        # env -i: only the image's environment; cd: the image's WORKDIR.
        inner = ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()),
                 "sh", "-c", 'cd "$0" && exec "$@"', config.workdir, *argv]
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                ["chroot", f"--userspec={user}", str(root), *inner],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )

    def wait_ready(self, url: str, timeout: float = 120.0) -> float:
        """Seconds from start until ``url`` answered 200."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return time.monotonic() - start
            time.sleep(0.05)
        raise RuntimeError(f"not ready after {timeout}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 40.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def can_mount() -> bool:
    return os.geteuid() == 0
