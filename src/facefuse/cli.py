"""The ``facefuse`` command line.

Every deliberate failure prints ``error[<code>]: <message>`` on stderr and exits
with the error class's stable exit code (see :mod:`facefuse.errors`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from facefuse.config import Settings
from facefuse.errors import FacefuseError, InvalidArgumentError

if TYPE_CHECKING:
    from facefuse.fusion.types import FuseOptions
#: ``facefuse --help``'s text (plain: argparse prints it as it is).
DESCRIPTION = "Analyse faces, fuse a face into photos, build the models and run the HTTP API."
EPILOG = """\
exit codes:
  0  success
  1  a batch finished with failed images, or an internal error (rerun with -v)
  2  usage: a bad option, argument or key
  3  bad input image or clip (empty, corrupt, unsupported, too large, too small, not there)
  4  face problem (no face, too small, in profile, index out of range)
  5  model or codec problem (missing or corrupt model file; no video codecs here)
  6  build or fetch problem (download, checksum, conversion, quantization gate)
  7  service problem (overloaded, deadline exceeded)
  130  interrupted (Ctrl-C; SIGTERM too during a clip: its partial output is removed)
Every deliberate failure prints 'error[<code>]: <message>' on stderr.
"""


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if getattr(args, "models_dir", None):
        overrides["models_dir"] = Path(args.models_dir)
    if getattr(args, "threads", None) is not None:
        overrides["threads"] = args.threads
    return Settings.from_env(**overrides)


def cmd_models_build(args: argparse.Namespace) -> int:
    from facefuse.toolchain.build.zoo import build_zoo

    settings = _settings(args)
    manifest = build_zoo(settings, only=args.only or None, force=args.force)
    print(f"{len(manifest.models)} models in {settings.model_dir}")
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    from facefuse.runtime.manifest import Manifest
    from facefuse.runtime.registry import choose_variant

    settings = _settings(args)
    manifest = Manifest.load(settings.model_dir)
    rows: list[dict[str, Any]] = []
    for name, spec in sorted(manifest.models.items()):
        if spec.base is not None:
            continue
        active = choose_variant(manifest, name, settings)
        variants = sorted(m.precision for m in manifest.models.values()
                          if m.base == name or m.name == name)
        rows.append({
            "name": name, "task": spec.task, "active_precision": active.precision,
            "active_file": active.file, "variants": variants, "size": active.size,
            "sha256": active.sha256, "source": spec.source.package, "licence": spec.licence,
        })
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'name':16} {'task':8} {'active':7} {'variants':18} {'MB':>6}  source")
        for r in rows:
            print(f"{r['name']:16} {r['task']:8} {r['active_precision']:7} "
                  f"{','.join(r['variants']):18} {r['size'] / 1e6:6.2f}  {r['source']}")
    return 0


def cmd_models_verify(args: argparse.Namespace) -> int:
    from facefuse.runtime.manifest import Manifest, verify_file

    settings = _settings(args)
    manifest = Manifest.load(settings.model_dir)
    bad = 0
    for spec in manifest.models.values():
        try:
            verify_file(settings.model_dir, spec)
            print(f"ok      {spec.name} ({spec.precision})")
        except FacefuseError as exc:
            bad += 1
            print(f"FAILED  {spec.name}: {exc.message}")
            last = exc
    if bad:
        raise last
    return 0


def cmd_models_quantize(args: argparse.Namespace) -> int:
    from facefuse.toolchain.quantize import DEFAULT_MODELS, QuantizeOptions, quantize_models

    options = QuantizeOptions(
        models=tuple(args.models or DEFAULT_MODELS), fmt=args.format,
        calibration=args.calibration, fp16=args.fp16, benchmark=not args.no_bench,
        report_dir=Path(args.report_dir) if args.report_dir else None,
        benchmarks=Path(args.benchmarks) if args.benchmarks else None,
        missing=args.missing, command="facefuse " + " ".join(sys.argv[1:]))
    try:
        outcome = quantize_models(_settings(args), options)
    except FacefuseError as exc:
        if not args.missing or isinstance(exc, InvalidArgumentError):
            raise
        # Best effort (what `make models` runs): FP32 serves; the next run tries again.
        print(f"warning: no variant made ({exc.code}: {exc.message}); FP32 stays in use",
              file=sys.stderr)
        return 0
    for line in [f"registered {n}" for n in outcome.registered] + [
            f"wrote {p}" for p in outcome.written] + [
            f"{n}: judged before, not again" for n in outcome.skipped]:
        print(line)
    if args.missing:  # best effort: a refused variant leaves FP32 in use
        for r in outcome.refused:
            print(f"warning: {r.summary()} (FP32 stays in use)", file=sys.stderr)
        return 0
    outcome.raise_for_failures()  # a refused variant: exit non-zero with its figures
    return 0


def cmd_samples(args: argparse.Namespace) -> int:
    from facefuse.toolchain.samples import fetch_samples

    settings = _settings(args)
    paths = fetch_samples(settings.samples_dir, settings.downloads_dir)
    for name, path in paths.items():
        print(f"{name:10} {path}")
    return 0


def cmd_analyse(args: argparse.Namespace) -> int:
    from facefuse.faces.analyser import FaceAnalyser, StageTimer

    settings = _settings(args)
    analyser = FaceAnalyser(settings)
    rgb = analyser.decode(Path(args.image))
    timer = StageTimer()
    faces = analyser.analyse(rgb, attributes=args.attributes, timer=timer, purpose="all")
    if args.annotate:
        from facefuse.faces.draw import draw_faces
        from facefuse.imaging.encode import encode_image

        Path(args.annotate).parent.mkdir(parents=True, exist_ok=True)
        Path(args.annotate).write_bytes(encode_image(draw_faces(rgb, faces), "png"))
    if args.json:
        print(json.dumps({
            "image": args.image, "width": rgb.shape[1], "height": rgb.shape[0],
            "faces": [f.to_dict(landmarks=args.landmarks) for f in faces],
            "timings_ms": {k: round(v, 2) for k, v in timer.ms.items()},
        }, indent=2))
    else:
        print(f"{args.image}: {len(faces)} face(s), {rgb.shape[1]}x{rgb.shape[0]}")
        for i, f in enumerate(faces):
            x0, y0, x1, y1 = (round(float(v)) for v in f.bbox)
            extra = ""
            if f.age is not None:
                extra = f"  age {f.age:.0f}, {f.gender} ({f.gender_score:.2f})"
            print(f"  [{i}] box ({x0},{y0})-({x1},{y1}) score {f.score:.3f}{extra}")
    return 0


def _fuse_options(args: argparse.Namespace) -> FuseOptions:
    """The fusion options of the flags :func:`_add_option_flags` declared."""
    from facefuse.fusion.types import FuseOptions

    return FuseOptions(**_option_values(args, FuseOptions))


def _option_values(args: argparse.Namespace, options: type) -> dict[str, Any]:
    """The values of the flags of ``options`` that :func:`_add_option_flags` declared."""
    from facefuse.fusion.types import declared

    return {f.name: getattr(args, f.name) for f, spec, _ in declared(options)
            if spec.cli is not None}


def _add_option_flags(parser: argparse._ActionsContainer, options: type) -> None:
    """One flag per option of ``options`` with a CLI name, made from its declaration
    (:class:`~facefuse.fusion.types.FuseOptions`, a clip's
    :class:`~facefuse.video.options.VideoOptions`; ``--no-…`` switches a default-on
    option off). Ranges are checked by the options class, so a bad value is its typed
    error."""
    from facefuse.fusion.types import declared

    for f, spec, hint in declared(options):
        if spec.cli is None:
            continue
        kw: dict[str, Any] = {"dest": f.name, "default": f.default, "help": spec.help}
        if spec.cli.startswith("--no-"):
            kw["help"] = f"switch off (on by default): {spec.help}"
            parser.add_argument(spec.cli, action="store_false", **kw)
            continue
        if f.default is False:
            kw["help"] = f"switch on (off by default): {spec.help}"
            parser.add_argument(spec.cli, action="store_true", **kw)
            continue
        if f.default is not None:
            kw["help"] = f"{spec.help} (default %(default)s)"
        if get_origin(hint) is Literal:
            kw["choices"] = list(get_args(hint))
        else:
            base = next((a for a in get_args(hint) if a is not type(None)), hint)
            kw["type"] = base
        if spec.cli_bare is not None:
            kw["nargs"], kw["const"] = "?", spec.cli_bare
            kw["help"] += f"; the bare flag: {spec.cli_bare}"
        if spec.metavar:
            kw["metavar"] = spec.metavar
        parser.add_argument(spec.cli, **kw)


def cmd_fuse(args: argparse.Namespace) -> int:
    if args.targets or args.pairs:
        return cmd_fuse_batch(args)
    from facefuse.fusion.engine import FaceFuser
    from facefuse.fusion.mapping import parse_cli_pair
    from facefuse.fusion.sheet import contact_sheet
    from facefuse.imaging.encode import encode_image, format_from_path
    from facefuse.imaging.output import OutputPolicy

    if len(args.images) < 2 or not args.output:
        raise InvalidArgumentError("give SOURCE... TARGET -o OUTPUT, or --targets/--pairs "
                                   "with --out-dir for a batch")
    settings = _settings(args)
    fuser = FaceFuser(settings)
    options = fuser.resolve(_fuse_options(args))
    sources = [Path(p) for p in args.images[:-1]]
    target = Path(args.images[-1])
    mapping = [parse_cli_pair(m) for m in args.map] if args.map else None
    result = fuser.fuse(sources, target, options, mapping=mapping,
                        reference=Path(args.reference) if args.reference else None)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(OutputPolicy.from_settings(settings).encode(
        result.image, format_from_path(out), args.quality))
    report = result.report()
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
    if args.contact_sheet:
        sheet = contact_sheet(fuser, sources, target, options)
        Path(args.contact_sheet).write_bytes(encode_image(sheet, "png"))
    q = result.quality
    summary = ", ".join(f"{k} {v:.3f}" for k, v in q.items() if k.startswith("id_sim"))
    print(f"{out}: fused {len(result.fused)} face(s) at degree {options.degree:g}"
          + (f" ({summary})" if summary else ""))
    for note in result.notes:
        print(f"  note: {note}")
    for s in result.skipped:
        x0, y0, x1, y1 = (round(v) for v in s.box)
        print(f"  skipped face [{s.target_index}] box ({x0},{y0})-({x1},{y1}): "
              f"{s.reason}: {s.message}")
    return 0


def cmd_fuse_batch(args: argparse.Namespace) -> int:
    """Many targets (``--targets``) or a CSV of pairs (``--pairs``) into ``--out-dir``."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from facefuse.batch import (
        collect_pairs,
        collect_targets,
        plan_jobs,
        run_batch,
        write_report,
    )
    from facefuse.batch_signals import FirstInterruptStops
    from facefuse.fusion.engine import FaceFuser
    from facefuse.fusion.mapping import parse_cli_pair
    from facefuse.imaging.output import OutputPolicy

    if not args.out_dir:
        raise InvalidArgumentError("a batch (--targets or --pairs) needs --out-dir")
    out_dir = Path(args.out_dir)
    suffix = "jpg" if args.format == "jpeg" else args.format
    if args.pairs:
        jobs = collect_pairs(Path(args.pairs), out_dir, suffix,
                             allow_outside=args.allow_outside_out_dir)
    else:
        if not args.images:
            raise InvalidArgumentError("--targets needs at least one SOURCE image")
        targets = collect_targets(args.targets)
        jobs = plan_jobs([Path(p) for p in args.images], targets, out_dir, suffix)
    if not jobs:
        raise InvalidArgumentError("no target images found", code="no_targets")
    settings = _settings(args)
    fuser = FaceFuser(settings)
    options = fuser.resolve(_fuse_options(args))  # once, not a failure per target
    mapping = [parse_cli_pair(m) for m in args.map] if args.map else None
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"),
               TextColumn("{task.fields[rate]:.2f}/s"), TimeRemainingColumn())
    with Progress(*columns, disable=args.no_progress) as bar, FirstInterruptStops() as stop:
        task = bar.add_task("fusing", total=len(jobs), rate=0.0)
        t0 = time.perf_counter()

        def tick(job: Any, status: str) -> None:
            done = bar.tasks[0].completed + 1
            bar.update(task, advance=1, rate=done / max(1e-6, time.perf_counter() - t0))

        report = run_batch(fuser, jobs, options, OutputPolicy.from_settings(settings),
                           quality=args.quality, mapping=mapping, n_jobs=args.jobs,
                           overwrite=args.overwrite, progress=tick, stop=stop.event)
    if args.json_report:
        write_report(report, Path(args.json_report))
    stopped = f", stopped with {report.not_started} not started" if stop.event.is_set() else ""
    print(f"{len(report.done)} fused, {len(report.skipped)} already done, "
          f"{len(report.failed)} failed in {report.seconds:.1f}s{stopped} -> {out_dir}")
    for f in report.failed:
        print(f"  failed[{f['code']}]: {f['target']}: {f['message']}", file=sys.stderr)
    if stop.event.is_set():
        return 130
    return 1 if report.failed else 0


