"""Benchmark: video fusion — frames/s, flicker, landmark jitter and peak RSS.

For each size (480p, 720p, 1080p: a moving face of about 200 px at 720p, scaled
with the frame) a clip is made from a sample photo with PyAV
(:mod:`facefuse.toolchain.clips`), then fused

* by ``facefuse video`` (:class:`~facefuse.video.fuser.VideoFuser`: the source
  analysed once and its render-side work memoised, detection every 10 frames,
  the mesh tracked, 1€ smoothing, decode/render/encode threads), with 1 and 2
  worker processes at once (each its own clip; frames/s summed), and
* by a naive loop: every frame decoded, detected, analysed and fused on its
  own (``FaceFuser.fuse(source, frame)``, the source decoded and analysed again,
  so nothing of it is reused), then encoded with the same encoder (the whole
  frame converted back to YUV).

Each run is its own process (peak RSS is its VmHWM). Measures:

* **fps**: frames / wall seconds of the whole run (decode to the last byte written),
  and after start-up (the frames after the first ten, the rate of a long clip);
* **flicker**: mean absolute difference between consecutive output frames inside
  the face box, as a ratio to the same measure on the input clip (1.0: the fused
  face changes exactly as much as the original did);
* **jitter**: mean absolute second difference of the mesh points over time, in
  % of the eye distance, before (raw tracked mesh) and after the 1€ filter;
* **profile** (``--profile``): CPU ms per frame of the engine's stages over the
  720p clip, by cProfile (CPU clock, its own overhead included);
* **long clip** (``--long-seconds N``): one worker on an N-second 720p clip with
  audio, its fps and peak RSS (memory must not grow with the clip);
* **warm worker** (``--warm``): one 720p job of each loop in a process that has
  just served a job with another source (models loaded, codecs started), as a
  worker's jobs after its first run;
* **still face** (``--still``): the engine and the naive loop on a 720p clip of
  the face not moving, where every change between output frames beyond the
  input's own (the codec's noise) is the fusion's flicker: each side's excess
  (output's mean |frame-to-frame difference| in the face box minus the input's),
  and the engine's excess over the naive loop's (goal ≤ 0.5).

    .venv/bin/python bench/video.py [--sizes 480,720] [--frames 60] [--profile]
        [--long-seconds 60] [--warm] [--still] [--benchmarks]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

from report import machine, machine_line, publish, write_json

SIZES = {480: (854, 480), 720: (1280, 720), 1080: (1920, 1080)}
#: Face width at 720p, pixels (scaled with the frame height for the other sizes).
FACE_720 = 200.0
SOURCE, TARGET = "biden", "obama"


def make_clip(path: Path, height: int, frames: int, audio: bool = False,
              amplitude: float = 1.0) -> Path:
    """The clip of ``TARGET`` moving (``amplitude`` 0: still), at ``height``p (25 fps)."""
    from facefuse import default_analyser
    from facefuse.config import Settings
    from facefuse.imaging.decode import decode_image
    from facefuse.toolchain.clips import Scene, motion_frames, write_clip

    settings = Settings.from_env()
    photo = decode_image(settings.samples_dir / f"{TARGET}.jpg")
    b = default_analyser(settings).analyse(photo, embed=False)[0].bbox
    face = (float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2, float(b[2] - b[0]))
    scene = Scene(photo, frames, face, size=SIZES[height], face_px=FACE_720 * height / 720,
                  amplitude=amplitude)
    return write_clip(path, motion_frames(scene), audio=audio)


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def live_children() -> list[int]:
    """The pids of this process's children now running (the engine's render
    processes)."""
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            pids += [int(p) for p in (task / "children").read_text().split()]
    return pids


def _smaps_mb(pid: int | str) -> dict[str, float]:
    """Rss and Pss (MB) of a process from its smaps_rollup; empty if it is gone."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                out[key] = int(rest.split()[0]) / 1024
    return out


