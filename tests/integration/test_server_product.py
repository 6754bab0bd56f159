"""The product routes against a real server (uvicorn on loopback, API keys on):
capabilities, face mapping on /v1/fuse, templates (file store; analysis stored once),
provenance in the served bytes (read by exiftool), typed 4xx for bad inputs."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest
from PIL import Image
from server_harness import (
    ADMIN_TOKEN,
    GRACEFUL_EXIT,
    USER_TOKEN,
    ServerProcess,
    batch_stats,
    graceful,
    photo_variants,
)

from facefuse.config import Settings
from facefuse.imaging.encode import encode_image
from facefuse.imaging.provenance import COMPOSITE_SYNTHETIC

if TYPE_CHECKING:
    from tests.integration.conftest import RedisServer


@pytest.fixture(scope="module")
def server(settings: Settings, model_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("product"), {
        "FACEFUSE_API_KEYS": f"tests:{USER_TOKEN}",
        "FACEFUSE_ADMIN_KEYS": f"ops:{ADMIN_TOKEN}",
        "FACEFUSE_TEMPLATES_DIR": str(tmp_path_factory.mktemp("templates")),
        "FACEFUSE_TEMPLATES_MAX_COUNT": "3",
    }, name="product")
    with graceful(proc):
        yield proc


@pytest.fixture(scope="module")
def admin(server: ServerProcess) -> Iterator[httpx.Client]:
    with server.client(ADMIN_TOKEN) as c:
        yield c


@pytest.fixture(scope="module")
def group_png(make_group: Callable[..., np.ndarray]) -> bytes:
    return encode_image(make_group(["biden", "obama2", "obama3"]), "png")


def _decode(body: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(body)).convert("RGB"))


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    code: str = r.json()["error"]["code"]
    return code


def test_capabilities(client: httpx.Client) -> None:
    caps = client.get("/v1/capabilities").json()
    assert caps["mapping"]["max_entries"] == 6
    assert caps["mapping"]["source_fields"][:2] == ["source", "source_1"]
    assert caps["options"]["degree"] == {"type": "number", "minimum": 0, "maximum": 100,
                                         "default": 100.0}
    assert caps["options"]["shape"]["maximum"] == 100
    assert set(caps["options"]["blend"]["enum"]) == {"multiband", "poisson", "alpha"}
    assert caps["limits"]["min_side"] >= 1 and caps["limits"]["min_face_eye_distance_px"] > 0
    assert {m["name"] for m in caps["models"]} >= {"blazeface_full", "dlib_resnet"}
    assert caps["provenance"]["xmp"] is True
    assert caps["provenance"]["digital_source_type"] == COMPOSITE_SYNTHETIC
    assert caps["provenance"]["label"]["enabled"] is False
    assert caps["templates"] == {"backend": "file", "max_count": 3,
                                 "max_bytes": Settings().templates_max_bytes}
    assert httpx.get(client.base_url.join("/v1/capabilities")).status_code == 401


def _faces(client: httpx.Client, image: bytes) -> list[dict[str, object]]:
    r = client.post("/v1/faces", files={"image": ("g.png", image, "image/png")})
    faces: list[dict[str, object]] = r.json()["faces"]
    return faces


def test_mapping_fuses_each_named_face_and_nothing_else(
        client: httpx.Client, sample_paths: dict[str, Path], group_png: bytes,
        tmp_path: Path) -> None:
    boxes = [f["bbox"] for f in _faces(client, group_png)]
    order = sorted(range(len(boxes)), key=lambda i: boxes[i][0])  # type: ignore[index]
    left, middle, right = order
    rect = boxes[right]
    mapping = [{"source": 0, "target": left}, {"source": 1, "target": rect}]
    r = client.post("/v1/fuse", files={
        "source": ("a.png", sample_paths["astronaut"].read_bytes(), "image/png"),
        "source_1": ("b.jpg", sample_paths["obama"].read_bytes(), "image/jpeg"),
        "target": ("g.png", group_png, "image/png")},
        data={"mapping": json.dumps(mapping), "format": "png"})
    assert r.status_code == 200, r.text
    out, group = _decode(r.content), _decode(group_png)
    changed = np.any(out != group, axis=2)
    for i in (left, right):
        x0, y0, x1, y1 = (int(v) for v in boxes[i])  # type: ignore[attr-defined]
        assert changed[y0:y1, x0:x1].mean() > 0.05
    x0, y0, x1, y1 = (int(v) for v in boxes[middle])  # type: ignore[attr-defined]
    assert not changed[y0:y1, x0:x1].any()
    if shutil.which("exiftool"):
        path = tmp_path / "out.png"
        path.write_bytes(r.content)
        tags = json.loads(subprocess.run(["exiftool", "-j", "-G1", str(path)],
                                         capture_output=True, text=True, check=True).stdout)[0]
        assert tags["XMP-iptcExt:DigitalSourceType"] == COMPOSITE_SYNTHETIC
    # the same mapping as a JSON body (base64 images) gives the same image
    import base64

    b64 = {k: base64.b64encode(v).decode() for k, v in (
        ("source", sample_paths["astronaut"].read_bytes()),
        ("source_1", sample_paths["obama"].read_bytes()), ("target", group_png))}
    r2 = client.post("/v1/fuse", json={**b64, "mapping": mapping, "format": "png"})
    assert r2.status_code == 200 and r2.content == r.content


@pytest.mark.parametrize(("mapping", "code"), [
    ([{"source": 0, "target": 0}, {"source": 0, "target": 0}], "mapping_duplicate_target"),
    ([{"source": 1, "target": 0}], "mapping_source_out_of_range"),
    ([{"source": 0, "target": 9}], "mapping_target_out_of_range"),
    ([{"source": 0, "target": [0, 0, 20, 20]}], "mapping_rect_no_face"),
    ([{"source": 0, "target": i} for i in range(7)], "mapping_too_many"),
    ([{"source": 0, "target": "x"}], "mapping_invalid"),
    ("not json", "invalid_argument"),
])
def test_bad_mappings_are_typed_422(client: httpx.Client, sample_paths: dict[str, Path],
                                    group_png: bytes, mapping: Any, code: str) -> None:
    r = client.post("/v1/fuse", files={
        "source": ("a.png", sample_paths["astronaut"].read_bytes(), "image/png"),
        "target": ("g.png", group_png, "image/png")},
        data={"mapping": mapping if isinstance(mapping, str) else json.dumps(mapping)})
    assert _error(r, 422) == code


def test_source_fields_are_numbered_without_gaps(client: httpx.Client, sample_paths) -> None:  # type: ignore[no-untyped-def]
    img = sample_paths["obama"].read_bytes()
    r = client.post("/v1/fuse", files={"source": ("a.jpg", img), "source_2": ("b.jpg", img),
                                       "target": ("t.jpg", img)})
    assert _error(r, 422) == "invalid_argument"


def test_template_lifecycle(client: httpx.Client, admin: httpx.Client, server: ServerProcess,
                            sample_paths: dict[str, Path],
                            sample_images: dict[str, np.ndarray]) -> None:
    data = sample_paths["biden"].read_bytes()
    files = {"image": ("t.jpg", data, "image/jpeg")}
    meta = {"name": "poster", "metadata": json.dumps({"campaign": "spring"})}
    assert _error(client.post("/v1/templates", files=files, data=meta), 403) == "forbidden"
    r = admin.post("/v1/templates", files=files, data=meta)
    assert r.status_code == 201, r.text
    tpl = r.json()
    tid = tpl["id"]
    assert len(tid) == 32 and tpl["name"] == "poster" and tpl["metadata"] == {"campaign": "spring"}
    assert tpl["faces"][0]["index"] == 0 and len(tpl["faces"][0]["bbox"]) == 4
    again = admin.post("/v1/templates", files=files, data=meta)
    assert again.status_code == 200 and again.json()["id"] == tid  # content-addressed
    listing = client.get("/v1/templates").json()
    assert [t["id"] for t in listing["templates"]] == [tid] and listing["max_count"] == 3
    assert client.get(f"/v1/templates/{tid}").json()["faces"] == tpl["faces"]

    # fuse by id: with the source already analysed (L1), nothing is detected at all —
    # the template's faces come from the store; a plain fuse must analyse its target
    src_variant, other_variant = photo_variants(sample_images, 2, seed=7)

    def detector_items() -> float:
        text = client.get("/metrics").text
        return sum(batch_stats(text, m)[0] for m in ("blazeface_full", "yunet"))

    # /v1/verify analyses the largest face, with the detector a fusion source runs
    assert client.post("/v1/verify", files={"a": ("a.jpg", src_variant),
                                             "b": ("b.jpg", other_variant)}).status_code == 200
    before = detector_items()
    r = client.post(f"/v1/templates/{tid}/fuse", files={
        "source": ("s.jpg", src_variant, "image/jpeg")}, data={"format": "png", "degree": "80"})
    assert r.status_code == 200, r.text
    assert detector_items() == before
    timing = r.headers["server-timing"]
    assert "template;dur=" in timing and "detect;" not in timing
    # byte-identical to a plain fuse of the same target whose faces are found as a
    # template's are (every face, indexed: a face index selects that detector)
    plain = client.post("/v1/fuse", files={
        "source": ("s.jpg", src_variant, "image/jpeg"),
        "target": ("t.jpg", data, "image/jpeg")},
        data={"format": "png", "degree": "80", "target_face_index": "0"})
    assert plain.status_code == 200 and plain.headers["x-facefuse-cache"] == "miss"
    assert np.array_equal(_decode(plain.content), _decode(r.content))
    before = detector_items()
    flipped = encode_image(np.ascontiguousarray(sample_images["biden"][:, ::-1]), "png")
    r = client.post("/v1/fuse", files={"source": ("s.jpg", other_variant, "image/jpeg"),
                                       "target": ("t.png", flipped, "image/png")})
    assert r.status_code == 200
    assert detector_items() > before
    assert "detect;" in r.headers["server-timing"]

    # typed errors
    assert _error(client.get("/v1/templates/" + "0" * 32), 404) == "template_not_found"
    assert _error(client.post("/v1/templates/nope/fuse", files={
        "source": ("s.jpg", data)}), 404) == "template_not_found"
    assert _error(client.post(f"/v1/templates/{tid}/fuse", data={"degree": "5"}),
                  415) == "unsupported_media_type"
    assert _error(client.post(f"/v1/templates/{tid}/fuse", files={"source": ("s.jpg", data)},
                              data={"degree": "500"}), 422) == "invalid_argument"
    assert _error(admin.post("/v1/templates", files={"image": ("x.png", encode_image(
        np.full((200, 200, 3), 120, np.uint8), "png"))}), 422) == "template_no_face"
    assert _error(admin.post("/v1/templates", files=files, data={"name": "x" * 500}),
                  422) == "invalid_argument"
    assert _error(admin.post("/v1/templates", files=files, data={"metadata": "[1]"}),
                  422) == "invalid_argument"
    assert _error(admin.post("/v1/templates", files={"image": ("t.jpg", b"not an image")}),
                  415) in ("unsupported_format",)
    # the bound: 3 templates
    for name in ("obama", "astronaut"):
        assert admin.post("/v1/templates", files={
            "image": ("t", sample_paths[name].read_bytes())}).status_code == 201
    assert _error(admin.post("/v1/templates", files={
        "image": ("t", sample_paths["obama2"].read_bytes())}), 507) == "template_store_full"
    # delete: admin only, then gone
    assert _error(client.delete(f"/v1/templates/{tid}"), 403) == "forbidden"
    assert admin.delete(f"/v1/templates/{tid}").status_code == 204
    assert _error(admin.delete(f"/v1/templates/{tid}"), 404) == "template_not_found"
    assert _error(client.get(f"/v1/templates/{tid}"), 404) == "template_not_found"


def test_openapi_documents_the_new_routes(client: httpx.Client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/v1/templates", "/v1/templates/{template}", "/v1/templates/{template}/fuse",
              "/v1/capabilities"):
        assert p in paths, p
    fuse = paths["/v1/fuse"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert "mapping" in fuse["schema"]["properties"]
    assert "source_1" in fuse["schema"]["properties"]


def test_replicas_share_templates_through_redis(settings: Settings, model_dir: Path,
                                                redis_server: RedisServer,
                                                sample_paths: dict[str, Path],
                                                tmp_path: Path) -> None:
    # The template store's own Redis (here: the only one; no L2 Redis).
    env = {"FACEFUSE_TEMPLATES_BACKEND": "redis",
           "FACEFUSE_TEMPLATES_REDIS_URL": redis_server.url,
           "FACEFUSE_TEMPLATES_MAX_COUNT": "5", "FACEFUSE_RELOAD_POLL_S": "0",
           # no keys: admin routes open (where admin routes are closed by default)
           "FACEFUSE_ADMIN_OPEN": "true"}
    a = ServerProcess(settings.home, tmp_path, env, name="replica-a").start()
    try:
        b = ServerProcess(settings.home, tmp_path, env, name="replica-b").start()
        try:
            with a.client() as ca, b.client() as cb:
                assert cb.get("/v1/capabilities").json()["templates"]["backend"] == "redis"
                r = ca.post("/v1/templates", files={
                    "image": ("t.jpg", sample_paths["biden"].read_bytes())})
                assert r.status_code == 201, r.text
                tid = r.json()["id"]
                assert [t["id"] for t in cb.get("/v1/templates").json()["templates"]] == [tid]
                fused = cb.post(f"/v1/templates/{tid}/fuse", files={
                    "source": ("s.jpg", sample_paths["obama"].read_bytes())})
                assert fused.status_code == 200, fused.text
                assert "template;dur=" in fused.headers["server-timing"]
                assert cb.delete(f"/v1/templates/{tid}").status_code == 204
                assert _error(ca.get(f"/v1/templates/{tid}"), 404) == "template_not_found"
        finally:
            assert b.stop() in GRACEFUL_EXIT, b.log_tail()
    finally:
        assert a.stop() in GRACEFUL_EXIT, a.log_tail()


def test_many_mode_skips_the_small_face_and_says_so(
        client: httpx.Client, sample_paths: dict[str, Path],
        small_face_group: np.ndarray) -> None:
    group_png = encode_image(small_face_group, "png")
    boxes = [f["bbox"] for f in _faces(client, group_png)]
    files = {"source": ("a.png", sample_paths["astronaut"].read_bytes(), "image/png"),
             "target": ("g.png", group_png, "image/png")}
    r = client.post("/v1/fuse", files=files, data={"mode": "many", "format": "png"})
    assert r.status_code == 200, r.text
    skipped = json.loads(r.headers["x-facefuse-skipped-faces"])
    assert [(s["index"], s["reason"]) for s in skipped] == [(2, "target_face_too_small")]
    assert skipped[0]["box"] == [round(v) for v in boxes[2]]  # type: ignore[attr-defined]
    out = _decode(r.content)
    x0, y0, x1, y1 = skipped[0]["box"]
    assert np.array_equal(out[y0:y1, x0:x1], small_face_group[y0:y1, x0:x1])
    for box in boxes[:2]:
        bx0, by0, bx1, by1 = (int(v) for v in box)  # type: ignore[attr-defined]
        assert np.any(out[by0:by1, bx0:bx1] != small_face_group[by0:by1, bx0:bx1])
    # the header survives the result cache
    again = client.post("/v1/fuse", files=files, data={"mode": "many", "format": "png"})
    assert again.headers["x-facefuse-cache"] == "hit"
    assert again.headers["x-facefuse-skipped-faces"] == r.headers["x-facefuse-skipped-faces"]
    # a lower limit fuses all three; a limit above every face fails the request
    low = client.post("/v1/fuse", files=files,
                      data={"mode": "many", "format": "png", "min_face_size": "25"})
    assert low.status_code == 200 and "x-facefuse-skipped-faces" not in low.headers
    big_source = {**files, "source": ("o.jpg", sample_paths["obama"].read_bytes(), "image/jpeg")}
    high = client.post("/v1/fuse", files=big_source, data={"mode": "many", "min_face_size": "100"})
    assert _error(high, 422) == "target_face_too_small"
    assert _error(client.post("/v1/fuse", files=files, data={"min_face_size": "8"}),
                  422) == "invalid_argument"
    # mode one keeps its error for that face
    one = client.post("/v1/fuse", files=files, data={"target_face_index": "2"})
    assert _error(one, 422) == "target_face_too_small"
    caps = client.get("/v1/capabilities").json()
    assert caps["options"]["min_face_size"] == {"type": "number", "minimum": 16.0,
                                                "maximum": 1024.0, "default": 40.0}
    assert caps["limits"]["skipped_faces_header"] == "X-Facefuse-Skipped-Faces"