@contextlib.contextmanager
def _terminate_interrupts() -> Iterator[None]:
    """SIGTERM handled as SIGINT while a clip is fused (main thread only): the clip
    stops, its partial output is removed, and the command exits 130. By default a
    SIGTERM (a container stop, ``kill``) ended the process at once and left the
    hidden temporary output beside the destination."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_video(args: argparse.Namespace) -> int:
    """SOURCE... CLIP -o OUT: fuse the source identity into every frame of a clip."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from facefuse.fusion.engine import FaceFuser
    from facefuse.fusion.mapping import parse_cli_pair
    from facefuse.video.codecs import ENCODERS, pyav
    from facefuse.video.engine import frame_threads_only
    from facefuse.video.fuser import VideoFuser
    from facefuse.video.options import VideoOptions

    if args.list_encoders:
        av = pyav()
        for enc in ENCODERS.values():
            have = "yes" if enc.codec in av.codecs_available else "no "
            print(f"{enc.name:5} {enc.codec:11} {have}  {enc.licence}  "
                  f"({' '.join(enc.containers)})")
        return 0
    if len(args.inputs) < 2 or not args.output:
        raise InvalidArgumentError("give SOURCE... CLIP -o OUTPUT")
    settings = _settings(args)
    frame_threads_only()
    fuser = FaceFuser(settings)
    options = VideoOptions(fuse=_fuse_options(args), **_option_values(args, VideoOptions))
    mapping = [parse_cli_pair(m) for m in args.map] if args.map else None
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total} frames"),
               TextColumn("{task.fields[fps]:.1f} fps"), TimeRemainingColumn())
    with Progress(*columns, disable=args.no_progress) as bar, _terminate_interrupts():
        task = bar.add_task("fusing", total=None, fps=0.0)

        def tick(done: int, total: int, fps: float) -> None:
            bar.update(task, completed=done, total=total, fps=fps)

        report = VideoFuser(fuser).fuse_video(
            [Path(p) for p in args.inputs[:-1]], Path(args.inputs[-1]), Path(args.output),
            options, mapping=mapping, progress=tick,
            reference=Path(args.reference) if args.reference else None)
    if args.report:
        Path(args.report).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    print(f"{args.output}: {report.frames} frames ({report.fused_frames} fused) in "
          f"{report.seconds:.1f}s, {report.fps:.1f} fps, {report.tracks} track(s), "
          f"{report.cuts} cut(s), encoder {report.encoder}")
    for note in report.notes:
        print(f"  note: {note}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from facefuse.serving.jobs.worker import run_worker

    return run_worker(_settings(args), metrics_port=args.metrics_port)


def cmd_serve(args: argparse.Namespace) -> int:
    from facefuse.serving.run import serve

    settings = _settings(args)
    if args.verbose:
        settings = settings.replace(log_level="debug")
    return serve(settings, args.host, args.port, args.workers)


def _common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--models-dir", help="model directory (default $FACEFUSE_HOME/models)")
    sp.add_argument("--threads", type=int, help="ONNX Runtime intra-op threads")


def _fusion_flags(sp: argparse.ArgumentParser) -> None:
    """The fusion flags of ``fuse`` and ``video`` (one declaration): the reference,
    the mapping and every fusion option."""
    sp.add_argument("--reference", help="image of the target person to replace (mode reference)")
    sp.add_argument("--map", action="append", metavar="SRC[.FACE]=TARGET",
                    help="face mapping, repeatable: source image SRC (its face FACE, default "
                    "0 = largest) replaces target face TARGET (an index, largest first, or a "
                    "rectangle x0,y0,x1,y1 in pixels); faces not named are left alone")
    from facefuse.fusion.types import FuseOptions

    _add_option_flags(sp.add_argument_group("fusion options"), FuseOptions)


def _add_models_parser(sub: Any) -> None:
    """``facefuse models build|list|verify|quantize``."""
    models = sub.add_parser("models", help="build, list and verify the model zoo")
    msub = models.add_subparsers(dest="models_command", required=True)
    b = msub.add_parser("build", help="fetch pinned sources and convert them to ONNX")
    _common(b)
    b.add_argument("--only", nargs="*", help="build only these models")
    b.add_argument("--force", action="store_true", help="rebuild even if up to date")
    b.set_defaults(func=cmd_models_build)
    ls = msub.add_parser("list", help="every model on disk, its precision variants and the "
                         "active one (GET /v1/models lists those a server loaded)")
    _common(ls)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_models_list)
    v = msub.add_parser("verify", help="check every model file against its sha256")
    _common(v)
    v.set_defaults(func=cmd_models_verify)
    q = msub.add_parser("quantize", help="INT8/FP16 variants behind the accuracy gate")
    _common(q)
    q.add_argument("--models", nargs="+", help="models to quantize (default: detector, mesh, "
                   "iris, recognizer)")
    q.add_argument("--format", default="auto",
                   choices=["auto", "qdq-u8s8", "qop-u8s8", "qdq-s8s8"])
    q.add_argument("--calibration", default="auto",
                   choices=["auto", "minmax", "percentile", "entropy"])
    q.add_argument("--fp16", action="store_true", help="also make FP16 variants (for GPUs)")
    q.add_argument("--report-dir", help="where quantization.json/.md go "
                   "(default $FACEFUSE_HOME/reports)")
    q.add_argument("--benchmarks", help="a BENCHMARKS.md whose quantization section to "
                   "rewrite (default: none)")
    q.add_argument("--no-bench", action="store_true", help="skip the timing/RSS measurements")
    q.add_argument("--missing", action="store_true",
                   help="judge only models with no recorded verdict for their current FP32 "
                   "file and this request; a refusal is a warning, not an error (what "
                   "`make models` runs)")
    q.set_defaults(func=cmd_models_quantize)


