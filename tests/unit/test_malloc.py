"""The server's glibc malloc settings, observed in a child process's RSS; OpenCV's pool spin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


# With the mmap threshold pinned as the server pins it, allocates, touches and frees a
# 2 MB block (under that threshold: from the heap) 50 times; a small block allocated
# before keeps the heap from shrinking below it. Prints the page faults of the loop.
FAULT_CHILD = """
import resource, sys
import numpy as np
from facefuse.serving.run import pin_mmap_threshold, pin_trim_threshold
assert pin_mmap_threshold()
if sys.argv[1] == "pin":
    assert pin_trim_threshold()
keep = np.ones(64, np.uint8)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    a = np.ones(2 * 2**20, np.uint8)
    del a
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", FAULT_CHILD, mode], capture_output=True,
                         text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_a_pinned_trim_threshold_keeps_freed_buffers_for_the_next_request() -> None:
    # 2 MB is 512 pages: given back on every free, every loop faults them in again.
    assert _faults("default") >= 50 * 400
    assert _faults("pin") < 2000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_the_glibc_trim_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from facefuse.serving.run import pin_trim_threshold

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    assert pin_trim_threshold() is False


def _opencv_wait(env: dict[str, str]) -> str:
    child = ("import os, facefuse, cv2; "
             "print(os.environ['OPENCV_THREAD_POOL_ACTIVE_WAIT_WORKER'])")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin", **env})
    return out.stdout.strip()


def test_opencv_pool_workers_sleep_between_calls_unless_told_otherwise() -> None:
    # Read by OpenCV when cv2 is imported: facefuse sets it first, a user's value wins.
    assert _opencv_wait({}) == "0"
    assert _opencv_wait({"OPENCV_THREAD_POOL_ACTIVE_WAIT_WORKER": "2000"}) == "2000"
    # First: no facefuse module imports cv2 on `import facefuse` itself ...
    child = "import sys, facefuse; print('cv2' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "False"
    # ... and the OpenCV in use still reads that very variable.
    import cv2

    modules = [p for p in Path(cv2.__file__).parent.glob("*.so") if p.is_file()]
    assert any(b"OPENCV_THREAD_POOL_ACTIVE_WAIT_WORKER" in p.read_bytes() for p in modules)
