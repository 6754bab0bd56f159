"""bench/naive_vs_facefuse.py and bench/runtime_per_model.py end to end at their smallest
settings (need the bench extra: torch, onnx2torch, matplotlib)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def needs_bench_extra() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    if importlib.util.find_spec("onnx2torch") is None:  # imported by the scripts
        pytest.skip("onnx2torch is not installed (make bench-gpu-deps)")


def run(script: str, *args: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.bench
def test_naive_and_facefuse_serve_the_same_fusion_and_are_both_measured(
        settings: object, model_dir: Path, sample_paths: object, tmp_path: Path) -> None:
    needs_bench_extra()
    run("naive_vs_facefuse.py", "--rounds", "1", "--duration", "1", "--levels", "1",
        "--naive-workers", "1", "--megapixels", "0.5", "--out", str(tmp_path))
    res = json.loads((tmp_path / "naive_vs_facefuse.json").read_text())
    assert set(res["summary"]) == {"facefuse", "naive ×1"}
    for name, levels in res["summary"].items():
        row = levels["1"]
        assert row["requests"] >= 1 and row["errors"] == 0, (name, row)
        assert row["peak_rss_mb"] > 0
    same = res["same_pair"]
    # The same stages and fusion code: only the runtime and the blend's extent differ.
    assert abs(same["naive ×1"]["similarity"] - same["facefuse"]["similarity"]) < 0.01
    assert same["naive ×1"]["psnr_vs_first_db"] > 40.0
    for png in ("naive_latency.png", "naive_rss.png", "naive_bars.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


@pytest.mark.bench
def test_runtime_per_model_measures_each_runtime_in_its_own_process(
        settings: object, model_dir: Path, sample_paths: object, tmp_path: Path) -> None:
    needs_bench_extra()
    run("runtime_per_model.py", "--models", "iris", "--batches", "1", "--iters", "1",
        "--calibration-per-photo", "1", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "runtime_per_model.json").read_text())["rows"]["iris"]
    assert set(rows) == {"ort fp32 b1", "torch fp32 b1", "ort int8 b1"}
    for row in rows.values():
        assert row["ms_p50"] > 0 and row["peak_rss_mb"] >= row["import_rss_mb"] > 0
    # torch's import alone is far heavier than onnxruntime's: separate processes show it.
    assert rows["torch fp32 b1"]["import_rss_mb"] > rows["ort fp32 b1"]["import_rss_mb"]
    assert rows["ort int8 b1"]["file_mb"] < rows["ort fp32 b1"]["file_mb"]
