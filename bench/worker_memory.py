"""Benchmark: a job worker's memory at the largest clips it admits.

Starts a ``redis-server`` (no persistence) and one real ``facefuse worker``
(``FACEFUSE_THREADS=2``, as the deployments run it), then queues one clip job per
size (a moving face made with :mod:`facefuse.toolchain.clips`, H.264, 25 fps) the
way the API does (:meth:`JobStore.create` + :func:`enqueue`), one after the other.
While each runs, the worker's tree is sampled from ``/proc`` every 0.1 s: the sum over
the worker and its live children (the clip's render processes) of ``Pss`` from
``smaps_rollup`` (shared pages counted once, split among the processes mapping
them: what the tree takes from its container; the measure the worker's soft limit
uses, :func:`facefuse.serving.jobs.worker.tree_pss_mb`) and of ``VmRSS`` (pages shared
with a forked child counted again in each: an upper bound). Reported per job: the peak of
both sums, the worker's own peak RSS, and the tree's PSS when idle before and
after the job (memory given back).

Sizes are ``WxH[:FACE]``: ``FACE`` the face's width as a fraction of the frame's
shorter side (default 0.28, ~200 px at 720p as ``bench/video.py`` uses; 0.5 is a
face filling a phone clip). ``--env`` passes settings to the worker
(``FACEFUSE_...=...``).

    .venv/bin/python bench/worker_memory.py [--sizes 1280x720,1920x1080,1920x1920:0.5]
        [--frames 60] [--repeat 1] [--env FACEFUSE_X=Y] [--benchmarks]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.serving.jobs.worker import tree_pss_mb
from report import machine, machine_line, publish, write_json

DEFAULT_SIZES = "1280x720,1920x1080,1080x1920,1920x1920,1920x1920:0.5"
SOURCE, TARGET = "biden", "obama"


def tree_mb(pid: int) -> tuple[float, float, int]:
    """(Pss sum, Rss sum, children) MB over process ``pid`` and its live children."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                kids += [int(p) for p in (task / "children").read_text().split()]
    rss = sum(status_mb(p, "VmRSS") for p in [pid, *kids])
    return tree_pss_mb(pid), rss, len(kids)


def status_mb(pid: int, field: str) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def parse_size(text: str) -> tuple[int, int, float]:
    dims, _, face = text.partition(":")
    w, h = (int(x) for x in dims.lower().split("x"))
    return w, h, float(face or 0.28)


