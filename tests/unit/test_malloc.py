"""The server's glibc malloc settings, observed in a child process's RSS."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Frees a 16 MB block (glibc then raises its mmap threshold past 8 MB unless it is
# pinned), then allocates and frees 8 MB blocks: from the heap they stay resident,
# each in its own mapping they go back. Prints the RSS growth in MB.
CHILD = """
import sys
import numpy as np
from facefuse.serving.run import pin_mmap_threshold
if sys.argv[1] == "pin":
    assert pin_mmap_threshold()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
big = np.ones(16 * 2**20, np.uint8); del big
before = rss()
keep = []
for _ in range(4):
    a = np.ones(8 * 2**20, np.uint8)
    keep.append(np.ones(64, np.uint8))  # a small block after it keeps the heap top in use
    del a
print(rss() - before)
"""


def _growth(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin"})
    return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_a_pinned_mmap_threshold_returns_freed_images_to_the_system() -> None:
    assert _growth("default") >= 7.0  # the freed 8 MB block stays in the heap
    assert _growth("pin") < 2.0


def test_the_glibc_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from facefuse.serving.run import pin_mmap_threshold

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1048576")
    assert pin_mmap_threshold() is False


# Allocates 64 MB in 64 KB blocks (each under the mmap threshold: they come from the
# heap), each followed by a small block that stays (so the free blocks cannot merge
# into the heap's top and be trimmed by free itself), frees the large ones, then (with
# "trim") releases the free heap. Prints the RSS left, MB, over the start.
TRIM_CHILD = """
import sys
from facefuse.serving.heap import release_free_heap
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
before = rss()
blocks, keep = [], []
for _ in range(1024):
    blocks.append(bytearray(64 * 1024))
    keep.append(bytearray(600))
del blocks
if sys.argv[1] == "trim":
    assert release_free_heap()
print(rss() - before)
"""


def _left(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", TRIM_CHILD, mode], capture_output=True,
                         text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_releasing_the_free_heap_returns_freed_small_blocks() -> None:
    assert _left("keep") >= 32.0  # freed heap pages stay resident
    assert _left("trim") < 16.0
