"""A clip frame's CPU on several commits, interleaved frame by frame.

Each commit's ``src/`` runs in its own worker process (the same virtual
environment and models), with OpenCV's pool off as a clip process runs. Every
worker decodes the same 720p clip of the bench's moving face (``bench/video.py``'s,
biden fused onto obama) and runs ``ClipFusion.process`` over its frames in order,
the workers taking each frame in turn, the order reversed every frame; each round
starts a new clip state, its first frame untimed. The figures are medians of the
per-frame ratios to the first commit: a shared host's speed drifts by tens of
percent between runs, and two frames processed side by side see the same host.
The codecs are not timed (``bench/video.py --profile`` measures them).

    .venv/bin/python bench/clip_ab.py --base HEAD~1 [--also REV] [--rounds 2] [--out DIR]

Prints the table and writes bench/results/clip_ab.json (or DIR/clip_ab.json).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The clip's length in frames and height.
FRAMES, HEIGHT = 60, 720


def worker() -> None:
    """After a ``ready`` line, answer one JSON line per request: ``{"clip": path}``
    decodes the clip (its frame count),
    ``{"reset": true}`` starts a new clip state and processes frame 0 untimed, ``{"i":
    k}`` processes frame ``k`` and gives its wall and CPU ms."""
    from facefuse.config import Settings
    from facefuse.fusion.engine import FaceFuser
    from facefuse.video.engine import ClipFusion, VideoOptions, frame_threads_only
    from facefuse.video.io import Frame, VideoReader, probe
    from report import answer_requests, wall_cpu_ms

    frame_threads_only()
    settings = Settings.from_env()
    fuser = FaceFuser(settings)
    frames: list[Any] = []
    state: Any = None

    def handle(q: dict[str, Any]) -> dict[str, Any]:
        nonlocal frames, state
        if "clip" in q:
            clip = Path(q["clip"])
            frames = [f for f in VideoReader(clip, probe(clip)) if isinstance(f, Frame)]
            return {"frames": len(frames)}
        if "reset" in q:
            state = ClipFusion(fuser, VideoOptions(), [settings.samples_dir / "biden.jpg"])
            state.process(frames[0].rgb, 0, frames[0].time_s)
            return {}
        f = frames[q["i"]]
        return wall_cpu_ms(lambda: state.process(f.rgb, f.index, f.time_s))

    answer_requests(handle)


def main() -> None:
    from report import rev_arguments

    ap = rev_arguments(__doc__, 2)
    ap.add_argument("--out", help="write clip_ab.json here instead of bench/results/")
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    from report import (
        alternate,
        ask,
        machine,
        machine_line,
        paired_ratio,
        rev_workers,
        revs_to_time,
        write_json,
    )
    from video import make_clip

    revs = revs_to_time(args.base, args.also)
    times: dict[str, dict[str, list[float]]] = {r: {"wall": [], "cpu": []} for r in revs}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        clip = make_clip(Path(tmp) / "clip.mp4", HEIGHT, FRAMES)
        workers = rev_workers(__file__, revs, Path(tmp), stack)
        for r in revs:
            n = ask(workers[r], {"clip": str(clip)})["frames"]
        for _ in range(args.rounds):
            for r in revs:
                ask(workers[r], {"reset": True})
            for i in range(1, n):
                for r in alternate(revs, i):
                    got = ask(workers[r], {"i": i})
                    for k in ("wall", "cpu"):
                        times[r][k].append(got[k])
    base = revs[0]
    ratios = {r: {k: paired_ratio(times[r][k], times[base][k]) for k in ("cpu", "wall")}
              for r in revs[1:]}
    cpu = {r: statistics.median(times[r]["cpu"]) for r in revs}
    lines = [machine_line(machine()),
             f"Command: `.venv/bin/python bench/clip_ab.py --base {args.base}"
             + "".join(f" --also {a}" for a in args.also) + f" --rounds {args.rounds}`"
             f" ({HEIGHT}p, {n - 1} frames a round).", "",
             "| " + " | ".join(f"{r} CPU ms/frame" for r in revs) + " | "
             + " | ".join(f"{r} / {base} (CPU, wall)" for r in revs[1:]) + " |",
             "|" + "---:|" * (2 * len(revs) - 1),
             "| " + " | ".join(f"{cpu[r]:.1f}" for r in revs) + " | "
             + " | ".join(f"{ratios[r]['cpu']:.3f}, {ratios[r]['wall']:.3f}"
                          for r in revs[1:]) + " |"]
    result = {"revs": revs, "rounds": args.rounds, "frames": n - 1, "cpu_ms": cpu,
              "ratios": ratios}
    write_json("clip_ab", result, args.out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