class TreeMemory:
    """Samples this process's and its live children's memory every ``every_s``
    seconds in a thread: ``pss_mb`` the largest sum of their Pss (shared pages
    counted once, split among the processes mapping them: what the tree takes),
    ``rss_mb`` the largest sum of their Rss (a forked child's pages shared with its
    parent counted again in each: an upper bound), ``children`` the most children
    seen at once."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s = every_s
        self.pss_mb = self.rss_mb = 0.0
        self.children = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="tree-memory")

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.every_s):
                return

    def sample(self) -> None:
        kids = live_children()
        sizes = [_smaps_mb("self")] + [_smaps_mb(p) for p in kids]
        self.pss_mb = max(self.pss_mb, sum(x.get("Pss", 0.0) for x in sizes))
        self.rss_mb = max(self.rss_mb, sum(x.get("Rss", 0.0) for x in sizes))
        self.children = max(self.children, len(kids))

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def engine_job(fuser: Any, source: Path, clip: Path, out: Path) -> tuple[Any, dict[str, Any]]:
    """``facefuse video``'s engine fusing ``source`` into ``clip`` with ``fuser`` (a
    FaceFuser), timed: its :class:`~facefuse.video.fuser.VideoReport` and fps, frames,
    the after-start-up rates, CPU ms per frame and the frames fused."""
    from facefuse.video.fuser import VideoFuser

    t0, c0 = time.perf_counter(), cpu_seconds()
    clock = FrameClock()
    report = VideoFuser(fuser).fuse_video(source, clip, out, progress=clock.tick)
    return report, {"fps": report.frames / (time.perf_counter() - t0),
                    "frames": report.frames, **clock.steady(),
                    "cpu_ms_per_frame": (cpu_seconds() - c0) * 1000 / report.frames,
                    "fused_frames": report.fused_frames}


def run_engine(clip: Path, out: Path) -> dict[str, Any]:
    """One engine run in this process: fps, and the flicker and jitter figures."""
    from facefuse.config import Settings
    from facefuse.fusion.engine import FaceFuser
    from facefuse.fusion.geometry import eye_distance
    from facefuse.video.engine import ClipFusion, VideoOptions, frame_threads_only
    from facefuse.video.io import Frame, VideoReader, probe

    frame_threads_only()  # as the worker and `facefuse video` do
    settings = Settings.from_env()
    fuser = FaceFuser(settings)
    source = settings.samples_dir / f"{SOURCE}.jpg"
    report, timed = engine_job(fuser, source, clip, out)
    # Jitter: the same clip through the per-frame state machine (no encoding).
    state = ClipFusion(fuser, VideoOptions(), [source])
    raw, smooth, eyes = [], [], []
    for item in VideoReader(clip, probe(clip)):
        if isinstance(item, Frame):
            _, stats = state.process(item.rgb, item.index, item.time_s)
            if 0 in stats.raw_landmarks:
                raw.append(stats.raw_landmarks[0][:468, :2])
                smooth.append(stats.landmarks[0][:468, :2])
                eyes.append(eye_distance(stats.raw_landmarks[0]))
    return {**timed, "detections": report.detections,
            "jitter_raw_pct": jitter(raw, eyes), "jitter_smooth_pct": jitter(smooth, eyes)}


#: Frames finished before the steady-state fps starts counting (the start-up: the
#: source's analysis, the codecs opened, the first frames' memo misses).
STARTUP_FRAMES = 10


def steady_cpu_ms(cpus: list[float]) -> float | None:
    """CPU ms per frame after :data:`STARTUP_FRAMES`, from the process's CPU seconds
    when each frame was finished; None for a clip too short to tell."""
    if len(cpus) <= STARTUP_FRAMES + 1:
        return None
    return (cpus[-1] - cpus[STARTUP_FRAMES]) * 1000 / (len(cpus) - 1 - STARTUP_FRAMES)


def busy_seconds() -> float:
    """CPU seconds every process of the machine has used since boot (/proc/stat: all
    but idle and iowait): the runs subtract their own to tell how busy the shared
    machine was meanwhile."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class Others:
    """How many cores the machine's other work took while the block ran (the
    machine's busy CPU seconds less this process's children's, over the wall
    seconds): ``with Others() as load: ...``, then ``load.cores``."""

    def __enter__(self) -> Others:
        self._t, self._busy, self._own = time.perf_counter(), busy_seconds(), children_cpu()
        self.cores = 0.0
        return self

    def __exit__(self, *_: object) -> None:
        own = children_cpu() - self._own
        self.cores = max(0.0, (busy_seconds() - self._busy - own)
                         / max(time.perf_counter() - self._t, 1e-6))


