"""The HTTP API against one real server (uvicorn on loopback) with API keys on.

Covers the routes and their headers, the L2 result cache (same request twice →
identical body from the cache), micro-batching under 8 concurrent clients (read from
/metrics), hostile and malformed inputs (4xx JSON with stable codes, never a 500),
and authentication (401 with WWW-Authenticate, 403 for admin routes).
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image
from server_harness import (
    ADMIN_TOKEN,
    USER_TOKEN,
    ServerProcess,
    batch_stats,
    graceful,
    metric_values,
    photo_variants,
)

from facefuse.config import Settings

BODY_LIMIT = 3_000_000


@pytest.fixture(scope="module")
def server(
    settings: Settings, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("api"), {
        "FACEFUSE_API_KEYS": f"tests:{USER_TOKEN}",
        "FACEFUSE_ADMIN_KEYS": f"ops:{ADMIN_TOKEN}",
        "FACEFUSE_MAX_BODY_BYTES": str(BODY_LIMIT),
        # A longer wait for company than the default, so 8 clients surely share batches.
        "FACEFUSE_MAX_QUEUE_DELAY_MS": "20",
        # A GPU-first provider list on a CPU host: every model falls back, batches run
        # through IO binding, and the API must answer exactly as on the defaults.
        "FACEFUSE_PROVIDERS": "tensorrt,cuda,cpu",
        "FACEFUSE_IO_BINDING": "on",
    }, name="api")
    with graceful(proc):
        yield proc
        # After every test of this module, whatever ran and in whichever order: bad
        # input of all kinds was sent, and none of it was answered with a 500.
        with proc.client(USER_TOKEN) as c:
            statuses = metric_values(c.get("/metrics").text, "facefuse_http_requests_total")
        assert statuses and not [k for k in statuses if 'status="500"' in k], statuses


def error_of(r: httpx.Response) -> str:
    assert r.headers["content-type"].startswith("application/json"), r.text[:200]
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return str(body["error"]["code"])


# --- fuse and the L2 cache ----------------------------------------------------------------


def test_fuse_returns_an_image_and_the_second_identical_request_is_a_cache_hit(
    client: httpx.Client, photos: dict[str, bytes]
) -> None:
    files = {"source": ("s.jpg", photos["obama"], "image/jpeg"),
             "target": ("t.jpg", photos["biden"], "image/jpeg")}
    asked = {"degree": "80", "format": "png", "similarity": "true"}
    first = client.post("/v1/fuse", files=files, data=asked)
    assert first.status_code == 200, first.text
    assert first.headers["content-type"] == "image/png"
    assert first.headers["x-facefuse-cache"] == "miss"
    assert first.headers["x-request-id"]
    stages = {item.split(";")[0].strip() for item in first.headers["server-timing"].split(",")}
    assert {"decode", "detect", "mesh", "embed", "fuse", "encode"} <= stages
    similarity = float(first.headers["x-facefuse-identity-similarity"])
    assert 0.5 < similarity <= 1.0
    out = Image.open(io.BytesIO(first.content))
    assert out.format == "PNG"
    assert out.size == Image.open(io.BytesIO(photos["biden"])).size
    assert not out.info.get("exif")

    second = client.post("/v1/fuse", files=files, data=asked)
    assert second.status_code == 200
    assert second.headers["x-facefuse-cache"] == "hit"
    assert second.content == first.content
    assert second.headers["x-facefuse-identity-similarity"] == \
        first.headers["x-facefuse-identity-similarity"]

    # Another option is another result.
    third = client.post("/v1/fuse", files=files, data={**asked, "degree": "40"})
    assert third.headers["x-facefuse-cache"] == "miss"
    assert third.content != first.content


@pytest.mark.parametrize(
    "option", ["relight", "reject_source_occluders", "keep_target_occluders", "symmetric_fill"])
def test_each_fusion_option_reaches_the_engine(
    client: httpx.Client, photos: dict[str, bytes], option: str
) -> None:
    target = photos["obama"]
    if option == "keep_target_occluders":  # something over the target's mouth to keep
        im = Image.open(io.BytesIO(target)).convert("RGB")
        im.paste((40, 160, 60), (380, 335, 600, 385))
        buf = io.BytesIO()
        im.save(buf, "PNG")
        target = buf.getvalue()
    files = {"source": ("s.jpg", photos["biden"]), "target": ("t.png", target)}

    def pixels(fields: dict[str, str]) -> np.ndarray:
        r = client.post("/v1/fuse", files=files, data={"degree": "100", "format": "png",
                                                       **fields})
        assert r.status_code == 200, r.text[:300]
        return np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"), np.int16)

    default, off = pixels({}), pixels({option: "false"})
    assert np.abs(default - off).max() > 10, option
    r = client.post("/v1/fuse", files=files, data={option: "sometimes"})
    assert r.status_code == 422 and error_of(r) == "invalid_argument", r.text[:300]


def test_fuse_accepts_json_with_base64_and_echoes_the_request_id(
    client: httpx.Client, photos: dict[str, bytes]
) -> None:
    body = {"source": base64.b64encode(photos["obama2"]).decode(),
            "target": "data:image/jpeg;base64," + base64.b64encode(photos["biden"]).decode(),
            "degree": 60, "format": "webp", "quality": 80}
    r = client.post("/v1/fuse", json=body, headers={"X-Request-ID": "req-42"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/webp"
    assert r.headers["x-request-id"] == "req-42"
    assert Image.open(io.BytesIO(r.content)).format == "WEBP"
    # similarity is opt-in: a plain fusion runs no recogniser at all
    assert "x-facefuse-identity-similarity" not in r.headers
    stages = {item.split(";")[0].strip() for item in r.headers["server-timing"].split(",")}
    assert {"decode", "mesh", "fuse"} <= stages and not {"embed", "evaluate"} & stages


def test_concurrent_identical_requests_are_computed_once(
    server: ServerProcess, sample_images: dict[str, np.ndarray]
) -> None:
    source, target = photo_variants(sample_images, 2, seed=5)
    files = {"source": ("s.jpg", source), "target": ("t.jpg", target)}

    def one(_: int) -> httpx.Response:
        with server.client(USER_TOKEN) as c:
            return c.post("/v1/fuse", files=files, data={"degree": "65"})

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(one, range(6)))
    assert [r.status_code for r in answers] == [200] * 6
    assert sorted(r.headers["x-facefuse-cache"] for r in answers) == ["hit"] * 5 + ["miss"]
    assert len({r.content for r in answers}) == 1


def test_output_carries_no_metadata(client: httpx.Client, photos: dict[str, bytes]) -> None:
    target = Image.open(io.BytesIO(photos["biden"]))
    exif = Image.Exif()
    exif[0x010F] = "facefuse-test-camera"  # Make
    exif[0x8298] = "someone's copyright"  # Copyright
    buf = io.BytesIO()
    target.save(buf, "JPEG", exif=exif.tobytes(), quality=90)
    assert b"facefuse-test-camera" in buf.getvalue()
    r = client.post("/v1/fuse", files={"source": ("s.jpg", photos["obama"]),
                                       "target": ("t.jpg", buf.getvalue())},
                    data={"format": "jpeg"})
    assert r.status_code == 200, r.text
    assert b"Exif" not in r.content and b"facefuse-test-camera" not in r.content
    assert not Image.open(io.BytesIO(r.content)).getexif()


# --- analysis routes ----------------------------------------------------------------------


def test_faces_embed_and_verify(client: httpx.Client, photos: dict[str, bytes]) -> None:
    r = client.post("/v1/faces", files={"image": ("a.jpg", photos["obama"])},
                    data={"landmarks": "true"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["width"], body["height"]) == Image.open(io.BytesIO(photos["obama"])).size
    assert len(body["faces"]) == 1
    face = body["faces"][0]
    assert len(face["bbox"]) == 4 and len(face["landmarks"]) == 478
    assert len(face["landmarks5"]) == 5

    r = client.post("/v1/embed", files={"image": ("a.jpg", photos["obama"])})
    assert r.status_code == 200
    emb = np.asarray(r.json()["faces"][0]["embedding"])
    assert emb.shape == (128,) and abs(float(np.linalg.norm(emb)) - 1.0) < 1e-3

    same = client.post("/v1/verify", files={"a": ("a.jpg", photos["obama"]),
                                            "b": ("b.jpg", photos["obama2"])}).json()
    other = client.post("/v1/verify", files={"a": ("a.jpg", photos["obama"]),
                                             "b": ("b.jpg", photos["biden"])}).json()
    assert same["same_person"] is True and other["same_person"] is False
    assert same["distance"] < same["threshold"] < other["distance"]
    assert same["similarity"] > other["similarity"]


def test_models_lists_versions_and_providers(client: httpx.Client) -> None:
    models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    assert {"facemesh", "dlib_resnet"} <= set(models)
    for m in models.values():
        assert len(m["sha256"]) == 64 and m["sha256"].startswith(m["version"])
        if not m["loaded"]:  # the recogniser, until the first embedding
            assert m["name"] == "dlib_resnet" and m["provider"] == "" and not m["fallbacks"]
            continue
        assert m["provider"] == "CPUExecutionProvider"
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            assert any("CUDAExecutionProvider" in r for r in m["fallbacks"]), m


# --- batching -----------------------------------------------------------------------------


def test_eight_concurrent_clients_share_recognizer_batches(
    server: ServerProcess, sample_images: dict[str, np.ndarray]
) -> None:
    inputs = photo_variants(sample_images, 32, seed=1)
    before = batch_stats(server.client().get("/metrics").text, "dlib_resnet")

    def client_loop(k: int) -> list[int]:
        with server.client(USER_TOKEN) as c:
            return [c.post("/v1/embed", files={"image": ("v.jpg", data)}).status_code
                    for data in inputs[k::8]]

    with ThreadPoolExecutor(8) as pool:
        statuses = [s for chunk in pool.map(client_loop, range(8)) for s in chunk]
    assert statuses == [200] * len(inputs)
    after = batch_stats(server.client().get("/metrics").text, "dlib_resnet")
    items, batches = after[0] - before[0], after[1] - before[1]
    assert items == len(inputs)  # one face each, every one computed (distinct pixels)
    assert items / batches > 1.0, f"{items} chips in {batches} batches"


# --- hostile and malformed input ----------------------------------------------------------


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares ``width``×``height`` with a tiny, highly compressed IDAT."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * (1 << 20), 9)  # 1 MiB of zeros in ~1 KB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


def _jpeg_claiming(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (120, 90, 60)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _no_face_jpeg() -> bytes:
    y, x = np.mgrid[0:320, 0:480]
    rgb = np.stack([x * 255 // 480, y * 255 // 320, np.full_like(x, 128)], -1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG")
    return buf.getvalue()


@pytest.mark.parametrize(
    ("case", "status", "code"),
    [
        ("zero_bytes", 400, "empty_image"),
        ("truncated_jpeg", 400, "corrupt_image"),
        ("png_bomb", 413, "image_too_large"),
        ("text_named_jpg", 415, "unsupported_format"),
        ("header_50000x50000", 413, "image_too_large"),
        ("no_face", 422, "source_no_face"),
        ("missing_field", 422, "invalid_argument"),
        ("image_as_text_field", 422, "invalid_argument"),
        ("degree_1000", 422, "invalid_argument"),
        ("degree_not_a_number", 422, "invalid_argument"),
        ("quality_float", 422, "invalid_argument"),
        ("unknown_option", 422, "invalid_argument"),
        ("bad_format", 422, "invalid_argument"),
        ("json_wrong_type", 422, "invalid_argument"),
        ("json_bad_base64", 422, "invalid_argument"),
        ("json_malformed", 400, "bad_request"),
        ("json_not_object", 422, "invalid_argument"),
        ("form_urlencoded", 415, "unsupported_media_type"),
        ("target_index_out_of_range", 422, "face_index_out_of_range"),
        ("reference_mode_without_reference", 422, "reference_required"),
        ("reference_outside_reference_mode", 422, "options_conflict"),
        ("reference_with_a_mapping", 422, "options_conflict"),
        ("many_mode_with_a_face_index", 422, "options_conflict"),
        ("body_over_limit", 413, "body_too_large"),
        ("chunked_body_over_limit", 413, "body_too_large"),
    ],
)
def test_bad_input_gets_a_4xx_json_error_with_a_stable_code(
    client: httpx.Client, photos: dict[str, bytes], case: str, status: int, code: str
) -> None:
    good = photos["biden"]
    source: bytes | None = photos["obama"]
    data: dict[str, str] = {}
    kwargs: dict[str, Any] = {}
    if case == "zero_bytes":
        source = b""
    elif case == "truncated_jpeg":
        source = photos["obama"][: len(photos["obama"]) // 2]
    elif case == "png_bomb":
        source = _png_header_only(20_000, 20_000)
    elif case == "text_named_jpg":
        source = b"this is not an image, just text pretending to be one\n" * 10
    elif case == "header_50000x50000":
        source = _jpeg_claiming(50_000, 50_000)
    elif case == "no_face":
        source = _no_face_jpeg()
    elif case == "missing_field":
        source = None
    elif case == "image_as_text_field":
        source = None
        data["source"] = "hello"
    elif case == "degree_1000":
        data["degree"] = "1000"
    elif case == "degree_not_a_number":
        data["degree"] = "lots"
    elif case == "quality_float":
        data["quality"] = "85.5"
    elif case == "unknown_option":
        data["degre"] = "50"
    elif case == "bad_format":
        data["format"] = "gif"
    elif case == "target_index_out_of_range":
        data["target_face_index"] = "7"
    elif case == "reference_mode_without_reference":
        data["mode"] = "reference"
    elif case == "reference_outside_reference_mode":
        data["mode"] = "many"
    elif case == "reference_with_a_mapping":
        data.update(mode="reference", mapping=json.dumps([{"source": 0, "target": 0}]))
    elif case == "many_mode_with_a_face_index":
        data.update(mode="many", target_face_index="0")
    elif case.startswith("json_") or case == "form_urlencoded":
        b64 = base64.b64encode(photos["obama"]).decode()
        content = {
            "json_wrong_type": b'{"source": 12, "target": "%s"}' % b64.encode(),
            "json_bad_base64": b'{"source": "***", "target": "%s"}' % b64.encode(),
            "json_malformed": b'{"source": ',
            "json_not_object": b"[1, 2, 3]",
            "form_urlencoded": b"source=abc&target=def",
        }[case]
        ctype = ("application/x-www-form-urlencoded" if case == "form_urlencoded"
                 else "application/json")
        r = client.post("/v1/fuse", content=content, headers={"content-type": ctype})
        assert (r.status_code, error_of(r)) == (status, code), r.text
        return
    elif case == "body_over_limit":
        source = b"\xff\xd8\xff" + b"\x00" * (BODY_LIMIT + 10)
    elif case == "chunked_body_over_limit":
        def chunks() -> Iterator[bytes]:  # a valid multipart start, then too many bytes
            yield (b'--zzz\r\nContent-Disposition: form-data; name="source"; '
                   b'filename="s.jpg"\r\nContent-Type: image/jpeg\r\n\r\n')
            for _ in range(BODY_LIMIT // 65536 + 2):
                yield b"x" * 65536
        r = client.post("/v1/fuse", content=chunks(),
                        headers={"content-type": "multipart/form-data; boundary=zzz"})
        assert (r.status_code, error_of(r)) == (status, code), r.text
        return
    files = {"target": ("t.jpg", good, "image/jpeg")}
    if source is not None:
        files["source"] = ("s.jpg", source, "image/jpeg")
    if case.startswith("reference_") and case != "reference_mode_without_reference":
        files["reference"] = ("r.jpg", good, "image/jpeg")
    kwargs["files"] = files
    r = client.post("/v1/fuse", data=data, **kwargs)
    assert (r.status_code, error_of(r)) == (status, code), r.text


def test_parts_are_bounded_and_json_fields_are_never_coerced(
    client: httpx.Client, photos: dict[str, bytes]
) -> None:
    from facefuse.serving.http.inputs import MAX_PARTS

    files = {"source": ("s.jpg", photos["obama"]), "target": ("t.jpg", photos["biden"])}
    extra = {f"x{i}": "1" for i in range(MAX_PARTS - 1)}  # 33 parts with the two images
    r = client.post("/v1/fuse", files=files, data=extra)
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", r.text
    assert str(MAX_PARTS) in r.json()["error"]["message"]
    # In JSON a mapping is a list; the JSON-string form exists for multipart only.
    body = {"source": base64.b64encode(photos["obama"]).decode(),
            "target": base64.b64encode(photos["biden"]).decode(),
            "mapping": '[{"source": 0, "target": 0}]'}
    r = client.post("/v1/fuse", json=body)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_argument", r.text
    assert "mapping" in r.json()["error"]["message"]
    r = client.post("/v1/fuse", json={**body, "mapping": [{"source": 0, "target": 0}]})
    assert r.status_code == 200, r.text


def test_faces_of_a_photo_without_a_face_is_an_empty_list(client: httpx.Client) -> None:
    r = client.post("/v1/faces", files={"image": ("n.jpg", _no_face_jpeg())})
    assert r.status_code == 200 and r.json()["faces"] == []


def test_unknown_route_and_method_are_json_errors(client: httpx.Client) -> None:
    r = client.get("/v1/nothing-here")
    assert (r.status_code, error_of(r)) == (404, "not_found")
    r = client.get("/v1/fuse")
    assert (r.status_code, error_of(r)) == (405, "method_not_allowed")


# --- authentication -----------------------------------------------------------------------


def test_api_keys_are_required_and_admin_routes_need_the_admin_key(
    server: ServerProcess, photos: dict[str, bytes]
) -> None:
    image = {"image": ("a.jpg", photos["obama"])}
    with server.client() as anon, server.client("not-a-valid-token-at-all") as wrong, \
            server.client(USER_TOKEN) as user, server.client(ADMIN_TOKEN) as admin:
        for c in (anon, wrong):
            r = c.post("/v1/faces", files=image)
            assert (r.status_code, error_of(r)) == (401, "unauthorized")
            assert r.headers["www-authenticate"].startswith("Bearer")
        assert user.post("/v1/faces", files=image).status_code == 200
        assert admin.post("/v1/faces", files=image).status_code == 200
        for method, path in (("DELETE", "/v1/cache"), ("POST", "/v1/models/reload")):
            for c, expected in ((anon, 401), (user, 403)):
                r = c.request(method, path)
                assert r.status_code == expected, (method, path, r.text)
                error_of(r)
        r = admin.post("/v1/models/reload")
        assert r.status_code == 200 and r.json()["changed"] == []
        r = admin.delete("/v1/cache")
        assert r.status_code == 200 and r.json()["purged"]["l2"] >= 1
        # Probes and metrics need no key.
        for path in ("/healthz", "/readyz", "/metrics"):
            assert anon.get(path).status_code == 200


# --- health and metrics ------------------------------------------------------------------


def test_server_is_healthy_and_counted(client: httpx.Client,
                                       photos: dict[str, bytes]) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert ready.json()["checks"]["l2"] == "memory"  # no Redis configured
    r = client.post("/v1/faces", files={"image": ("a.jpg", photos["obama3"])})
    assert r.status_code == 200 and len(r.json()["faces"]) >= 1
    # this test's own 422 and L2 hit, so it counts them whatever ran before it
    assert client.post("/v1/fuse", files={"source": ("s.jpg", photos["obama"]),
                                          "target": ("t.jpg", photos["biden"])},
                       data={"degree": "1000"}).status_code == 422
    files = {"source": ("s.jpg", photos["obama3"]), "target": ("t.jpg", photos["obama2"])}
    for _ in range(2):
        assert client.post("/v1/fuse", files=files, data={"degree": "35"}).status_code == 200
    text = client.get("/metrics").text
    statuses = metric_values(text, "facefuse_http_requests_total")
    assert statuses, text[:500]
    assert any('status="422"' in k for k in statuses)
    hits = metric_values(text, "facefuse_cache_requests_total")
    assert hits['{level="l2",result="hit"}'] >= 1
    assert metric_values(text, "facefuse_process_peak_resident_memory_bytes")[""] > 0
    assert "server" not in {k.lower() for k in r.headers}
    # CORS is off unless origins are configured.
    r = client.get("/v1/models", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers
