"""``facefuse video`` as a process: stopped with SIGTERM mid-clip it removes its
partial output and exits 130, as with Ctrl-C; a clip path that is not there is a
typed error with the input exit code, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from worker_harness import wait_for

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.toolchain.clips import Scene, motion_frames, write_clip

pytestmark = pytest.mark.slow


def _env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FACEFUSE_")}
    env.update({"FACEFUSE_HOME": str(settings.home), "FACEFUSE_THREADS": "1"})
    return env


def _video(settings: Settings, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "facefuse.cli", "video", "--no-progress",
                             *args], env=_env(settings), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_sigterm_mid_clip_leaves_no_partial_output(
        settings: Settings, model_dir: Path, tmp_path: Path, analyser: FaceAnalyser,
        sample_images: dict[str, np.ndarray], sample_paths: dict[str, Path]) -> None:
    photo = sample_images["obama"]
    b = analyser.analyse(photo, embed=False)[0].bbox
    face = (float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2, float(b[2] - b[0]))
    clip = write_clip(tmp_path / "clip.mp4",
                      list(motion_frames(Scene(photo, 300, face, size=(480, 360),
                                               face_px=130))))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = _video(settings, str(sample_paths["biden"]), str(clip), "-o",
                  str(out_dir / "fused.mp4"))
    try:
        # The writer's hidden temporary is there once the clip is being fused.
        wait_for(lambda: bool(list(out_dir.iterdir())) or proc.poll() is not None, 240,
                 "the clip never started")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err.decode(errors="replace")
    assert b"Traceback" not in err
    assert list(out_dir.iterdir()) == []


def test_a_missing_clip_is_a_typed_error(settings: Settings, model_dir: Path, tmp_path: Path,
                                         sample_paths: dict[str, Path]) -> None:
    proc = _video(settings, str(sample_paths["biden"]), str(tmp_path / "no-such.mp4"), "-o",
                  str(tmp_path / "out.mp4"))
    _, err = proc.communicate(timeout=240)
    text = err.decode(errors="replace")
    assert proc.returncode == 3, text
    assert "error[video_not_found]" in text and "Traceback" not in text
    assert list(tmp_path.iterdir()) == []