def _add_analyse_parser(sub: Any) -> None:
    a = sub.add_parser("analyse", aliases=["analyze"], help="detect and describe faces")
    _common(a)
    a.add_argument("image")
    a.add_argument("--json", action="store_true", help="print JSON")
    a.add_argument("--landmarks", action="store_true", help="include the 478-point mesh")
    a.add_argument("--attributes", action="store_true", help="estimate age and gender")
    a.add_argument("--annotate", metavar="PNG", help="write an annotated copy")
    a.set_defaults(func=cmd_analyse)


def _add_fuse_parser(sub: Any) -> None:
    """``facefuse fuse``: its images and outputs, the batch flags, the fusion options."""
    f = sub.add_parser(
        "fuse", help="fuse the source face into the target image (or many targets)",
        description="SOURCE... TARGET -o OUT fuses one target; SOURCE... --targets DIR|GLOB "
        "--out-dir OUT (or --pairs CSV --out-dir OUT) fuses many, skipping outputs that "
        "exist (resume) and reporting bad files with their error code (exit 1 if any).")
    _common(f)
    f.add_argument("images", nargs="*", metavar="IMAGE",
                   help="source image(s), then the target image (one fusion); only sources "
                   "with --targets")
    f.add_argument("-o", "--output", help="output image (.jpg/.png/.webp)")
    f.add_argument("--targets", nargs="+", metavar="DIR|GLOB|FILE",
                   help="batch: target images (directories, globs such as 'in/*.jpg', files)")
    f.add_argument("--pairs", metavar="CSV", help="batch: rows of source,target[,output]")
    f.add_argument("--out-dir", help="batch: where outputs go (<target name>.<format>)")
    f.add_argument("--format", choices=["jpeg", "png", "webp"], default="jpeg",
                   help="batch: output format (default jpeg)")
    f.add_argument("--jobs", type=int, default=1, help="batch: targets fused at a time "
                   "(memory grows with it; default 1)")
    f.add_argument("--overwrite", action="store_true", help="batch: redo existing outputs")
    f.add_argument("--allow-outside-out-dir", action="store_true",
                   help="batch: let --pairs outputs be absolute or outside --out-dir")
    f.add_argument("--json-report", metavar="JSON", help="batch: write done/skipped/failed")
    f.add_argument("--no-progress", action="store_true", help="batch: no progress bar")
    _fusion_flags(f)
    f.add_argument("--quality", type=int, default=92, help="JPEG/WebP quality")
    f.add_argument("--report", metavar="JSON", help="write the quality/timing report")
    f.add_argument("--contact-sheet", metavar="PNG",
                   help="write source, target, outputs at degrees 0/50/100 and at 100 "
                        "without relighting and occluder masks")
    f.set_defaults(func=cmd_fuse)


