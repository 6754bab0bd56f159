"""bench/render_split.py: its step timer and fit, and the bench end to end at its smallest."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from render_split import report, split, timed_steps  # noqa: E402


def test_timed_steps_sums_each_step_and_puts_the_originals_back() -> None:
    mod = types.SimpleNamespace()

    def busy(n: int) -> int:
        return sum(i * i for i in range(n))

    def fails() -> None:
        raise ValueError("step failed")

    mod.busy, mod.fails = busy, fails
    steps = ((mod, "busy"), (mod, "fails"))
    with timed_steps(steps) as spent:
        assert mod.busy is not busy and mod.busy.__name__ == "busy"
        assert mod.busy(200_000) == busy(200_000)
        first = spent["busy"]
        mod.busy(200_000)
        with pytest.raises(ValueError, match="step failed"):
            mod.fails()
    assert first > 0.0 and spent["busy"] > first
    assert "fails" in spent  # (timed though it raised)
    assert mod.busy is busy and mod.fails is fails
    # Put back when the body fails, too.
    with pytest.raises(RuntimeError), timed_steps(steps):
        raise RuntimeError
    assert mod.busy is busy and mod.fails is fails


def test_split_recovers_the_three_parts_and_the_report_quotes_them() -> None:
    # cpu = 18 + 16·(eye/80)² + 15·(MP/2), exactly.
    cells = [(e, mp, 18.0 + 16.0 * (e / 80.0) ** 2 + 15.0 * mp / 2.0)
             for e in (80.0, 64.0, 48.0) for mp in (1.5, 2.0, 3.0)]
    (fixed, working, full), misfit = split(cells, 80.0, 2.0)
    assert fixed == pytest.approx(18.0) and working == pytest.approx(16.0)
    assert full == pytest.approx(15.0)
    assert misfit == pytest.approx(0.0, abs=1e-9)
    # A cost that grows with the working image's side, not its area, is not all
    # working pixels: the fit puts part of it in the fixed part.
    (fixed_l, working_l, _), misfit_l = split(
        [(e, mp, c + 8.0 * e / 80.0) for e, mp, c in cells], 80.0, 2.0)
    assert fixed_l > fixed + 1.0 and working < working_l < working + 8.0
    assert 0.0 < float(abs(misfit_l).max()) < 1.0  # (and the fit shows it misses)
    names = ("full_resolution_layer", "blend_layer", "iris_colour", "recolour_irises")
    res = {"machine": {"cpu": "x", "cores": 2, "flags": [], "python": "3", "onnxruntime": "1",
                       "date": "d"},
           "eye0": 80.0, "mp0": 2.0, "pairs": {"2.0": 3},
           "cells": [{"eye": e, "megapixels": mp, "cpu_ms": c,
                      "steps_ms": dict.fromkeys(names, 1.0)} for e, mp, c in cells],
           "split_ms": {"fixed": fixed, "working": working, "full": full,
                        "rms_misfit": 0.0, "worst_misfit": 0.0},
           "outside_render_ms": {"decode": 7.0, "analyse": 30.0, "encode": 5.0}}
    md = report(res, argparse.Namespace(eyes=[80.0, 64.0, 48.0], megapixels=[1.5, 2.0, 3.0],
                                        pairs=3, rounds=1))
    assert "**15.0 ms** scale with the photo's pixels" in md
    assert "**16.0** with the working image's" in md and "**18.0** with neither" in md
    assert "| 2 | 80 | 49.0 | 1.0 | 1.0 | 1.0 | 1.0 | 45.0 |" in md
    assert "**42.0 ms** besides the render" in md


@pytest.mark.bench
def test_render_split_times_the_render_at_two_scales(model_dir: Path, sample_paths: object,
                                                      tmp_path: Path) -> None:
    before = (ROOT / "BENCHMARKS.md").read_text()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "render_split.py"), "--eyes", "80", "48",
         "--megapixels", "1.5", "2", "--pairs", "2", "--rounds", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (ROOT / "BENCHMARKS.md").read_text() == before
    res = json.loads((tmp_path / "render_split.json").read_text())
    assert res["pairs"] == {"1.5": 2, "2.0": 2} and len(res["cells"]) == 4
    for cell in res["cells"]:
        steps = cell["steps_ms"]
        assert set(steps) == {"full_resolution_layer", "blend_layer", "iris_colour",
                              "recolour_irises"}
        # Every step ran inside the render (a wrapper that missed it would read 0).
        assert all(ms > 0 for ms in steps.values())
        assert cell["cpu_ms"] > 0
    # Two eye distances by two sizes: four cells, three parts, one degree of freedom.
    sp = res["split_ms"]
    assert sp["rms_misfit"] >= 0 and sp["worst_misfit"] >= sp["rms_misfit"]
    assert set(res["outside_render_ms"]) == {"decode", "analyse", "encode"}
    assert all(ms > 0 for ms in res["outside_render_ms"].values())
    assert "scale with the photo's pixels" in proc.stdout
