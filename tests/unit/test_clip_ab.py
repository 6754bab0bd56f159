"""bench/clip_ab.py end to end: the checkout against its own HEAD."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
def test_clip_ab_pairs_frames_of_two_trees(model_dir: Path, sample_paths: object,
                                           tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "clip_ab.py"), "--base", "HEAD", "--rounds", "1",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "clip_ab.json").read_text())
    assert result["frames"] == 59 and result["revs"][-1] == "checkout"
    assert all(ms > 0 for ms in result["cpu_ms"].values())
    # The same code on both sides (the checkout's src/ only differs from HEAD's by
    # uncommitted edits): frames processed side by side cost the same, within the
    # noise of a median of per-frame ratios.
    ratio = result["ratios"]["checkout"]["cpu"]
    assert 0.8 < ratio < 1.25, result
