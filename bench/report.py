"""The benches' one harness: what every script in bench/ shares.

* the machine: :func:`machine`, :func:`machine_line`, :func:`load1`;
* timing: :func:`median_ms` (median wall time of repeats), :func:`wall_cpu_ms` (one
  call's wall and CPU time);
* timing pairs side by side: another commit's ``src/`` in a worker process
  (:func:`short_rev`, :func:`export_src`, :func:`rev_workers`, :func:`revs_to_time`,
  :func:`rev_arguments`), answering JSON lines (:func:`answer_requests` in the worker,
  :func:`ask` in the bench), the order reversed every round (:func:`alternate`), and
  the median of the per-pair ratios (:func:`paired_ratio`): a shared host's speed
  drifts by tens of percent between runs, and two jobs run side by side see the same
  host;
* results: :func:`write_json` (bench/results/NAME.json, or another folder) and the
  BENCHMARKS.md sections (:func:`write_section`, :func:`publish`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

from facefuse.toolchain import reporting
from facefuse.toolchain.host import describe, describe_line

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
RESULTS = ROOT / "bench" / "results"


def machine() -> dict[str, Any]:
    """CPU model, core count, flags of interest, Python and onnxruntime versions."""
    return describe()


def load1() -> float:
    """The 1-minute load average (how busy the shared host was)."""
    return float(Path("/proc/loadavg").read_text().split()[0])


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


def wall_cpu_ms(fn: Callable[[], object], repeat: int = 1) -> dict[str, float]:
    """``{"wall", "cpu"}``: ms of wall and of this process's CPU time per call of
    ``fn()``, over ``repeat`` calls."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(repeat):
        fn()
    return {"wall": (time.perf_counter() - w0) * 1000.0 / repeat,
            "cpu": (time.process_time() - c0) * 1000.0 / repeat}


def write_json(name: str, data: dict[str, Any], out: str | Path | None = None) -> Path:
    """``data`` as ``name``.json in bench/results/, or in ``out`` when given."""
    where = RESULTS if out is None else Path(out)
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{name}.json"
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def arguments(args: argparse.Namespace) -> dict[str, Any]:
    """A run's command-line options as JSON values (paths as strings), for its result."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


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


def parser(doc: str) -> argparse.ArgumentParser:
    """A bench's command-line parser, described by the first paragraph of ``doc`` (its
    module docstring); ``--help`` then says what it measures and runs nothing."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def rev_arguments(doc: str, rounds: int) -> argparse.ArgumentParser:
    """The parser of a commit-against-commit bench (``doc``: its module docstring):
    ``--base`` (the commit the ratios are to), ``--also`` (more commits), ``--rounds``
    (default ``rounds``) and the hidden ``--worker``."""
    ap = parser(doc)
    ap.add_argument("--base", default="HEAD~1", help="the commit the ratios are to")
    ap.add_argument("--also", action="append", default=[], help="another commit to time")
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap


# --- timing pairs side by side: other commits in worker processes ----------------------

def short_rev(rev: str) -> str:
    """The short commit id of ``rev`` in this checkout."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev],
                          check=True, capture_output=True, text=True).stdout.strip()


def export_src(rev: str, into: Path) -> Path:
    """``rev``'s ``src/`` tree written under ``into``; returns the ``src`` path."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "src"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def revs_to_time(base: str, also: Sequence[str] = ()) -> list[str]:
    """The commits a side-by-side bench times: ``base`` first (the ratios are to it),
    then ``also``, then ``checkout`` (this tree)."""
    return [short_rev(base), *(short_rev(r) for r in also), "checkout"]


def rev_workers(script: str, revs: list[str], tmp: Path, stack: contextlib.ExitStack,
                wait_s: float = 120.0) -> dict[str, tuple[IO[str], IO[str]]]:
    """One ``script --worker`` process per rev of ``revs`` (``checkout``: this tree's
    ``src/``, else the rev's exported under ``tmp``), each past its ``ready`` line:
    rev -> (stdin, stdout), closed with ``stack``."""
    workers: dict[str, tuple[IO[str], IO[str]]] = {}
    for r in revs:
        src = ROOT / "src" if r == "checkout" else export_src(r, tmp / r)
        workers[r] = stack.enter_context(worker_at(script, "--worker", src, wait_s=wait_s))
        assert workers[r][1].readline().startswith("ready")
    return workers


def answer_requests(handle: Callable[[dict[str, Any]], object], ready: bool = True) -> None:
    """A worker's loop: (a ``ready`` line, then) one JSON answer line per JSON request
    line on stdin, ``handle(request)``'s, until stdin closes."""
    if ready:
        print("ready", flush=True)
    for line in sys.stdin:
        print(json.dumps(handle(json.loads(line))), flush=True)


def ask(worker: tuple[IO[str], IO[str]], q: dict[str, Any]) -> Any:
    """One request to a worker (its (stdin, stdout)) and its answer."""
    worker[0].write(json.dumps(q) + "\n")
    worker[0].flush()
    return json.loads(worker[1].readline())


def alternate(items: Sequence[T], round_: int) -> Iterable[T]:
    """``items`` in order in even rounds, reversed in odd ones (neither side always first)."""
    return items if round_ % 2 == 0 else items[::-1]


def paired_ratio(xs: Iterable[float], ys: Iterable[float]) -> float:
    """The median of ``x / y`` over pairs measured side by side."""
    return statistics.median(x / y for x, y in zip(xs, ys, strict=True))
