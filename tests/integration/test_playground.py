"""The web playground in a real headless Chromium (Debian ``chromium`` driven by
selenium through Debian's ``chromium-driver``) against a real server with API keys on.

Uploads the sample photos, types the key, picks a face with the keyboard, moves the
degree slider, fuses, and checks the result's pixels differ from the target inside
the chosen face only. Screenshots go to the test's tmp dir; with
``FACEFUSE_DOCS_SCREENSHOT=1`` one is also written to docs/playground.jpg.
"""

from __future__ import annotations

import base64
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from server_harness import USER_TOKEN, ServerProcess, graceful

from facefuse.config import Settings
from facefuse.imaging.decode import decode_image
from facefuse.imaging.encode import encode_image

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="chromium / chromium-driver missing: run scripts/install-system-deps.sh")
DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def server(settings: Settings, model_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("playground"), {
        "FACEFUSE_API_KEYS": f"tests:{USER_TOKEN}",
        "FACEFUSE_TEMPLATES_DIR": str(tmp_path_factory.mktemp("templates")),
    }, name="playground")
    with graceful(proc):
        yield proc


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or "chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,1100",
                 f"--user-data-dir={tmp_path / 'chrome-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER or "chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(check: Callable[[], Any], timeout: float = 120.0, what: str = "") -> Any:
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


FETCH_BLOB = """
const done = arguments[arguments.length - 1];
fetch(arguments[0]).then(r => r.blob()).then(b => {
  const reader = new FileReader();
  reader.onload = () => done(reader.result);
  reader.readAsDataURL(b);
});
"""


def test_playground_fuses_the_chosen_face_only(
        browser: Any, server: ServerProcess, sample_paths: dict[str, Path],
        make_group: Callable[..., np.ndarray], tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    group = make_group(["biden", "obama2", "obama3"])
    target = tmp_path / "group.png"
    target.write_bytes(encode_image(group, "png"))
    with httpx.Client(base_url=server.url, timeout=120,
                      headers={"Authorization": f"Bearer {USER_TOKEN}"}) as c:
        faces = c.post("/v1/faces", files={"image": ("g.png", target.read_bytes())}).json()
    boxes = [f["bbox"] for f in faces["faces"]]
    chosen = sorted(range(len(boxes)), key=lambda i: boxes[i][0])[1]  # the middle person

    browser.get(server.url + "/")
    assert browser.title == "facefuse playground"
    # no key yet: the page says so
    wait_for(lambda: "API key" in browser.find_element(By.ID, "status").text, 30, "key prompt")
    key = browser.find_element(By.ID, "key")
    key.send_keys(USER_TOKEN, Keys.TAB)  # change event: capabilities load with the key
    browser.find_element(By.ID, "source-file").send_keys(str(sample_paths["astronaut"]))
    browser.find_element(By.ID, "target-file").send_keys(str(target))
    wait_for(lambda: len(browser.find_elements(By.CSS_SELECTOR, ".face")) == len(boxes), 120,
             "face buttons")

    # keyboard: choose the face with Enter, move the slider with the arrow keys
    button = browser.find_element(By.ID, f"face-{chosen}")
    button.send_keys(Keys.ENTER)
    assert button.get_attribute("aria-pressed") == "true"
    assert browser.find_element(By.ID, "face-0").get_attribute("aria-pressed") == (
        "true" if chosen == 0 else "false")
    degree = browser.find_element(By.ID, "degree")
    degree.send_keys(*([Keys.ARROW_RIGHT] * 10))
    assert degree.get_attribute("value") == "90"
    assert browser.find_element(By.ID, "shape").get_attribute("value") == "90"
    assert browser.find_element(By.ID, "degree-out").text == "90"

    browser.find_element(By.ID, "fuse").click()
    wait_for(lambda: browser.find_element(By.ID, "status").text in ("Done.",)
             or "error" in (browser.find_element(By.ID, "status").get_attribute("class") or ""),
             180, "the result")
    assert browser.find_element(By.ID, "status").text == "Done."
    result = browser.find_element(By.ID, "result")
    data_url = browser.execute_async_script(FETCH_BLOB, result.get_attribute("src"))
    fused = decode_image(base64.b64decode(data_url.split(",", 1)[1]))
    assert fused.shape == group.shape

    changed = np.any(fused != group, axis=2)
    x0, y0, x1, y1 = (int(v) for v in boxes[chosen])
    assert changed[y0:y1, x0:x1].mean() > 0.05
    w, h = x1 - x0, y1 - y0
    around = np.zeros_like(changed)
    around[max(0, y0 - h // 2):y1 + h // 2, max(0, x0 - w // 2):x1 + w // 2] = True
    assert not changed[~around].any()
    for i, (a0, b0, a1, b1) in enumerate(boxes):
        if i != chosen:
            assert not changed[int(b0):int(b1), int(a0):int(a1)].any()

    facts = browser.find_element(By.ID, "facts").text
    assert "identity similarity" in facts and "compositeSynthetic" in facts
    assert "timings (ms)" in facts and "fuse" in facts
    link = browser.find_element(By.ID, "download")
    assert link.is_displayed() and link.get_attribute("download") == "facefuse.png"
    browser.save_screenshot(str(tmp_path / "playground-desktop.png"))
    if os.environ.get("FACEFUSE_DOCS_SCREENSHOT") == "1":
        from PIL import Image

        shot = Image.open(tmp_path / "playground-desktop.png").convert("RGB")
        shot.save(DOCS / "playground.jpg", quality=82, optimize=True)

    # a phone-width screen: no sideways scrolling, the controls still there
    browser.set_window_size(390, 844)
    time.sleep(0.3)
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    assert browser.find_element(By.ID, "fuse").is_displayed()
    browser.save_screenshot(str(tmp_path / "playground-phone.png"))
    assert (tmp_path / "playground-phone.png").stat().st_size > 0


def test_static_files_are_local(server: ServerProcess) -> None:
    page = httpx.get(server.url + "/").text
    assert "http://" not in page and "https://" not in page  # nothing from a CDN
    for asset in ("/static/app.js", "/static/app.css"):
        r = httpx.get(server.url + asset)
        assert r.status_code == 200 and len(r.content) > 500
        assert "https://" not in r.text
