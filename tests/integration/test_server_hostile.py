"""Hostile and careless clients against real servers on loopback.

One server with small limits (two requests in flight, a two-item model queue,
short header and body timeouts) takes the slow-client, many-face, identity and
malformed-input classes; a second one, with a small memory budget, takes a stream
of maximal-pixel images. Every answer is a typed JSON error or a success — never
a 5xx — and the process's peak RSS stays under its budget.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from hostile_inputs import (
    declared_huge_png,
    group_photo,
    multipart,
    nested_json,
    raw_request,
    status_of,
    truncated_jpeg_with_eoi,
    truncated_multipart,
)
from server_harness import ServerProcess, graceful, metric_values

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.imaging.decode import decode_image

HOSTILE = {
    "FACEFUSE_MAX_INFLIGHT": "2",
    "FACEFUSE_MAX_QUEUE_SIZE": "2",
    "FACEFUSE_HEADER_TIMEOUT_S": "3",
    "FACEFUSE_BODY_TIMEOUT_S": "15",
    "FACEFUSE_PRECISION": "fp32",  # comparable with the library's analyser fixture
    # A switch older servers had: near-duplicate reuse of analyses. It must not exist.
    "FACEFUSE_L1_PHASH": "true",
}
BUDGET_MB = 1000


@pytest.fixture(scope="module")
def server(
    settings: Settings, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("hostile"), HOSTILE,
                         name="hostile")
    with graceful(proc):
        yield proc


def error_code(r: httpx.Response) -> str:
    assert r.headers["content-type"].startswith("application/json"), r.text[:200]
    return str(r.json()["error"]["code"])


def post_head(path: str, length: int, ctype: str = "application/octet-stream") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


# --- slow clients ---------------------------------------------------------------------------


def test_trickled_headers_are_answered_408_and_closed(server: ServerProcess) -> None:
    head = post_head("/v1/faces", 10)
    answer = raw_request(server.port, head[:25], trickle=25, pause_s=0.01)
    assert status_of(answer) == 408, answer[:200]
    assert b'"request_timeout"' in answer


def test_trickling_uploads_hold_no_slot_and_time_out(
    server: ServerProcess, photos: dict[str, bytes]
) -> None:
    """More stalled uploads than in-flight slots: a normal client is still served, and
    every stalled upload ends with 408."""
    body = multipart({"image": ("a.jpg", photos["obama"])}, "b0undary")
    head = post_head("/v1/faces", len(body), "multipart/form-data; boundary=b0undary")
    stalled: list[bytes] = []

    def stall() -> None:
        # Headers and 100 bytes of body, then nothing.
        stalled.append(raw_request(server.port, head, body[:100], trickle=len(head) + 100))

    threads = [threading.Thread(target=stall) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # let the four uploads start (they now stall for body_timeout_s)
    with server.client() as c:
        r = c.post("/v1/faces", files={"image": ("o.jpg", photos["obama"])})
        assert r.status_code == 200, r.text
        assert len(r.json()["faces"]) == 1
    for t in threads:
        t.join(timeout=120)
    assert [status_of(a) for a in stalled] == [408] * 4, stalled


def test_disconnects_are_499_not_500(server: ServerProcess, photos: dict[str, bytes]) -> None:
    body = multipart({"image": ("a.jpg", photos["obama"])}, "b0undary")
    head = post_head("/v1/faces", len(body), "multipart/form-data; boundary=b0undary")
    # During the upload: half the body, then the socket closes.
    raw_request(server.port, head, body[: len(body) // 2], read_timeout_s=0.5)
    # While being computed: a whole request that takes seconds to decode and analyse
    # (39 megapixels), then gone at once.
    big = multipart({"image": ("big.png", declared_huge_png(39_000_000))}, "b0undary")
    head = post_head("/v1/faces", len(big), "multipart/form-data; boundary=b0undary")
    raw_request(server.port, head, big, read_timeout_s=0.1)
    with server.client() as c:
        end = time.monotonic() + 60
        while True:
            counts = metric_values(c.get("/metrics").text, "facefuse_http_requests_total")
            closed = sum(v for k, v in counts.items() if 'status="499"' in k)
            if closed >= 2:
                break
            assert time.monotonic() < end, (counts, server.log_tail())
            time.sleep(0.1)
        assert not [k for k in counts if 'status="5' in k], counts
        assert c.post("/v1/faces", files={"image": ("o.jpg", photos["obama"])}).status_code == 200
    log = server.log_tail(200_000)
    assert '"client_closed"' in log and "Traceback" not in log and "internal_error" not in log


# --- many faces, identity ----------------------------------------------------------------------


def test_a_photo_with_more_faces_than_the_queue_bound_is_served(
    server: ServerProcess, sample_images: dict[str, np.ndarray]
) -> None:
    faces = [sample_images[n] for n in ("obama", "biden", "obama2", "obama3")]
    photo = group_photo(faces, columns=3, rows=3)
    with server.client() as c:
        r = c.post("/v1/faces", files={"image": ("group.jpg", photo)})
        assert r.status_code == 200, r.text
        assert len(r.json()["faces"]) > int(HOSTILE["FACEFUSE_MAX_QUEUE_SIZE"])
        r = c.post("/v1/embed", files={"image": ("group.jpg", photo)})
        assert r.status_code == 200, r.text


def test_a_fused_near_duplicate_never_lends_its_identity(
    server: ServerProcess, photos: dict[str, bytes], analyser: FaceAnalyser
) -> None:
    """Person A's face fused into B's photo looks like B's photo to a perceptual hash;
    after someone embeds the fused photo, B's photo must still give B's identity."""
    with server.client() as c:
        fused = c.post("/v1/fuse", files={"source": ("a.jpg", photos["obama"]),
                                          "target": ("b.jpg", photos["biden"])},
                       data={"degree": "100", "format": "png", "similarity": "false"})
        assert fused.status_code == 200, fused.text
        r = c.post("/v1/embed", files={"image": ("f.png", fused.content)})
        fused_vec = np.array(r.json()["faces"][0]["embedding"])
        r = c.post("/v1/embed", files={"image": ("b.jpg", photos["biden"])})
        b_vec = np.array(r.json()["faces"][0]["embedding"])
        v = c.post("/v1/verify", files={"a": ("b.jpg", photos["biden"]),
                                        "b": ("f.png", fused.content)}).json()
    reference = analyser.analyse(decode_image(photos["biden"]), purpose="all")[0].embedding
    assert reference is not None
    np.testing.assert_allclose(b_vec, reference, atol=1e-3)
    assert float(fused_vec @ b_vec) < 0.99
    assert v["similarity"] < 0.99


# --- malformed inputs: 4xx with a stable code -----------------------------------------------


def _matrix(photos: dict[str, bytes]) -> list[tuple[str, str, str, bytes, int, str]]:
    b64 = base64.b64encode(photos["obama"]).decode()
    image = ("a.jpg", photos["obama"])
    return [
        ("nested json", "/v1/faces", "application/json", nested_json(), 400, "bad_request"),
        ("nested json, moderately", "/v1/faces", "application/json", nested_json(40), 400,
         "bad_request"),
        ("string for a number", "/v1/fuse", "application/json",
         json.dumps({"source": b64, "target": b64, "degree": "50"}).encode(), 422,
         "invalid_argument"),
        ("boolean for a number", "/v1/fuse", "application/json",
         json.dumps({"source": b64, "target": b64, "quality": True}).encode(), 422,
         "invalid_argument"),
        ("number for a boolean", "/v1/faces", "application/json",
         json.dumps({"image": b64, "landmarks": 1}).encode(), 422, "invalid_argument"),
        ("truncated JPEG with EOI", "/v1/faces", "multipart/form-data; boundary=xyz",
         multipart({"image": ("t.jpg", truncated_jpeg_with_eoi(photos["obama"]))}, "xyz"), 400,
         "corrupt_image"),
        ("truncated multipart", "/v1/faces", "multipart/form-data; boundary=xyz",
         truncated_multipart({"image": image}, "xyz"), 400, "bad_request"),
        ("multipart without boundary", "/v1/faces", "multipart/form-data",
         multipart({"image": image}), 400, "bad_request"),
        ("over-limit pixels declared", "/v1/faces", "multipart/form-data; boundary=xyz",
         multipart({"image": ("h.png", declared_huge_png(60_000_000))}, "xyz"), 413,
         "image_too_large"),
    ]


def test_hostile_input_matrix(server: ServerProcess, photos: dict[str, bytes]) -> None:
    failures = []
    with server.client() as c:
        for name, path, ctype, body, status, code in _matrix(photos):
            r = c.post(path, content=body, headers={"Content-Type": ctype})
            got = (r.status_code, error_code(r) if r.status_code >= 400 else "")
            if got != (status, code):
                failures.append((name, got, r.text[:160]))
        assert c.get("/readyz").status_code == 200
    assert not failures, failures


# --- the memory budget ---------------------------------------------------------------------


def test_maximal_pixel_stream_keeps_peak_rss_under_the_budget(
    settings: Settings, model_dir: Path, tmp_path: Path
) -> None:
    """Eight concurrent ~39-megapixel PNGs (about 100 KB each; ~370 MB each to
    decode): the budget serialises them; none is a 5xx other than 503, and the
    process's VmHWM never passes FACEFUSE_MEMORY_BUDGET_MB."""
    env = {"FACEFUSE_MEMORY_BUDGET_MB": str(BUDGET_MB), "FACEFUSE_MEMORY_WAIT_S": "60",
           "FACEFUSE_REQUEST_TIMEOUT_S": "120"}
    proc = ServerProcess(settings.home, tmp_path, env, name="budget").start()
    try:
        images = [declared_huge_png(39_000_000, seed=i) for i in range(8)]

        def one(image: bytes) -> httpx.Response:
            with proc.client(timeout=300) as c:
                return c.post("/v1/faces", files={"image": ("big.png", image)})

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(one, images))
        statuses = [r.status_code for r in answers]
        assert set(statuses) <= {200, 503}, [r.text[:200] for r in answers]
        assert 200 in statuses, statuses
        assert proc.peak_rss() < BUDGET_MB * 2**20, (proc.peak_rss() >> 20, statuses)
    finally:
        proc.stop()


def test_memory_goes_back_after_a_burst_of_large_images(
        server: ServerProcess, sample_images: dict[str, np.ndarray]) -> None:
    """Six 30 MP photos one after another: once the server is idle again its resident
    memory returns to within 48 MiB of where it was (the freed image buffers are
    given back, not kept by the C heap)."""
    import io
    import time

    from PIL import Image

    def rss() -> int:
        for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    base = Image.fromarray(sample_images["obama"])
    photos = []
    for i in range(6):
        buf = io.BytesIO()
        base.resize((5000 + 10 * i, 6000)).save(buf, "JPEG", quality=80)
        photos.append(buf.getvalue())
    time.sleep(2)  # whatever earlier tests left has been trimmed
    before = rss()
    with server.client() as c:
        for photo in photos:
            assert c.post("/v1/faces", files={"image": ("p.jpg", photo)}).status_code == 200
    end = time.monotonic() + 30
    while rss() > before + (48 << 20):
        assert time.monotonic() < end, (before >> 20, rss() >> 20)
        time.sleep(0.25)
