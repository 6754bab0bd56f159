"""Batch fusion for the command line: many targets, one mapping of sources.

``facefuse fuse SOURCE... --targets DIR|GLOB|FILE ... --out-dir OUT`` fuses the
source(s) into every target; ``--pairs pairs.csv`` takes ``source,target[,output]``
rows instead. Each output is written atomically (temp file + rename), so a rerun
skips every output that exists (resume) and never sees half a file. Bad files are
skipped, and listed at the end with their error code (and in ``--json-report``).
``--jobs N`` fuses N targets at a time on one shared :class:`FaceFuser` (each job
holds one decoded target and its layers: memory grows with N, not with the
number of targets).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from facefuse.errors import FacefuseError, InvalidArgumentError
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.mapping import FacePair
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.encode import format_from_path
from facefuse.imaging.output import OutputPolicy
from facefuse.runtime.files import atomic_write_bytes

__all__ = ["BatchJob", "BatchReport", "collect_pairs", "collect_targets", "run_batch"]

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
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "skipped": self.skipped, "failed": self.failed,
                "counts": {"done": len(self.done), "skipped": len(self.skipped),
                           "failed": len(self.failed)},
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


def collect_pairs(csv_path: Path, out_dir: Path, suffix: str) -> list[BatchJob]:
    """Jobs from a CSV of ``source,target[,output]`` rows (a header row naming
    ``source`` is skipped); relative paths are relative to the CSV's directory, and
    relative outputs to ``out_dir``."""
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
    for src, plan, out in zip(sources, planned, outputs, strict=True):
        jobs.append(BatchJob((src,), plan.target, out_dir / out if out else plan.output))
    return jobs


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
) -> BatchReport:
    """Run ``jobs``; never raises for one bad file (it is recorded in the report)."""
    report = BatchReport()
    t0 = time.perf_counter()
    todo = []
    for job in jobs:
        if job.output.exists() and not overwrite:
            report.skipped.append(str(job.output))
            if progress:
                progress(job, "skipped")
        else:
            todo.append(job)

    def one(job: BatchJob) -> None:
        fmt = format_from_path(job.output)
        for p in (*job.sources, job.target):
            if not p.is_file():
                raise InvalidArgumentError(f"no such file: {p}", code="file_not_found")
        result = fuser.fuse(list(job.sources), job.target, options, mapping=mapping)
        atomic_write_bytes(job.output, output.encode(result.image, fmt, quality))

    with ThreadPoolExecutor(max(1, n_jobs), thread_name_prefix="ff-batch") as pool:
        futures = {pool.submit(one, job): job for job in todo}
        for fut in as_completed(futures):
            job = futures[fut]
            try:
                fut.result()
            except FacefuseError as exc:
                report.failed.append({"target": str(job.target), "code": exc.code,
                                      "message": exc.message})
                status = "failed"
            else:
                report.done.append(str(job.output))
                status = "done"
            if progress:
                progress(job, status)
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
