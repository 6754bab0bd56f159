"""Live fusion end to end in a real headless Chromium (Debian ``chromium`` driven by
selenium) whose fake camera plays a ``.y4m`` clip made from the sample photos:
the playground's live panel uploads the source photo, opens a session, shows the
fused stream beside the camera, changes the degree mid-session, and a frame
captured from the fused ``<video>`` shows the source's identity to the recogniser;
Stop ends the session on the server."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import httpx
import numpy as np
import pytest
from server_harness import USER_TOKEN, ServerProcess, graceful
from test_playground import CHROMEDRIVER, CHROMIUM, headless_chromium, wait_for

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.clips import Scene, motion_frames

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromium / chromium-driver missing: run scripts/install-system-deps.sh")

CAMERA, SOURCE, SOURCE_AGAIN = "biden", "obama2", "obama"


def write_y4m(path: Path, frames: list[np.ndarray], fps: int) -> Path:
    """A YUV4MPEG2 clip (4:2:0) of RGB frames: what Chromium's fake camera plays."""
    h, w = frames[0].shape[:2]
    with path.open("wb") as f:
        f.write(f"YUV4MPEG2 W{w} H{h} F{fps}:1 Ip A1:1 C420jpeg\n".encode())
        for rgb in frames:
            f.write(b"FRAME\n")
            f.write(cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420).tobytes())
    return path


@pytest.fixture(scope="module")
def camera_clip(analyser: FaceAnalyser, sample_images: dict[str, np.ndarray],
                tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """(the .y4m clip, its first frame): the camera person's head moving, 480x360."""
    photo = sample_images[CAMERA]
    b = analyser.analyse(photo, embed=False)[0].bbox
    scene = Scene(photo, 30, (float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2,
                              float(b[2] - b[0])), size=(480, 360), face_px=140.0)
    frames = list(motion_frames(scene))
    frames += frames[::-1]
    return write_y4m(tmp_path_factory.mktemp("camera") / "camera.y4m", frames, 15), frames[0]


@pytest.fixture(scope="module")
def server(settings: Settings, model_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("live-browser"), {
        "FACEFUSE_API_KEYS": f"tests:{USER_TOKEN}",
        "FACEFUSE_TEMPLATES_DIR": str(tmp_path_factory.mktemp("templates")),
        "FACEFUSE_LIVE_IDLE_S": "3",
    }, name="live-browser")
    with graceful(proc):
        yield proc


@pytest.fixture
def browser(tmp_path: Path, camera_clip: tuple[Path, np.ndarray]) -> Iterator[Any]:
    with headless_chromium(
            tmp_path / "chrome-profile", "--window-size=1280,1400",
            "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
            f"--use-file-for-fake-video-capture={camera_clip[0]}",
            # host candidates as addresses, not mDNS names aiortc would resolve
            "--disable-features=WebRtcHideLocalIpsWithMdns",
            "--autoplay-policy=no-user-gesture-required") as driver:
        yield driver


CAPTURE = """
const v = document.getElementById(arguments[0]);
const c = document.createElement("canvas");
c.width = v.videoWidth; c.height = v.videoHeight;
c.getContext("2d").drawImage(v, 0, 0);
return c.toDataURL("image/png");
"""


def capture(browser: Any, video_id: str) -> np.ndarray:
    url = browser.execute_script(CAPTURE, video_id)
    return decode_image(base64.b64decode(url.partition(",")[2]))[:, :, :3]


def embedding(analyser: FaceAnalyser, rgb: np.ndarray) -> np.ndarray:
    faces = analyser.analyse(rgb, purpose="largest")
    assert faces and faces[0].embedding is not None, "no face in the frame"
    return np.asarray(faces[0].embedding)


def test_the_live_panel_fuses_the_camera_in_chromium(
        browser: Any, server: ServerProcess, sample_paths: dict[str, Path],
        sample_images: dict[str, np.ndarray], analyser: FaceAnalyser,
        camera_clip: tuple[Path, np.ndarray], tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    wait_for(lambda: browser.execute_script("return document.readyState") == "complete",
             30, "the page")
    browser.find_element(By.ID, "key").send_keys(USER_TOKEN)
    browser.find_element(By.ID, "source-file").send_keys(str(sample_paths[SOURCE]))
    browser.execute_script("arguments[0].value = 100; arguments[0].dispatchEvent("
                           "new Event('input'))", browser.find_element(By.ID, "live-degree"))
    browser.find_element(By.ID, "live-start").click()
    status = browser.find_element(By.ID, "live-status")
    wait_for(lambda: status.text in ("Live.",) or "error" in (status.get_attribute("class")
                                                             or ""), 90, "the session")
    assert status.text == "Live.", status.text
    session = browser.find_element(By.CSS_SELECTOR, "section[data-session]") \
        .get_attribute("data-session")
    assert session.startswith("/v1/live/")
    fused = browser.find_element(By.ID, "live-fused")
    wait_for(lambda: int(fused.get_attribute("data-frames") or 0) >= 30, 120,
             "fused frames shown")
    wait_for(lambda: browser.find_element(By.ID, "live-latency").text not in ("", "–"), 30,
             "the latency figures")
    assert " ms" in browser.find_element(By.ID, "live-latency").text
    browser.save_screenshot(str(tmp_path / "live.png"))
    # the recogniser on a frame decoded in the browser: the source's identity (against a
    # different photo of them), nearer than the camera person's own frame is
    frame = capture(browser, "live-fused")
    assert frame.shape[:2] == camera_clip[1].shape[:2]
    again = embedding(analyser, sample_images[SOURCE_AGAIN])
    fused_distance = float(np.linalg.norm(embedding(analyser, frame) - again))
    camera_distance = float(np.linalg.norm(embedding(analyser, camera_clip[1]) - again))
    assert fused_distance < camera_distance, (fused_distance, camera_distance)
    # the degree slider reaches the session on the data channel
    browser.execute_script("arguments[0].value = 30; arguments[0].dispatchEvent("
                           "new Event('input'))", browser.find_element(By.ID, "live-degree"))
    with httpx.Client(base_url=server.url, timeout=30,
                      headers={"Authorization": f"Bearer {USER_TOKEN}"}) as c:
        wait_for(lambda: c.get(session).json()["options"]["degree"] == 30, 30,
                 "the degree change")
        assert c.get(session).json()["state"] == "live"
        browser.find_element(By.ID, "live-stop").click()
        wait_for(lambda: browser.find_element(By.ID, "live-status").text == "Stopped.", 30,
                 "stop")
        assert c.get(session).status_code == 404
        assert c.get("/v1/live").json()["count"] == 0
