"""bench/gpu_check.py end to end on the CPU, at the smallest settings (needs the bench extra)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
def test_gpu_check_runs_on_cpu_and_writes_json_and_markdown(
        settings: object, model_dir: Path, sample_paths: object, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if importlib.util.find_spec("onnx2torch") is None:  # imported by the script, see there
        pytest.skip("onnx2torch is not installed (make bench-gpu-deps)")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu",
         "--models", "iris,dlib_resnet", "--batches", "1,2", "--iters", "1",
         "--sizes", "512", "--per-photo", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "gpu_check.json").read_text())
    for name in ("iris", "dlib_resnet"):
        for prec in ("fp32", "fp16"):
            row = res["models"][name][prec]
            assert row["gate"] == "pass", row["failures"]
            assert set(row["ms_per_item"]) == {"1", "2"}
    pix = res["pixels"]["512"]
    assert pix["graphs_torch_cpu"]["psnr_vs_opencv_db"] >= 40.0
    assert pix["onnxruntime_cpu"]["psnr_vs_opencv_db"] >= 40.0
    assert res["throughput"]["fp32"]["best_batch"] in (1, 2)
    md = (out / "gpu_check.md").read_text()
    assert "| iris | torch fp16 | pass |" in md