def children_cpu() -> float:
    """User + system CPU seconds of this process's finished children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def steady_fps(done: list[float]) -> float | None:
    """Frames per second after :data:`STARTUP_FRAMES`, from the times (perf_counter
    seconds) each frame was finished; None for a clip too short to tell."""
    if len(done) <= STARTUP_FRAMES + 1:
        return None
    return (len(done) - 1 - STARTUP_FRAMES) / (done[-1] - done[STARTUP_FRAMES])


class FrameClock:
    """When each frame was finished (perf_counter s) and the process's CPU s then:
    ``tick`` per frame (it takes a progress callback's arguments), ``steady`` the
    rates after start-up."""

    def __init__(self) -> None:
        self.done: list[float] = []
        self.cpus: list[float] = []

    def tick(self, *_: object) -> None:
        self.done.append(time.perf_counter())
        self.cpus.append(cpu_seconds())

    def steady(self) -> dict[str, float | None]:
        return {"steady_fps": steady_fps(self.done),
                "steady_cpu_ms_per_frame": steady_cpu_ms(self.cpus)}


#: The source a warm run's first job fuses (not :data:`SOURCE`: nothing of the
#: measured job's source is in the caches before it starts).
WARM_SOURCE = "obama2"


def run_warm(kind: str, clip: Path, out: Path) -> dict[str, Any]:
    """One job on a warm worker: a first job with another source (models loaded, the
    codecs and pools started, as on a worker that has served a job), then the
    measured one, its fps and CPU ms per frame (``kind``: ``engine`` or ``naive``)."""
    from facefuse.config import Settings
    from facefuse.fusion.engine import FaceFuser
    from facefuse.video.engine import frame_threads_only
    from facefuse.video.fuser import VideoFuser

    if kind not in ("engine", "naive"):
        raise ValueError(f"no such loop: {kind}")
    settings = Settings.from_env()
    warm = settings.samples_dir / f"{WARM_SOURCE}.jpg"
    first_out = out.with_name("warm-" + out.name)
    if kind == "naive":
        fuser = FaceFuser(settings)
        first = naive_loop(fuser, warm, clip, first_out)
        return {**naive_loop(fuser, settings.samples_dir / f"{SOURCE}.jpg", clip, out),
                "first_job_frames": first["frames"]}
    frame_threads_only()  # as the worker and `facefuse video` do
    fuser = FaceFuser(settings)
    first_job = VideoFuser(fuser).fuse_video(warm, clip, first_out)
    _, timed = engine_job(fuser, settings.samples_dir / f"{SOURCE}.jpg", clip, out)
    return {**timed, "first_job_frames": first_job.frames}


def run_long(clip: Path, out: Path) -> dict[str, Any]:
    """One engine run, nothing else: fps and CPU ms per frame (peak RSS by the caller)."""
    from facefuse.config import Settings
    from facefuse.fusion.engine import FaceFuser
    from facefuse.video.engine import frame_threads_only

    frame_threads_only()  # as the worker and `facefuse video` do
    settings = Settings.from_env()
    _, timed = engine_job(FaceFuser(settings), settings.samples_dir / f"{SOURCE}.jpg", clip,
                          out)
    return timed


#: The profile's rows: (label, file suffix, function) summed as cumulative CPU time.
STAGES = [
    ("frame (`ClipFusion.process`)", "video/engine.py", "process"),
    ("track, detect, smooth (`plan`)", "video/engine.py", "plan"),
    ("- tracked mesh + iris", "video/engine.py", "_track"),
    ("- detection (every 10th frame)", "video/engine.py", "_detect"),
    ("render (`ClassicSwapper.render`)", "swappers/classic/swapper.py", "render"),
    ("- dense maps (`piecewise_affine_maps`)", "imaging/warp.py", "piecewise_affine_maps"),
    ("- occluder masks (the target's)", "fusion/swappers/classic/regions.py", "face_occluders"),
    ("- full-resolution detail path", "fusion/swappers/classic/detail.py", "full_resolution_layer"),
    ("- sharpness match", "imaging/color.py", "match_sharpness"),
    ("- the target's highlights", "fusion/swappers/classic/specular.py", "highlights"),
    ("- relighting gains", "fusion/swappers/classic/light.py", "layer_gains"),
    ("- source-side work (memo misses only)", "swappers/classic/swapper.py", "_source_crop"),
    ("tone + blend (`finish`)", "video/engine.py", "finish"),
]


def run_profile(clip: Path) -> dict[str, Any]:
    """CPU ms per frame of :data:`STAGES` over ``clip`` (the first frame excluded), by
    cProfile; and, on the CPU clock with no profiler, ``ClipFusion.process`` per frame
    (cProfile's per-call overhead inflates the Python-heavy stages: the section gives
    the ratio) and the codecs' per frame, which the engine runs in their own threads:
    decoding to RGB (each frame dropped once decoded, as the pipeline's window lets the
    decoder reuse its buffers), and encoding with the default encoder from the decoded
    pictures with only a face box converted back (the engine's way) or the whole frame
    (the naive loop's). Each codec figure is the least of two interleaved passes."""
    import cProfile
    import pstats

    from facefuse.config import Settings
    from facefuse.fusion.engine import FaceFuser
    from facefuse.video.codecs import encoder
    from facefuse.video.engine import ClipFusion, VideoOptions, frame_threads_only
    from facefuse.video.io import Frame, VideoReader, VideoWriter, probe

    frame_threads_only()  # as the engine runs
    settings = Settings.from_env()
    info = probe(clip)
    frames = [it for it in VideoReader(clip, info) if isinstance(it, Frame)]
    h, w = frames[0].rgb.shape[:2]
    # A box of the bench face's size (its width and 1.5 times that high) at the centre.
    fw, fh = round(FACE_720 * h / 720), round(1.5 * FACE_720 * h / 720)
    box = [((w - fw) // 2, (h - fh) // 2, (w + fw) // 2, (h + fh) // 2)]
    codec: dict[str, list[float]] = {"decode": [], "box": [], "whole": []}
    with tempfile.TemporaryDirectory(prefix="bench-video-codec-") as tmp:
        for _ in range(2):
            c0, n = cpu_seconds(), 0
            for it in VideoReader(clip, info):
                n += isinstance(it, Frame)
            codec["decode"].append((cpu_seconds() - c0) * 1000 / n)
            for name, changed in (("box", box), ("whole", None)):
                c0 = cpu_seconds()
                with VideoWriter(Path(tmp) / f"{name}.mp4", info, encoder("vp9"),
                                 clip) as writer:
                    for f in frames:
                        writer.write(f, f.rgb, changed)
                codec[name].append((cpu_seconds() - c0) * 1000 / len(frames))
    rounds = []
    for _ in range(2):
        state = ClipFusion(FaceFuser(settings), VideoOptions(),
                           [settings.samples_dir / f"{SOURCE}.jpg"])
        state.process(frames[0].rgb, 0, frames[0].time_s)
        c0 = time.process_time()
        for f in frames[1:]:
            state.process(f.rgb, f.index, f.time_s)
        rounds.append((time.process_time() - c0) * 1000 / (len(frames) - 1))
    state = ClipFusion(FaceFuser(settings), VideoOptions(), [settings.samples_dir /
                                                             f"{SOURCE}.jpg"])
    state.process(frames[0].rgb, 0, frames[0].time_s)
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    for f in frames[1:]:
        state.process(f.rgb, f.index, f.time_s)
    prof.disable()
    table: dict[tuple[str, int, str], tuple[Any, ...]] = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    n = len(frames) - 1
    rows = []
    for label, suffix, func in STAGES:
        ct = sum(v[3] for (file, _, fn), v in table.items()
                 if fn == func and file.endswith(suffix))
        rows.append([label, ct * 1000 / n])
    return {"frames": n, "stages": rows, "process_ms": min(rounds),
            "decode_ms": min(codec["decode"]), "encode_box_ms": min(codec["box"]),
            "encode_whole_ms": min(codec["whole"]),
            # Whether the box pass could reuse the decoded picture (else it converted
            # the whole frame as well).
            "box_reuses_picture": frames[0].coded is not None}


def run_naive(clip: Path, out: Path) -> dict[str, Any]:
    """Every frame on its own: decode, detect, analyse (source too), fuse, encode."""
    from facefuse.config import Settings
    from facefuse.fusion.engine import FaceFuser

    settings = Settings.from_env()
    return naive_loop(FaceFuser(settings), settings.samples_dir / f"{SOURCE}.jpg", clip, out)


def naive_loop(fuser: Any, source_path: Path, clip: Path, out: Path) -> dict[str, Any]:
    """:func:`run_naive`'s loop with ``fuser`` (a FaceFuser) and the source photo at
    ``source_path``."""
    from facefuse.errors import FaceError
    from facefuse.fusion.types import FuseOptions
    from facefuse.video.codecs import encoder
    from facefuse.video.io import AudioPacket, VideoReader, VideoWriter, probe

    source = source_path.read_bytes()
    options = FuseOptions(evaluate=False)
    t0, c0 = time.perf_counter(), cpu_seconds()
    info = probe(clip)
    n = 0
    clock = FrameClock()
    with VideoWriter(out, info, encoder("vp9"), clip) as writer:
        for item in VideoReader(clip, info):
            if isinstance(item, AudioPacket):
                continue
            try:
                rgb = fuser.fuse(source, item.rgb, options).image
            except FaceError:
                rgb = item.rgb
            writer.write(item, rgb)
            n += 1
            clock.tick()
    return {"fps": n / (time.perf_counter() - t0), "frames": n, **clock.steady(),
            "cpu_ms_per_frame": (cpu_seconds() - c0) * 1000 / n}


def jitter(seq: list[np.ndarray], eyes: list[float]) -> float:
    """Mean |second difference| of the points over time, % of the mean eye distance."""
    if len(seq) < 3:
        return float("nan")
    a = np.stack(seq).astype(np.float64)
    return float(np.abs(a[2:] - 2 * a[1:-1] + a[:-2]).mean() / np.mean(eyes) * 100)


def flicker(clip: Path, out: Path, height: int, excess: bool = False) -> float:
    """Temporal difference of the output in the face region / the input's own
    (``excess``: minus the input's own, grey levels)."""
    from facefuse.video.io import Frame, VideoReader, probe

    def diffs(path: Path) -> list[np.ndarray]:
        frames = [it.rgb.astype(np.float32) for it in VideoReader(path, probe(path))
                  if isinstance(it, Frame)]
        return [np.abs(b - a).mean(axis=2) for a, b in itertools.pairwise(frames)]

    w, h = SIZES[height]
    side = FACE_720 * height / 720
    # The face moves around (0.36 W, 0.5 H) by a few percent: a box that covers it.
    x0, x1 = int(w * 0.36 - 0.8 * side), int(w * 0.36 + 0.8 * side)
    y0, y1 = int(h * 0.5 - 0.9 * side), int(h * 0.5 + 0.9 * side)
    src = np.mean([d[y0:y1, x0:x1].mean() for d in diffs(clip)])
    dst = np.mean([d[y0:y1, x0:x1].mean() for d in diffs(out)])
    return float(dst - src if excess else dst / src)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process (all its threads) and of its
    children, finished (reaped) and running: the engine's render processes."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    tick = os.sysconf("SC_CLK_TCK")
    live = 0.0
    for pid in live_children():
        with contextlib.suppress(OSError, IndexError, ValueError):
            # The fields after the command's closing parenthesis; utime, stime: 14, 15.
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            live += (int(f[11]) + int(f[12])) / tick
    return own.ru_utime + own.ru_stime + done.ru_utime + done.ru_stime + live


def child(kind: str, clip: str, out: str) -> None:
    if kind == "profile":
        print(json.dumps(run_profile(Path(clip))))
        return
    if kind.startswith("warm-"):
        result = run_warm(kind.removeprefix("warm-"), Path(clip), Path(out))
    else:
        run = {"engine": run_engine, "naive": run_naive, "long": run_long}[kind]
        with TreeMemory() as tree:
            result = run(Path(clip), Path(out))
        result.update(tree_pss_mb=tree.pss_mb, tree_rss_mb=tree.rss_mb,
                      render_processes=tree.children)
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))


def spawn(kind: str, clip: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--child", kind, str(clip), str(out)],
                            stdout=subprocess.PIPE, text=True, env=os.environ.copy())


def collect(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    for p in procs:
        text, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"a run failed ({p.returncode})")
        out.append(json.loads(text.strip().splitlines()[-1]))
    return out


def keep(best: dict[tuple[str, int], dict[str, Any]], key: tuple[str, int],
         row: dict[str, Any]) -> None:
    """Keep the faster of two runs of one configuration (memory: the larger)."""
    print(json.dumps(row), flush=True)
    old = best.get(key)
    if old is not None:
        row = {**(row if row["fps"] > old["fps"] else old),
               **{k: max(row[k], old[k]) for k in MEMORY_KEYS if k in row and k in old}}
    best[key] = row


#: A row's memory figures (MB), of which :func:`keep` reports the larger run's.
MEMORY_KEYS = ("peak_rss_mb", "tree_pss_mb", "tree_rss_mb")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="480,720", help="comma-separated heights (480,720,1080)")
    ap.add_argument("--frames", type=int, default=60)
    ap.add_argument("--workers", default="1,2", help="worker processes to run at once")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved runs of each; the "
                    "fastest is reported")
    ap.add_argument("--profile", action="store_true",
                    help="profile the engine's stages (at 720p when measured)")
    ap.add_argument("--long-seconds", type=float, default=0.0,
                    help="also run one worker on a clip this long at 720p (peak RSS)")
    ap.add_argument("--warm", action="store_true",
                    help="also time one 720p job of each loop on a warm worker (a first "
                    "job with another source before it)")
    ap.add_argument("--still", action="store_true",
                    help="also measure the flicker of a still 720p face, engine and naive")
    ap.add_argument("--benchmarks", action="store_true", help="write BENCHMARKS.md's section")
    ap.add_argument("--out", help="write video.json here instead of bench/results/")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "CLIP", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--section-from", metavar="JSON",
                    help="only rewrite BENCHMARKS.md's section from a saved video.json")
    args = ap.parse_args()
    if args.section_from:
        publish("Video (`bench/video.py`)", section(json.loads(Path(args.section_from)
                                                               .read_text())))
        return
    if args.child:
        child(*args.child)
        return
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-video-") as tmp:
        d = Path(tmp)
        sizes = [int(s) for s in args.sizes.split(",")]
        for height in sizes:
            clip = make_clip(d / f"clip{height}.mp4", height, args.frames)
            if args.profile and height == (720 if 720 in sizes else sizes[0]):
                extra["profile"] = {"height": height, **collect(
                    [spawn("profile", clip, d / "unused.mp4")])[0]}
            best: dict[tuple[str, int], dict[str, Any]] = {}
            # Interleaved repeats; the fastest of each (the least disturbed on a
            # shared machine) is reported.
            for _ in range(args.repeat):
                for n in (int(x) for x in args.workers.split(",")):
                    with Others() as load:
                        runs = collect([spawn("engine", clip, d / f"e{height}_{n}_{i}.mp4")
                                        for i in range(n)])
                    others = load.cores
                    row = {"height": height, "kind": "facefuse", "workers": n,
                           "fps": sum(r["fps"] for r in runs),
                           "steady_fps": (None if any(r["steady_fps"] is None for r in runs)
                                          else sum(r["steady_fps"] for r in runs)),
                           "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                           "tree_pss_mb": max(r["tree_pss_mb"] for r in runs),
                           "tree_rss_mb": max(r["tree_rss_mb"] for r in runs),
                           "render_processes": runs[0]["render_processes"],
                           "cpu_ms_per_frame": runs[0]["cpu_ms_per_frame"],
                           "steady_cpu_ms_per_frame": runs[0]["steady_cpu_ms_per_frame"],
                           "others_cores": others,
                           "flicker": flicker(clip, d / f"e{height}_{n}_0.mp4", height),
                           "jitter_raw_pct": runs[0]["jitter_raw_pct"],
                           "jitter_smooth_pct": runs[0]["jitter_smooth_pct"],
                           "detections": runs[0]["detections"], "frames": runs[0]["frames"]}
                    keep(best, ("facefuse", n), row)
                with Others() as load:
                    naive = collect([spawn("naive", clip, d / f"n{height}.mp4")])[0]
                keep(best, ("naive", 1), {
                    "height": height, "kind": "naive", "workers": 1, "fps": naive["fps"],
                    "steady_fps": naive["steady_fps"],
                    "peak_rss_mb": naive["peak_rss_mb"],
                    "tree_pss_mb": naive["tree_pss_mb"], "tree_rss_mb": naive["tree_rss_mb"],
                    "cpu_ms_per_frame": naive["cpu_ms_per_frame"],
                    "steady_cpu_ms_per_frame": naive["steady_cpu_ms_per_frame"],
                    "others_cores": load.cores,
                    "flicker": flicker(clip, d / f"n{height}.mp4", height),
                    "frames": naive["frames"]})
            rows += best.values()
        if args.long_seconds > 0:
            frames = round(args.long_seconds * 25)
            clip = make_clip(d / "long.mp4", 720, frames, audio=True)
            extra["long"] = {"seconds": args.long_seconds, "height": 720,
                             **collect([spawn("long", clip, d / "long_out.mp4")])[0]}
        if args.warm:
            clip = make_clip(d / "warm.mp4", 720, args.frames)
            extra["warm"] = {"height": 720, "frames": args.frames}
            for kind in ("engine", "naive"):
                with Others() as load:
                    extra["warm"][kind] = {**collect([spawn(f"warm-{kind}", clip,
                                                            d / f"warm_{kind}.mp4")])[0],
                                           "others_cores": load.cores}
        if args.still:
            clip = make_clip(d / "still.mp4", 720, args.frames, amplitude=0.0)
            extra["still"] = {"height": 720, "frames": args.frames}
            for kind in ("engine", "naive"):
                out = d / f"still_{kind}.mp4"
                collect([spawn(kind, clip, out)])
                extra["still"][kind] = {"ratio": flicker(clip, out, 720),
                                        "excess": flicker(clip, out, 720, excess=True)}
    m = machine()
    command = (f"python bench/video.py --sizes {args.sizes} --frames {args.frames} "
               f"--workers {args.workers} --repeat {args.repeat}"
               + (" --profile" if args.profile else "")
               + (f" --long-seconds {args.long_seconds:g}" if args.long_seconds > 0 else "")
               + (" --warm" if args.warm else "")
               + (" --still" if args.still else ""))
    result = {"machine": m, "frames": args.frames, "rows": rows, **extra, "command": command}
    write_json("video", result, args.out)
    lines = section(result)
    if args.benchmarks:
        publish("Video (`bench/video.py`)", lines)
    else:
        print("\n".join(lines))