def _add_video_parsers(sub: Any) -> None:
    """``facefuse video`` and ``facefuse worker``."""
    vd = sub.add_parser(
        "video", help="fuse the source face into every frame of a clip",
        description="SOURCE... CLIP -o OUT: the clip with the source identity fused in, "
        "frame rate, frame count, rotation, colour range and audio kept; written "
        "atomically.")
    _common(vd)
    vd.add_argument("inputs", nargs="*", metavar="FILE",
                    help="source image(s), then the clip")
    vd.add_argument("-o", "--output", help="output clip (.mp4, .mkv, .webm, .mov)")
    vd.add_argument("--list-encoders", action="store_true",
                    help="print the encoders, their licences and containers, and exit")
    from facefuse.video.options import VideoOptions

    _add_option_flags(vd.add_argument_group("clip options"), VideoOptions)
    vd.add_argument("--no-progress", action="store_true", help="no progress bar")
    vd.add_argument("--report", metavar="JSON", help="write the clip's report")
    _fusion_flags(vd)
    vd.set_defaults(func=cmd_video)

    wk = sub.add_parser("worker", help="run fusion jobs from the queue (FACEFUSE_JOBS_REDIS_URL)",
                        description="Takes jobs posted to /v1/jobs from the Redis queue, one "
                        "at a time; SIGTERM finishes or hands back the running job.")
    _common(wk)
    wk.add_argument("--metrics-port", type=int, default=0,
                    help="serve Prometheus metrics on this port (default: off)")
    wk.set_defaults(func=cmd_worker)


def build_parser() -> argparse.ArgumentParser:
    """The command line: every subcommand and its options."""
    p = argparse.ArgumentParser(prog="facefuse", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = p.add_subparsers(dest="command", required=True)
    _add_models_parser(sub)
    s = sub.add_parser("samples", help="fetch the pinned sample photos")
    s.set_defaults(func=cmd_samples)
    _add_analyse_parser(sub)
    _add_fuse_parser(sub)
    _add_video_parsers(sub)
    sv = sub.add_parser("serve", help="run the HTTP API (uvicorn)")
    _common(sv)
    sv.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    sv.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    sv.set_defaults(func=cmd_serve)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        rc: int = args.func(args)
        return rc
    except FacefuseError as exc:
        print(f"error[{exc.code}]: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug, not bad input: say so without a traceback wall
        if args.verbose:
            raise
        print(f"error[internal]: {type(exc).__name__}: {exc} (rerun with -v for details)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