def make_clip(path: Path, w: int, h: int, face_frac: float, frames: int) -> Path:
    from facefuse import default_analyser
    from facefuse.config import Settings
    from facefuse.imaging.decode import decode_image
    from facefuse.toolchain.clips import Scene, motion_frames, write_clip

    settings = Settings.from_env()
    photo = decode_image(settings.samples_dir / f"{TARGET}.jpg")
    b = default_analyser(settings).analyse(photo, embed=False)[0].bbox
    face = (float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2, float(b[2] - b[0]))
    scene = Scene(photo, frames, face, size=(w, h), face_px=face_frac * min(w, h))
    return write_clip(path, motion_frames(scene))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(sizes: list[str], frames: int, repeat: int, env: dict[str, str]) -> dict[str, Any]:
    from facefuse.config import Settings
    from facefuse.serving.jobs.queue import broker, enqueue
    from facefuse.serving.jobs.store import JobStore

    tmp = Path(tempfile.mkdtemp(prefix="worker-memory-"))
    port = free_port()
    redis_proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    log_path = tmp / "worker.log"
    worker_env = {k: v for k, v in os.environ.items() if not k.startswith("FACEFUSE_")}
    worker_env.update({"FACEFUSE_JOBS_REDIS_URL": url, "FACEFUSE_THREADS": "2",
                       "PYTHONUNBUFFERED": "1", **env})
    if "FACEFUSE_HOME" in os.environ:
        worker_env["FACEFUSE_HOME"] = os.environ["FACEFUSE_HOME"]
    worker: subprocess.Popen[bytes] | None = None
    rows: list[dict[str, Any]] = []
    try:
        clips = {}
        for text in sizes:
            w, h, face = parse_size(text)
            clips[text] = make_clip(tmp / f"{w}x{h}-{face}.mp4", w, h, face, frames)
        time.sleep(0.5)
        with log_path.open("wb") as log:
            worker = subprocess.Popen([sys.executable, "-m", "facefuse.cli", "worker"],
                                      env=worker_env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL)
        end = time.monotonic() + 180
        while "ready" not in log_path.read_text(errors="replace"):
            if worker.poll() is not None or time.monotonic() > end:
                raise RuntimeError("worker did not start:\n" + log_path.read_text()[-4000:])
            time.sleep(0.2)
        settings = Settings(jobs_redis_url=url)
        store, queue = JobStore(settings), broker(settings)
        source = (settings.samples_dir / f"{SOURCE}.jpg").read_bytes()
        time.sleep(2.0)
        for _ in range(repeat):
            for text, clip in clips.items():
                idle_before = tree_mb(worker.pid)[0]
                job_id, _ = store.create("bench", "video",
                                         {"source": source, "clip": clip.read_bytes()},
                                         {}, frames)
                t0 = time.monotonic()
                enqueue(queue, job_id)
                pss = rss = 0.0
                kids = 0
                while (state := store.get(job_id).state) not in (
                        "succeeded", "failed", "cancelled"):
                    if worker.poll() is not None:
                        raise RuntimeError("worker died:\n" + log_path.read_text()[-4000:])
                    for _ in range(3):  # sampled every 0.1 s, the state read between
                        p, r, k = tree_mb(worker.pid)
                        pss, rss, kids = max(pss, p), max(rss, r), max(kids, k)
                        time.sleep(0.1)
                wall = time.monotonic() - t0
                time.sleep(1.5)
                w, h, face = parse_size(text)
                row = {"size": f"{w}x{h}", "face": face, "frames": frames, "state": state,
                       "peak_tree_pss_mb": round(pss), "peak_tree_rss_mb": round(rss),
                       "render_processes": kids,
                       "worker_peak_rss_mb": round(status_mb(worker.pid, "VmHWM")),
                       "idle_pss_before_mb": round(idle_before),
                       "idle_pss_after_mb": round(tree_mb(worker.pid)[0]),
                       "wall_s": round(wall, 1)}
                rows.append(row)
                print(row, flush=True)
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=60)
            if worker.poll() is None:
                worker.kill()
        redis_proc.terminate()
        redis_proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"machine": machine(), "frames": frames, "env": env, "runs": rows}


def section(data: dict[str, Any]) -> list[str]:
    env = " ".join(f"{k}={v}" for k, v in data["env"].items())
    lines = [
        "## Worker memory at the largest admitted clips",
        "",
        f"`.venv/bin/python bench/worker_memory.py` ({data['frames']} frames a clip"
        + (f", worker with `{env}`" if env else "") + f"); {machine_line(data['machine'])}.",
        "One real `facefuse worker` (`FACEFUSE_THREADS=2`), its jobs queued as the API "
        "queues them; the worker's tree (the worker and its render processes) sampled "
        "from `/proc/<pid>/smaps_rollup` every 0.1 s.",
        "",
        "| clip | face (of short side) | peak PSS MB (tree) | peak RSS MB (summed) | "
        "worker peak RSS MB | idle PSS before → after MB | state |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["runs"]:
        lines.append(f"| {r['size']} | {r['face']:.2f} | {r['peak_tree_pss_mb']} | "
                     f"{r['peak_tree_rss_mb']} | {r['worker_peak_rss_mb']} | "
                     f"{r['idle_pss_before_mb']} → {r['idle_pss_after_mb']} | {r['state']} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="WxH[:FACE], comma separated")
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--env", action="append", default=[], metavar="FACEFUSE_X=Y")
    ap.add_argument("--out", help="write worker_memory.json here instead of bench/results/")
    ap.add_argument("--benchmarks", action="store_true", help="write BENCHMARKS.md's section")
    args = ap.parse_args()
    env = dict(e.split("=", 1) for e in args.env)
    data = run(args.sizes.split(","), args.frames, args.repeat, env)
    write_json("worker_memory", data, args.out)
    lines = section(data)
    if args.benchmarks:
        publish("worker_memory", lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
