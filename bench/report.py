"""Shared benchmark plumbing: machine description, medians, BENCHMARKS.md sections."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from facefuse.toolchain import reporting
from facefuse.toolchain.host import describe, describe_line

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
RESULTS = ROOT / "bench" / "results"


def machine() -> dict[str, Any]:
    """CPU model, core count, flags of interest, Python and onnxruntime versions."""
    return describe()


def median_ms(fn: Callable[[], object], repeat: int, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in milliseconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def write_json(name: str, data: dict[str, Any], out: str | Path | None = None) -> Path:
    """``data`` as ``name``.json in bench/results/, or in ``out`` when given."""
    where = RESULTS if out is None else Path(out)
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def write_section(name: str, markdown: str) -> None:
    """Replace (or append) section ``name`` of BENCHMARKS.md."""
    reporting.write_section(BENCHMARKS, name, markdown)


def publish(name: str, lines: list[str]) -> None:
    """Write ``lines`` as section ``name`` of BENCHMARKS.md and print them."""
    markdown = "\n".join(lines)
    write_section(name, markdown)
    print(markdown)


def machine_line(m: dict[str, Any]) -> str:
    """One line naming the machine of ``m`` (see :func:`machine`)."""
    return describe_line(m)


@contextmanager
def worker_at(script: str, flag: str, src: Path,
              wait_s: float = 60.0) -> Iterator[tuple[IO[str], IO[str]]]:
    """``python script flag`` importing facefuse from ``src``: its (stdin, stdout),
    line-oriented; stdin closed and the process awaited (``wait_s``) on exit."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen([sys.executable, script, flag], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        yield proc.stdin, proc.stdout
    finally:
        proc.stdin.close()
        proc.wait(wait_s)


def detection_photos(base: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The decoded sample photos and face-free photos (name -> RGB uint8) of the
    detection benches, fetched under ``base`` (a :class:`facefuse.config.Settings`)."""
    from facefuse.imaging.decode import decode_image
    from facefuse.toolchain.detection_sets import fetch_face_free
    from facefuse.toolchain.samples import fetch_samples

    photos = {n: decode_image(p) for n, p in
              fetch_samples(base.samples_dir, base.downloads_dir).items()}
    face_free = {n: decode_image(p) for n, p in
                 fetch_face_free(base.home / "face-free", base.downloads_dir).items()}
    return photos, face_free


def rev_arguments(doc: str, rounds: int) -> argparse.ArgumentParser:
    """The parser of a commit-against-commit bench (``doc``: its module docstring):
    ``--base`` (the commit the ratios are to), ``--also`` (more commits), ``--rounds``
    (default ``rounds``) and the hidden ``--worker``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD~1", help="the commit the ratios are to")
    ap.add_argument("--also", action="append", default=[], help="another commit to time")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap
