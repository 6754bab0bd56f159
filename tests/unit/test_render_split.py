"""bench/render_split.py: its step timer, and the bench end to end at its smallest."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from render_split import timed_steps  # noqa: E402


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


@pytest.mark.bench
def test_render_split_times_the_render_at_two_scales(model_dir: Path, sample_paths: object,
                                                      tmp_path: Path) -> None:
    before = (ROOT / "BENCHMARKS.md").read_text()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "render_split.py"), "--eyes", "80", "32",
         "--pairs", "2", "--rounds", "1", "--megapixels", "1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (ROOT / "BENCHMARKS.md").read_text() == before
    res = json.loads((tmp_path / "render_split.json").read_text())
    assert res["pairs"] == 2 and list(res["eyes"]) == ["80.0", "32.0"]
    for row in res["eyes"].values():
        steps = row["full_resolution_ms"]
        assert set(steps) == {"full_resolution_layer", "blend_layer", "iris_colour",
                              "recolour_irises"}
        # Every step ran inside the render and costs part of it, not more.
        assert all(ms > 0 for ms in steps.values())
        assert sum(steps.values()) < row["cpu_ms"]
    assert set(res["outside_render_ms"]) == {"decode", "analyse", "encode"}
    assert all(ms > 0 for ms in res["outside_render_ms"].values())
    assert "fewer pixels" in proc.stdout
