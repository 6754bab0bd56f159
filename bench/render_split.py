"""Where the classic render's CPU goes: working pixels, full-resolution pixels, fixed.

The classic render works at a reduced working scale (the target's outer eye corners
``work_eye_px`` apart, whatever the photo's size) and puts the layer together at
the photo's own resolution (the detail bands, the blend, the irises, the masks'
upsampling). This bench renders the same portraits' pairs (``bench/serve.py``'s
distinct portraits, every pair a new source: the per-source memo off) scaled to
several sizes, each at several working eye distances, interleaved round by round,
and fits the render's CPU as

    cpu = fixed + working · (eye / eye₀)² + full · (megapixels / reference)

by least squares: ``working`` is what scales with the working image's pixels (at
the shipped scale eye₀), ``full`` what scales with the photo's (at the reference
size), ``fixed`` neither (work sized by the mesh, and the per-call cost of the code:
its Python and the NumPy and OpenCV calls' own overhead). It also times four
full-resolution steps inside each render, and, at the reference size, the work
around the render: decoding and analysing both images, encoding the output.

    .venv/bin/python bench/render_split.py [--eyes 80 64 48] [--megapixels 1.5 2 3]
        [--pairs 12] [--rounds 5] [--out DIR]

CPU is the process's (all threads: the caller's and OpenCV's pool), medians of
the rounds, ms per render. The render writes into its own copy of the target, as
the server's does (no full-frame copy inside the timing). Writes
bench/results/render_split.json and the "render_split" section of BENCHMARKS.md
(with ``--out``: the JSON there, and no section). The eye distances are kept at or
above 48 px and the sizes where every face's eyes are further apart than the
largest working distance: smaller, the full-resolution detail's split blur widens
or the working scale stops shrinking the face, and the model above no longer holds.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.fusion import engine
from facefuse.fusion.engine import MappedFace
from facefuse.fusion.swappers.classic import detail, eyes
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import decode_image
from facefuse.imaging.encode import encode_image
from realism import memo_free_fuser
from report import alternate, machine, machine_line, write_json, write_section
from serve import Inputs

#: Full-resolution steps of a render timed on their own: (module, function name).
FULL_RESOLUTION_STEPS = ((detail, "full_resolution_layer"), (engine, "blend_layer"),
                         (eyes, "iris_colour"), (eyes, "recolour_irises"))


@contextmanager
def timed_steps(steps: tuple[tuple[Any, str], ...]) -> Iterator[dict[str, float]]:
    """Wrap each step so the process CPU time (s, all threads) spent in it is summed
    under its name in the yielded dict (the callers look the functions up on their
    module at call time); the originals are put back on exit."""
    spent: dict[str, float] = defaultdict(float)
    originals = [(mod, name, getattr(mod, name)) for mod, name in steps]

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.process_time() - t
        return run

    try:
        for mod, name, fn in originals:
            setattr(mod, name, wrap(name, fn))
        yield spent
    finally:
        for mod, name, fn in originals:
            setattr(mod, name, fn)


def split(cells: Sequence[tuple[float, float, float]], eye0: float, mp0: float
          ) -> tuple[tuple[float, float, float], np.ndarray]:
    """Least-squares ``(fixed, working, full)`` ms of ``cpu = fixed + working · (eye /
    eye0)² + full · (mp / mp0)`` over ``cells`` of (eye px, megapixels, cpu ms), and
    what the fit misses each cell by (measured − fitted, ms, in ``cells``' order)."""
    a = np.array([[1.0, (e / eye0) ** 2, m / mp0] for e, m, _ in cells])
    y = np.array([c for _, _, c in cells])
    parts, *_ = np.linalg.lstsq(a, y, rcond=None)
    fixed, working, full = (float(v) for v in parts)
    return (fixed, working, full), y - a @ parts


def analyse(fuser: Any, rgb: np.ndarray) -> list[Any]:
    """What a fusion's analysis runs on an (H, W, 3) uint8 RGB image: the largest
    face, no identity embedding."""
    faces: list[Any] = fuser.analyser.analyse(rgb, embed=False, purpose="largest")
    return faces


def around_render(fuser: Any, encoded: list[tuple[bytes, bytes]], outputs: list[np.ndarray]
                  ) -> dict[str, float]:
    """Process CPU ms per request of the work around the render, in process: decoding
    both images of each ``encoded`` pair, analysing both and encoding its fused
    (H, W, 3) uint8 output (JPEG q92)."""
    spent: dict[str, float] = defaultdict(float)
    for (a, b), output in zip(encoded, outputs, strict=True):
        t = time.process_time()
        images = decode_image(a), decode_image(b)
        spent["decode"] += time.process_time() - t
        t = time.process_time()
        for rgb in images:
            analyse(fuser, rgb)
        spent["analyse"] += time.process_time() - t
        t = time.process_time()
        encode_image(output, "jpeg", 92)
        spent["encode"] += time.process_time() - t
    return {k: 1000 * v / len(encoded) for k, v in spent.items()}


class Renders:
    """The analysed pairs of one size and their renders (each into a fresh copy of
    its target, outside the timing)."""

    def __init__(self, fuser: Any, encoded: list[tuple[bytes, bytes]]) -> None:
        self.fuser = fuser
        self.encoded: list[tuple[bytes, bytes]] = []
        self.pairs = []
        for a, b in encoded:
            src, tgt = decode_image(a), decode_image(b)
            sf, tf = analyse(fuser, src), analyse(fuser, tgt)
            if sf and tf:
                self.encoded.append((a, b))
                self.pairs.append((src, sf[0], tgt, tf))
        if not self.pairs:
            raise SystemExit("no pair with a face on both sides")
        self.outputs = [tgt for _, _, tgt, _ in self.pairs]
        self.options = FuseOptions(degree=80, evaluate=False)

    def run(self) -> float:
        """Render every pair; process CPU ms per render."""
        spent = 0.0
        for i, (src, sf, tgt, tf) in enumerate(self.pairs):
            out = tgt.copy()
            t = time.process_time()
            self.fuser.fuse_mapped([src], [MappedFace(0, sf, 0)], out, tf, self.options,
                                   in_place=True)
            spent += time.process_time() - t
            self.outputs[i] = out
        return 1000 * spent / len(self.pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eyes", type=float, nargs="+", default=[80.0, 64.0, 48.0],
                    help="working eye distances (px); the first is the shipped one")
    ap.add_argument("--megapixels", type=float, nargs="+", default=[1.5, 2.0, 3.0],
                    help="photo sizes; the middle one is the reference")
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", help="write render_split.json here (and leave BENCHMARKS.md alone)")
    args = ap.parse_args()
    if len(args.eyes) * len(args.megapixels) < 3 or len(set(args.eyes)) < 2 \
            or len(set(args.megapixels)) < 2:
        ap.error("the fit needs two eye distances and two sizes at least")

    fuser, _ = memo_free_fuser()
    swapper = fuser.swappers["classic"]
    mp0 = sorted(args.megapixels)[len(args.megapixels) // 2]
    sizes = {mp: Renders(fuser, list(Inputs(fuser.settings, megapixels=mp, seed=3)
                                      .pairs(args.pairs)))
             for mp in args.megapixels}
    cells = [(e, mp) for mp in args.megapixels for e in args.eyes]
    for renders in sizes.values():
        renders.run()  # (warm: first calls, OpenCV's pool)
    cpu: dict[tuple[float, float], list[float]] = defaultdict(list)
    steps: dict[tuple[float, float], dict[str, list[float]]] = defaultdict(
        lambda: defaultdict(list))
    outside: dict[str, list[float]] = defaultdict(list)
    for r in range(args.rounds):
        for eye, mp in alternate(cells, r):
            swapper.work_eye_px = eye
            renders = sizes[mp]
            with timed_steps(FULL_RESOLUTION_STEPS) as spent:
                cpu[eye, mp].append(renders.run())
            for _, name in FULL_RESOLUTION_STEPS:
                steps[eye, mp][name].append(1000 * spent[name] / len(renders.pairs))
        ref = sizes[mp0]
        for stage, ms in around_render(fuser, ref.encoded, ref.outputs).items():
            outside[stage].append(ms)
    medians = {c: statistics.median(v) for c, v in cpu.items()}
    (fixed, working, full), misfit = split([(e, mp, medians[e, mp]) for e, mp in cells],
                                           args.eyes[0], mp0)
    res = {
        "machine": machine(), "rounds": args.rounds, "eye0": args.eyes[0], "mp0": mp0,
        "pairs": {str(mp): len(r.pairs) for mp, r in sizes.items()},
        "cells": [{"eye": e, "megapixels": mp, "cpu_ms": medians[e, mp],
                   "cpu_rounds": cpu[e, mp],
                   "steps_ms": {n: statistics.median(v) for n, v in steps[e, mp].items()}}
                  for e, mp in cells],
        "split_ms": {"fixed": fixed, "working": working, "full": full,
                     "rms_misfit": float(np.sqrt(np.mean(np.square(misfit)))),
                     "worst_misfit": float(np.max(np.abs(misfit)))},
        "outside_render_ms": {k: statistics.median(v) for k, v in outside.items()},
    }
    write_json("render_split", res, args.out)
    md = report(res, args)
    if args.out is None:
        write_section("render_split", md)
    print(md)


def report(res: dict[str, Any], args: argparse.Namespace) -> str:
    """The BENCHMARKS section of ``res``."""
    names = [name for _, name in FULL_RESOLUTION_STEPS]
    eye0, mp0 = res["eye0"], res["mp0"]
    pairs = ", ".join(f"{n} at {mp} MP" for mp, n in res["pairs"].items())
    lines = [
        "## The classic render: working pixels, full-resolution pixels, fixed "
        "(`bench/render_split.py`)",
        "",
        machine_line(res["machine"]),
        f"Command: `.venv/bin/python bench/render_split.py --eyes "
        f"{' '.join(f'{e:g}' for e in args.eyes)} --megapixels "
        f"{' '.join(f'{m:g}' for m in args.megapixels)} --pairs {args.pairs} --rounds "
        f"{args.rounds}`: the same portraits' pairs ({pairs}; distinct portraits "
        "scaled to each size and then by 0.7-1.0, the per-source memo off), degree 80, "
        "every size at every working eye distance in turn; process CPU ms per render "
        f"(all threads; medians of the rounds). {eye0:g} px is the shipped working "
        "scale.",
        "",
        "| MP | working eye distance px | render | " + " | ".join(names)
        + " | the rest |",
        "|---:|---:|---:|" + "---:|" * len(names) + "---:|",
    ]
    for cell in res["cells"]:
        st = cell["steps_ms"]
        lines.append(f"| {cell['megapixels']:g} | {cell['eye']:g} | {cell['cpu_ms']:.1f} | "
                     + " | ".join(f"{st[n]:.1f}" for n in names)
                     + f" | {cell['cpu_ms'] - sum(st.values()):.1f} |")
    sp = res["split_ms"]
    ref = next(c for c in res["cells"] if c["eye"] == eye0 and c["megapixels"] == mp0)
    lines += [
        "",
        f"Least squares, `cpu = fixed + working · (eye / {eye0:g})² + full · (MP / "
        f"{mp0:g})`: of the shipped render at {mp0:g} MP ({ref['cpu_ms']:.1f} ms "
        f"measured), **{sp['full']:.1f} ms** scale with the photo's pixels, "
        f"**{sp['working']:.1f}** with the working image's, and **{sp['fixed']:.1f}** "
        "with neither (work sized by the mesh, and the per-call cost of the code). "
        f"The fit misses the measured cells by {sp['rms_misfit']:.1f} ms RMS, "
        f"{sp['worst_misfit']:.1f} at worst; it reaches no working image smaller than "
        f"{min(args.eyes):g} px's, so what scales with the eye distance itself (an "
        "outline's length) lands partly in the fixed part.",
    ]
    around = res["outside_render_ms"]
    if around:
        lines += [
            "",
            f"Around the render at {mp0:g} MP, in the same process and rounds (CPU ms a "
            "request): " + ", ".join(f"{k} {v:.1f}" for k, v in around.items())
            + f" (both images decoded and analysed, the output encoded): "
            f"**{sum(around.values()):.1f} ms** besides the render, and besides the "
            "server's own work (HTTP, multipart, hashing, the batchers).",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
