"""The web playground in a real headless Chromium (Debian ``chromium`` driven by
selenium through Debian's ``chromium-driver``) against a real server with API keys on.

First load: no image element renders broken (no alt text where a picture should be),
no live-looking Download, the favicon resolves. Then: uploads the sample photos, types
the key, picks a face (numbered from 0, as the API counts) with the keyboard, moves the
degree slider, fuses, and checks the result's pixels differ from the target inside the
chosen face only; the before/after divider shows the target on one side and the result
on the other; 1:1 zoom shows the image at its own pixels, scrolled to the face.
Screenshots go to the test's tmp dir; with ``FACEFUSE_DOCS_SCREENSHOT=1`` one is also
written to docs/playground.jpg.
"""

from __future__ import annotations

import base64
import contextlib
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


@contextlib.contextmanager
def headless_chromium(profile: Path, *flags: str) -> Iterator[Any]:
    """A headless Chromium under Selenium with a fresh profile in ``profile`` and
    ``flags`` beside the ones every test here needs; quit on the way out, even on
    failure."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or "chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage", *flags,
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER or "chromedriver"), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with headless_chromium(tmp_path / "chrome-profile", "--disable-quic",
                           "--window-size=1280,1100") as driver:
        yield driver


def wait_for(check: Callable[[], Any], timeout: float = 120.0, what: str = "") -> Any:
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


#: Images that take up room on the page but have no picture to show (what a browser
#: draws as a broken-image icon with the alt text).
BROKEN_IMAGES = """
return [...document.images]
  .filter(i => i.getClientRects().length > 0 && (!i.complete || i.naturalWidth === 0))
  .map(i => i.id || i.alt);
"""

FETCH_STATUS = """
const done = arguments[arguments.length - 1];
fetch(arguments[0]).then(r => done([r.status, r.headers.get("content-type")]));
"""

FETCH_BLOB = """
const done = arguments[arguments.length - 1];
fetch(arguments[0]).then(r => r.blob()).then(b => {
  const reader = new FileReader();
  reader.onload = () => done(reader.result);
  reader.readAsDataURL(b);
});
"""


def png_pixels(png: bytes) -> np.ndarray:
    return decode_image(png)[:, :, :3].astype(np.int16)


def test_first_load_shows_nothing_broken(browser: Any, server: ServerProcess,
                                         tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    wait_for(lambda: browser.execute_script("return document.readyState") == "complete",
             30, "the page")
    shot = tmp_path / "first-load.png"
    browser.save_screenshot(str(shot))
    assert browser.execute_script(BROKEN_IMAGES) == []
    for hidden in ("source-preview", "stage", "outcome", "download", "result", "before"):
        assert not browser.find_element(By.ID, hidden).is_displayed(), hidden
    assert browser.find_element(By.ID, "status").is_displayed()
    # what the screenshot shows: white panels and text, no image-sized grey placeholder
    pixels = png_pixels(shot.read_bytes())
    assert pixels.shape[0] > 500 and pixels.std() > 5
    icon = browser.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href")
    status, ctype = browser.execute_async_script(FETCH_STATUS, icon)
    assert status == 200 and ctype.startswith("image/svg+xml")


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

    # faces numbered from 0, largest first: the API's target_face_index
    tags = [b.text for b in browser.find_elements(By.CSS_SELECTOR, ".face span")]
    assert tags == [str(i) for i in range(len(boxes))]
    assert browser.find_element(By.ID, "face-0").get_attribute("aria-label").endswith(
        "face 0 (largest)")
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
    assert "compositeSynthetic" in facts and "fuse (ms)" in facts and "detect (ms)" in facts
    assert f"face\n{chosen}" in facts
    similarity = float(browser.find_element(By.ID, "similarity").text)
    assert 0.3 < similarity <= 1.0
    assert "ms on the server" in browser.find_element(By.ID, "total").text
    link = browser.find_element(By.ID, "download")
    assert link.is_displayed() and link.get_attribute("download") == "facefuse.png"
    assert browser.execute_script(BROKEN_IMAGES) == []

    # before/after: the divider at the far right shows only the target, at the far left
    # only the result; the two views differ where the chosen face is, nowhere else
    view = browser.find_element(By.ID, "viewport")
    compare = browser.find_element(By.ID, "compare")
    browser.execute_script("arguments[0].scrollIntoView({block: 'end'})", view)
    compare.send_keys(Keys.END)
    assert compare.get_attribute("value") == "100"
    before_view = png_pixels(view.screenshot_as_png)
    compare.send_keys(Keys.HOME)
    after_view = png_pixels(view.screenshot_as_png)
    assert before_view.shape == after_view.shape
    assert abs(before_view.shape[0] / before_view.shape[1]
               - group.shape[0] / group.shape[1]) < 0.01  # the whole image, not a cut
    shown = np.any(before_view != after_view, axis=2)
    shown[:, :6] = shown[:, -6:] = False  # the divider line (and its shadow) at either edge
    k = shown.shape[1] / group.shape[1]
    inside = np.zeros_like(shown)
    inside[int((y0 - h // 2) * k):int((y1 + h // 2) * k),
           max(0, int((x0 - w // 2) * k)):int((x1 + w // 2) * k)] = True
    assert shown[inside].mean() > 0.02
    assert not shown[~inside].any()
    compare.send_keys(*([Keys.ARROW_RIGHT] * 50))  # back to the middle
    browser.save_screenshot(str(tmp_path / "playground-desktop.png"))

    # 1:1 on the face: one image pixel per CSS pixel here (device pixel ratio 1), the
    # face in view
    zoom = browser.find_element(By.ID, "zoom")
    zoom.send_keys(Keys.ENTER)
    assert zoom.get_attribute("aria-pressed") == "true"
    shown_width = browser.execute_script(
        "return document.getElementById('result').getBoundingClientRect().width")
    assert abs(shown_width - group.shape[1]) < 1
    left, top, vw, vh = browser.execute_script(
        "const v = document.getElementById('viewport');"
        "return [v.scrollLeft, v.scrollTop, v.clientWidth, v.clientHeight];")
    assert left <= (x0 + x1) / 2 <= left + vw and top <= (y0 + y1) / 2 <= top + vh
    assert left > 0  # the middle face of a wide group: scrolled sideways to it
    browser.save_screenshot(str(tmp_path / "playground-zoom.png"))
    zoom.send_keys(Keys.ENTER)
    assert zoom.get_attribute("aria-pressed") == "false"
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
    for asset, size in (("/static/app.js", 500), ("/static/app.css", 500),
                        ("/static/favicon.svg", 200)):
        r = httpx.get(server.url + asset)
        assert r.status_code == 200 and len(r.content) > size
        assert "https://" not in r.text
