"""The playground's video panel in a real headless Chromium against a real API, Redis
and worker: a clip goes in as a job, its progress shows, the fused clip plays."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from server_harness import USER_TOKEN, ServerProcess
from test_playground import CHROMEDRIVER, CHROMIUM, browser, wait_for
from worker_harness import WorkerProcess

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.toolchain.clips import Scene, motion_frames, write_clip

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromium / chromium-driver missing: run scripts/install-system-deps.sh")]
__all__ = ["browser"]  # the fixture, re-used


@pytest.fixture
def stack(settings: Settings, model_dir: Path, redis_server: Any,
          tmp_path: Path) -> Iterator[ServerProcess]:
    api = ServerProcess(settings.home, tmp_path, {"FACEFUSE_JOBS_REDIS_URL": redis_server.url,
                                                  "FACEFUSE_API_KEYS": f"t:{USER_TOKEN}"},
                        name="video-playground").start()
    worker = WorkerProcess(settings.home, tmp_path, redis_server.url).start()
    try:
        yield api
    finally:
        worker.kill()
        api.kill()


def test_video_panel_fuses_and_plays_a_clip(browser: Any, stack: ServerProcess,
                                            analyser: FaceAnalyser,
                                            sample_images: dict[str, np.ndarray],
                                            sample_paths: dict[str, Path],
                                            tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    photo = sample_images["obama"]
    b = analyser.analyse(photo, embed=False)[0].bbox
    face = (float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2, float(b[2] - b[0]))
    clip = write_clip(tmp_path / "clip.mp4", list(motion_frames(
        Scene(photo, 8, face, size=(480, 360), face_px=130))))

    browser.get(stack.url + "/")
    browser.find_element(By.ID, "key").send_keys(USER_TOKEN, Keys.TAB)
    assert browser.find_element(By.ID, "video-fuse").get_attribute("disabled")
    browser.find_element(By.ID, "source-file").send_keys(str(sample_paths["biden"]))
    browser.find_element(By.ID, "clip-file").send_keys(str(clip))
    browser.find_element(By.ID, "video-fuse").click()
    status = lambda: browser.find_element(By.ID, "video-status")  # noqa: E731
    wait_for(lambda: status().text.startswith("Done") or status().get_attribute("class")
             == "error", 240, "the fused clip")
    assert status().text.startswith("Done: 8 frames (8 fused)"), status().text
    # The browser decodes the result: it has a duration and a picture of the clip's size.
    size = wait_for(lambda: browser.execute_script(
        "const v = document.getElementById('video-result');"
        "return v.readyState >= 1 ? [v.videoWidth, v.videoHeight, v.duration] : null"),
        30, "the video's metadata")
    assert size[:2] == [480, 360] and size[2] > 0.2
    assert browser.find_element(By.ID, "video-download").is_displayed()