def _mb(row: dict[str, Any], key: str) -> str:
    """A memory figure of a row, blank where the run did not record it."""
    return f"{row[key]:.0f}" if row.get(key) else ""


def section(result: dict[str, Any]) -> list[str]:
    """The BENCHMARKS.md section of one run's results."""
    rows, frames = result["rows"], result["frames"]
    loads = [r["others_cores"] for r in rows if "others_cores" in r]
    load = (f"the other work took {min(loads):.1f} to {max(loads):.1f} of the 2 cores during "
            "the reported runs (column *others*: the machine's busy CPU time less the "
            "benchmark's own, per second)" if loads else "load not recorded")
    lines = [f"{machine_line(result['machine'])} **Shared** with other engineers' work while "
             f"measured: {load}. Wall-clock fps of one configuration swings 2-3x with it, "
             "so compare the CPU columns; the fps shown is the fastest of the interleaved "
             "repeats, still below what an idle 2-core worker does.",
             "", f"`{result['command']}`: a {frames}-frame 25 fps clip of a moving face "
             f"(~{FACE_720:.0f} px wide at 720p, eye distance ~100 px), VP9 out; fps summed "
             "over the workers (each its own clip, run at once), memory the largest "
             "worker's: its process's peak RSS, and sampled every 0.2 s (so a peak between "
             "two samples is missed), the peak PSS of the process and its render processes "
             "together (the pages they share counted once) and their RSS summed (shared "
             "pages counted in each). "
             "**fps after start-up**: the frames after the first "
             f"{STARTUP_FRAMES} over the time they took (the rate a long clip runs at: the "
             "source's analysis, the models' and codecs' start are behind it). "
             "**CPU ms/frame**: the user + system time of the process (all threads) and "
             "its render processes per frame, start-up (models, the source's analysis) "
             "included, and after start-up; **× naive**: "
             "the naive loop's CPU ms/frame over this one's, and this fps over the naive "
             "loop's, for the whole clip and after start-up (both loops' first "
             f"{STARTUP_FRAMES} frames left out). Flicker: mean |frame-to-frame "
             "difference| in the face box, output ÷ input clip. Jitter: mean |second "
             "difference| of the mesh points over time.", "",
             "| size | run | workers | fps (wall) | fps after start-up | CPU ms/frame "
             "| CPU ms/frame after start-up | × naive (CPU) "
             "| × naive (fps) | × naive after start-up (fps) | peak RSS MB (process) "
             "| peak PSS MB (with render processes) | RSS summed MB "
             "| flicker (× target's) | jitter raw → smoothed (% eye dist.) | others (cores) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        naive = next(x for x in rows if x["height"] == r["height"] and x["kind"] == "naive")
        jit = (f"{r['jitter_raw_pct']:.2f} → {r['jitter_smooth_pct']:.2f}"
               if "jitter_raw_pct" in r else "")
        steady = f"{r['steady_fps']:.1f}" if r.get("steady_fps") is not None else ""
        steady_cpu = (f"{r['steady_cpu_ms_per_frame']:.0f}"
                      if r.get("steady_cpu_ms_per_frame") is not None else "")
        others = f"{r['others_cores']:.1f}" if "others_cores" in r else ""
        steady_x = (f"{r['steady_fps'] / naive['steady_fps']:.2f}"
                    if r.get("steady_fps") and naive.get("steady_fps") else "")
        lines.append(f"| {r['height']}p | {r['kind']} | {r['workers']} | {r['fps']:.1f} | "
                     f"{steady} | "
                     f"{r['cpu_ms_per_frame']:.0f} | {steady_cpu} | "
                     f"{naive['cpu_ms_per_frame'] / r['cpu_ms_per_frame']:.2f} | "
                     f"{r['fps'] / naive['fps']:.2f} | {steady_x} | "
                     f"{r['peak_rss_mb']:.0f} | {_mb(r, 'tree_pss_mb')} | "
                     f"{_mb(r, 'tree_rss_mb')} | {r['flicker']:.2f} | {jit} | {others} |")
    if "long" in result:
        lg = result["long"]
        lines += ["", f"**Long clip**: one worker on a {lg['seconds']:g}-second {lg['height']}p "
                  f"clip with audio ({lg['frames']} frames): {lg['fps']:.1f} fps"
                  + (f" ({lg['steady_fps']:.1f} after start-up)"
                     if lg.get("steady_fps") is not None else "") + ", "
                  f"{lg['cpu_ms_per_frame']:.0f} CPU ms/frame, **peak RSS "
                  f"{lg['peak_rss_mb']:.0f} MB**"
                  + (f", with its render processes peak PSS {lg['tree_pss_mb']:.0f} MB "
                     f"(RSS summed {lg['tree_rss_mb']:.0f} MB)" if lg.get("tree_pss_mb") else "")
                  + " (the frames in flight are a bounded window, so memory does not grow "
                  "with the clip)."]
    if "still" in result:
        st = result["still"]
        e, n = st["engine"], st["naive"]
        share = ("none: the engine adds no change" if e["excess"] <= 0
                 else f"{e['excess'] / n['excess']:.2f} of the naive loop's" if n["excess"] > 0
                 else "the naive loop adds none")
        lines += ["", f"**Still face** ({st['frames']} frames at {st['height']}p, the face not "
                  "moving: every change between output frames beyond the input's own is the "
                  "fusion's): mean |frame-to-frame difference| in the face box "
                  f"{e['ratio']:.2f}× the input's own with the engine, {n['ratio']:.2f}× with "
                  f"the naive loop; the excess over the input's own {e['excess']:.3f} vs "
                  f"{n['excess']:.3f} grey levels: **{share}** (goal ≤ 0.5 of the naive "
                  "loop's)."]
    if "warm" in result:
        wm = result["warm"]
        e, n = wm["engine"], wm["naive"]
        steady = (f"; after start-up {e['steady_fps']:.1f} against {n['steady_fps']:.1f} fps, "
                  f"**{e['steady_fps'] / n['steady_fps']:.2f}×**"
                  if e["steady_fps"] and n["steady_fps"] else "")
        lines += ["", f"**A job on a warm worker** ({wm['frames']} frames at {wm['height']}p, "
                  f"after a first job over the same clip with another source in the same "
                  "process: the models loaded, the codecs and pools started; nothing of this "
                  f"job's source cached): the engine {e['fps']:.1f} fps, "
                  f"{e['cpu_ms_per_frame']:.0f} CPU ms a frame; the naive loop "
                  f"{n['fps']:.1f} fps, {n['cpu_ms_per_frame']:.0f} ms: "
                  f"**{e['fps'] / n['fps']:.2f}×** for the whole clip{steady} (others "
                  f"{e['others_cores']:.1f} and {n['others_cores']:.1f} cores)."]
    if "profile" in result:
        pr = result["profile"]
        lines += ["", f"Where a {pr['height']}p frame's CPU goes (cProfile on the CPU clock over "
                  f"{pr['frames']} frames, its own overhead included; without codecs, which "
                  "run in their own threads): cumulative CPU ms per frame.", "",
                  "| stage | CPU ms/frame |", "|---|---|"]
        lines += [f"| {label} | {ms:.1f} |" for label, ms in pr["stages"]]
        if "process_ms" in pr:
            frame = dict(pr["stages"])["frame (`ClipFusion.process`)"]
            codecs = pr["decode_ms"] + pr["encode_box_ms"]
            lines += ["", f"The same without a profiler (CPU clock, the faster of two runs): "
                      f"`ClipFusion.process` **{pr['process_ms']:.1f}** CPU ms a frame "
                      f"({frame / pr['process_ms']:.2f}× less than under cProfile, whose "
                      "per-call cost inflates the Python-heavy stages above). The codecs, in "
                      "their own threads (the least of two passes): decoding to RGB "
                      f"**{pr['decode_ms']:.1f}** ms a frame; encoding (VP9) from the decoded "
                      f"picture with a face box converted back, as the engine does, "
                      f"**{pr['encode_box_ms']:.1f}** ms, and from the whole frame converted, "
                      f"as the naive loop does, **{pr['encode_whole_ms']:.1f}** ms: the "
                      f"engine's codecs {codecs:.1f} ms against {pr['process_ms']:.1f} ms of "
                      "the frame's own work."]
    lines += ["", "What the engine saves over the naive loop: the source decoded and analysed "
              "once, and its render-side work (its crop at the working scale with the "
              "highlights taken out, its occluder mask, face outline fields and side-to-side "
              "tone colours) memoised per source (`fusion/swappers/classic/source_prep.py`: "
              "it hits on every frame after the first); detection every 10th frame with the "
              "mesh tracked "
              "between, the iris model every other tracked frame (the irises carried with "
              "the eyes between), the face's glasses, facial hair and iris colour found "
              "every 4th frame (carried with the face between), the identity embedding "
              "only for a face no track covers; the frames rendered at a 72-px working "
              "eye distance (a photo's: 80); "
              "no per-frame evaluation; the faces' "
              "boxes alone converted back to YUV. Frames are rendered two at a time, in two "
              "forked processes, while the next is tracked. What remains is the target side "
              "of the render, which both do on every frame."]
    return lines


if __name__ == "__main__":
    main()
