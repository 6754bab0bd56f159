"""This test process's children, read from /proc (Linux)."""

from __future__ import annotations

import contextlib
from pathlib import Path


def children() -> set[int]:
    """The pids of this process's children now (zombies included)."""
    pids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids |= {int(p) for p in (task / "children").read_text().split()}
    return pids


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
