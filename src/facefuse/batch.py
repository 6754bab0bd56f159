"""Batch fusion for the command line: many targets, one mapping of sources.

``facefuse fuse SOURCE... --targets DIR|GLOB|FILE ... --out-dir OUT`` fuses the
source(s) into every target; ``--pairs pairs.csv`` takes ``source,target[,output]``
rows instead (outputs must stay under ``--out-dir`` unless ``--allow-outside-out-dir``).

* Each output is written atomically (temp file + rename) with the umask's
  permissions, so a rerun never sees half a file; a rerun skips every output that
  exists *and decodes* (resume), and redoes a leftover that does not (empty, cut short).
* One bad file never stops the batch: a bad target, source or row, and an output that
  cannot be written, are recorded with their error code and the batch goes on; they
  are listed at the end (and in ``--json-report``).
* Memory is flat in the number of files: at most ``2 × --jobs`` targets are queued at
  a time, and a finished job keeps nothing but its path and code. ``--jobs N`` fuses
  N targets at a time on one shared :class:`FaceFuser` (memory grows with N only).
* Stopping (``stop`` set: the CLI's first Ctrl-C): no new target starts, the ones in
  flight finish, and the report (``interrupted``) is written; see
  :func:`remove_temporaries` for the second Ctrl-C.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from facefuse.errors import FacefuseError, InvalidArgumentError
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.mapping import FacePair
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import DecodeLimits, check_header, decode_image
from facefuse.imaging.encode import format_from_path
from facefuse.imaging.output import OutputPolicy
from facefuse.runtime.files import atomic_write_bytes

__all__ = ["BatchJob", "BatchReport", "collect_pairs", "collect_targets",
           "remove_temporaries", "run_batch"]

#: Image suffixes a target directory is scanned for.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


@dataclass(frozen=True)
class BatchJob:
    """One fusion: source image(s) into one target, written to ``output``."""

    sources: tuple[Path, ...]
    target: Path
    output: Path


@dataclass
class BatchReport:
    """What a batch did: outputs written, skipped as already done, failures by code."""

    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    #: Leftover outputs that did not decode (empty, cut short) and were done again.
    redone: list[str] = field(default_factory=list)
    #: Stopped before every job ran (the first Ctrl-C); ``not_started`` jobs left.
    interrupted: bool = False
    not_started: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "skipped": self.skipped, "failed": self.failed,
                "redone": self.redone,
                "counts": {"done": len(self.done), "skipped": len(self.skipped),
                           "failed": len(self.failed), "not_started": self.not_started},
                "interrupted": self.interrupted,
                "seconds": round(self.seconds, 2)}


def collect_targets(specs: Iterable[str]) -> list[Path]:
    """Files named by ``specs``: a directory (its images, sorted), a glob, or a file."""
    out: list[Path] = []
    for spec in specs:
        p = Path(spec)
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir()
                              if q.is_file() and q.suffix.lower() in IMAGE_SUFFIXES))
        elif any(ch in spec for ch in "*?["):
            out.extend(Path(m) for m in sorted(glob.glob(spec, recursive=True))
                       if Path(m).is_file())
        else:
            out.append(p)  # a missing file is reported per job, not fatal
    seen: set[Path] = set()
    return [p for p in out if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def plan_jobs(sources: Sequence[Path], targets: Sequence[Path], out_dir: Path,
              suffix: str) -> list[BatchJob]:
    """One job per target; outputs ``out_dir/<target stem>.<suffix>`` (``-2``, ``-3``
    ... appended when two targets share a stem)."""
    used: dict[str, int] = {}
    jobs = []
    for t in targets:
        n = used[t.stem] = used.get(t.stem, 0) + 1
        name = t.stem if n == 1 else f"{t.stem}-{n}"
        jobs.append(BatchJob(tuple(sources), t, out_dir / f"{name}.{suffix}"))
    return jobs


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def collect_pairs(csv_path: Path, out_dir: Path, suffix: str, *,
                  allow_outside: bool = False) -> list[BatchJob]:
    """Jobs from a CSV of ``source,target[,output]`` rows (a header row naming
    ``source`` is skipped); relative paths are relative to the CSV's directory, and
    relative outputs to ``out_dir``.

    Raises:
        InvalidArgumentError: ``invalid_pairs`` for a malformed row;
            ``output_outside_out_dir`` for an output that is absolute or leaves
            ``out_dir`` (``..``, a link), unless ``allow_outside``.
    """
    base = csv_path.parent
    jobs: list[BatchJob] = []
    targets: list[Path] = []
    sources: list[Path] = []
    outputs: list[str | None] = []
    try:
        with csv_path.open(newline="") as fh:
            for n, row in enumerate(csv.reader(fh), 1):
                cells = [c.strip() for c in row]
                if not any(cells) or (n == 1 and cells and cells[0].lower() == "source"):
                    continue
                if len(cells) not in (2, 3):
                    raise InvalidArgumentError(
                        f"{csv_path}:{n}: expected source,target[,output], got {len(cells)} "
                        "column(s)", code="invalid_pairs")
                sources.append(base / cells[0])
                targets.append(base / cells[1])
                outputs.append(cells[2] if len(cells) == 3 and cells[2] else None)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read {csv_path}: {exc.strerror}",
                                   code="invalid_pairs") from None
    planned = plan_jobs([], targets, out_dir, suffix)
    for n, (src, plan, out) in enumerate(zip(sources, planned, outputs, strict=True), 1):
        output = out_dir / out if out else plan.output
        if not allow_outside and not _inside(output, out_dir):
            raise InvalidArgumentError(
                f"{csv_path}: pair {n}: output {out!r} is outside --out-dir {out_dir} "
                "(use --allow-outside-out-dir to allow it)", code="output_outside_out_dir")
        jobs.append(BatchJob((src,), plan.target, output))
    return jobs


#: Temporary files being written by this process (removed by :func:`remove_temporaries`).
_TEMPORARIES: set[str] = set()
_TEMP_LOCK = threading.Lock()


def _umask_mode() -> int:
    """``0o666`` less the process umask: the mode a plain ``open()`` would give."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _write_output(path: Path, data: bytes, mode: int) -> None:
    """:func:`atomic_write_bytes`, its temporary file known to :func:`remove_temporaries`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with _TEMP_LOCK:
        _TEMPORARIES.add(tmp)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        with _TEMP_LOCK:
            _TEMPORARIES.discard(tmp)
        if os.path.exists(tmp):
            os.unlink(tmp)


def remove_temporaries() -> int:
    """Delete every output temporary file still being written (a second Ctrl-C, just
    before exiting without waiting for the jobs); returns how many were removed."""
    with _TEMP_LOCK:
        pending = list(_TEMPORARIES)
        _TEMPORARIES.clear()
    removed = 0
    for tmp in pending:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
            removed += 1
    return removed


def _output_ok(path: Path) -> bool:
    """True when ``path`` is an image that decodes whole (a finished output)."""
    try:
        return path.stat().st_size > 0 and decode_image(path).size > 0
    except (FacefuseError, OSError, ValueError):
        return False


def _failure(job: BatchJob, exc: BaseException) -> dict[str, str]:
    if isinstance(exc, FacefuseError):
        return {"target": str(job.target), "code": exc.code, "message": exc.message}
    if isinstance(exc, OSError):
        where = exc.filename if exc.filename is not None else job.output
        return {"target": str(job.target), "code": "file_error",
                "message": f"{exc.strerror or type(exc).__name__}: {where}"}
    return {"target": str(job.target), "code": "internal_error",
            "message": f"{type(exc).__name__}: {exc}"}


def run_batch(
    fuser: FaceFuser,
    jobs: Sequence[BatchJob],
    options: FuseOptions,
    output: OutputPolicy,
    *,
    quality: int = 92,
    mapping: Sequence[FacePair] | None = None,
    n_jobs: int = 1,
    overwrite: bool = False,
    progress: Callable[[BatchJob, str], None] | None = None,
    stop: threading.Event | None = None,
) -> BatchReport:
    """Run ``jobs``; never raises for one bad file or one unwritable output (each is
    recorded in the report). When ``stop`` is set no new job starts; the report then
    says ``interrupted`` and how many did not start."""
    report = BatchReport()
    t0 = time.perf_counter()
    mode = _umask_mode()
    stop = stop or threading.Event()
    limits = DecodeLimits.from_settings(fuser.settings)

    def one(job: BatchJob) -> str:
        fmt = format_from_path(job.output)
        if not overwrite and job.output.exists():
            if _output_ok(job.output):
                return "skipped"
            status = "redone"  # a leftover of an interrupted run: do it again
        else:
            status = "done"
        for p in (*job.sources, job.target):
            if not p.is_file():
                raise InvalidArgumentError(f"no such file: {p}", code="file_not_found")
        target = job.target.read_bytes()
        # An empty, foreign or oversized target is refused before the sources work.
        check_header(target, limits)
        result = fuser.fuse(list(job.sources), target, options, mapping=mapping)
        del target
        _write_output(job.output, output.encode(result.image, fmt, quality), mode)
        return status

    def record(job: BatchJob, fut: Future[str]) -> None:
        exc = fut.exception()
        if exc is not None:
            report.failed.append(_failure(job, exc))
            status = "failed"
        else:
            status = fut.result()
            if status == "skipped":
                report.skipped.append(str(job.output))
            else:
                report.done.append(str(job.output))
                if status == "redone":
                    report.redone.append(str(job.output))
                    status = "done"
        if progress:
            progress(job, status)

    todo: Iterator[BatchJob] = iter(jobs)
    window = 2 * max(1, n_jobs)
    with ThreadPoolExecutor(max(1, n_jobs), thread_name_prefix="ff-batch") as pool:
        running: dict[Future[str], BatchJob] = {}
        while True:
            while not stop.is_set() and len(running) < window:
                job = next(todo, None)
                if job is None:
                    break
                running[pool.submit(one, job)] = job
            if not running:
                break
            if stop.is_set():  # queued, not started: they stay not started
                for fut in [f for f in running if f.cancel()]:
                    del running[fut]
                    report.not_started += 1
                if not running:
                    break
            finished, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in finished:
                # Kept: the path and a code. The future (and any exception with its
                # traceback, which holds the frames' decoded images) goes now.
                record(running.pop(fut), fut)
    report.not_started += sum(1 for _ in todo)
    report.interrupted = stop.is_set() and report.not_started > 0
    report.done.sort()
    report.failed.sort(key=lambda f: f["target"])
    report.seconds = time.perf_counter() - t0
    return report


def write_report(report: BatchReport, path: Path) -> None:
    """The JSON report, atomically."""
    atomic_write_bytes(path, (json.dumps(report.to_dict(), indent=2) + "\n").encode())


def default_jobs() -> int:
    """One job per core, at most 4 (each holds a decoded target and its layers)."""
    return max(1, min(4, os.cpu_count() or 1))
