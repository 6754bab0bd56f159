"""Template records the server cannot trust, against a real server (file store):
labels that could not be listed back are refused before anything is stored; a
truncated, random, linked, bomb or missing record is a typed 410, set aside
(quarantined) and no longer listed, without the memory a bomb declares; leftover
records count against the store's bound; re-registering an image with other labels
is a 409 naming the existing template."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from numpy.lib import format as npy_format
from server_harness import ADMIN_TOKEN, GRACEFUL_EXIT, ServerProcess

from facefuse.config import Settings

MAX_BYTES = 3 * 1024 * 1024


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("records")


@pytest.fixture(scope="module")
def server(settings: Settings, model_dir: Path, store_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("records-log"), {
        "FACEFUSE_ADMIN_KEYS": f"ops:{ADMIN_TOKEN}",
        "FACEFUSE_TEMPLATES_DIR": str(store_dir),
        "FACEFUSE_TEMPLATES_MAX_BYTES": str(MAX_BYTES),
    }, name="records")
    proc.start()
    yield proc
    assert proc.stop() in GRACEFUL_EXIT, proc.log_tail()


@pytest.fixture
def admin(server: ServerProcess, store_dir: Path) -> Iterator[httpx.Client]:
    with server.client(ADMIN_TOKEN) as c:
        yield c
    for p in store_dir.glob("*.*"):  # each test starts from an empty store
        p.unlink()


def _register(admin: httpx.Client, image: bytes, **fields: str) -> httpx.Response:
    return admin.post("/v1/templates", files={"image": ("t.jpg", image)}, data=fields)


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    code: str = r.json()["error"]["code"]
    return code


def test_labels_that_cannot_be_listed_back_are_refused_before_storing(
        admin: httpx.Client, sample_paths: dict[str, Path]) -> None:
    image = sample_paths["obama"].read_bytes()
    body = json.dumps({"image": base64.b64encode(image).decode(),
                       "metadata": {"k": "\ud800x"}})  # ASCII JSON: the \ud800 escape
    r = admin.post("/v1/templates", content=body,
                   headers={"Content-Type": "application/json"})
    assert _error(r, 422) == "invalid_template_metadata"
    r = _register(admin, image, metadata='{"k": "\\ud800x"}')
    assert _error(r, 422) == "invalid_template_metadata"
    assert _error(_register(admin, image, name="a\x00b"), 422) == "invalid_template_metadata"
    listing = admin.get("/v1/templates")
    assert listing.status_code == 200 and listing.json()["count"] == 0
    ok = _register(admin, image, name="ok", metadata='{"k": "ünïcode ✓"}')
    assert ok.status_code == 201, ok.text
    assert admin.get("/v1/templates").json()["templates"][0]["metadata"] == {"k": "ünïcode ✓"}


def _bomb(template: str, declared: int) -> bytes:
    """A record whose image member is ``declared`` bytes of zeros, deflated to ~1/1000."""
    buf = io.BytesIO()
    head = {"id": template, "name": "", "metadata": {}, "created": time.time(), "width": 8,
            "height": 8, "model_versions": {}, "faces": []}
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("head.npy", _npy(np.frombuffer(json.dumps(head).encode(), np.uint8)))
        with z.open("image.npy", "w", force_zip64=True) as fh:
            npy_format.write_array_header_1_0(
                fh, {"descr": "|u1", "fortran_order": False, "shape": (declared,)})
            zeros = bytes(1 << 24)
            for _ in range(declared >> 24):
                fh.write(zeros)
    return buf.getvalue()


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _rss(server: ServerProcess) -> int:
    for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.mark.parametrize("damage", ["truncated", "random", "symlink", "bomb", "lost"])
def test_a_damaged_record_is_a_typed_410_and_set_aside(
        damage: str, admin: httpx.Client, server: ServerProcess, store_dir: Path,
        sample_paths: dict[str, Path], tmp_path: Path) -> None:
    r = _register(admin, sample_paths["obama"].read_bytes(), name="victim")
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    record, summary = store_dir / f"{tid}.tpl", store_dir / f"{tid}.json"
    data = record.read_bytes()
    if damage == "truncated":
        record.write_bytes(data[: len(data) // 2])
    elif damage == "random":
        record.write_bytes(os.urandom(len(data)))
    elif damage == "symlink":
        outside = tmp_path / "elsewhere.tpl"
        outside.write_bytes(data)
        record.unlink()
        record.symlink_to(outside)
    elif damage == "bomb":  # a forged record with a summary that matches it
        bomb = _bomb(tid, 1 << 30)
        record.write_bytes(bomb)
        s = json.loads(summary.read_text())
        s["sha256"] = hashlib.sha256(bomb).hexdigest()
        summary.write_text(json.dumps(s))
    else:
        record.unlink()
    before = _rss(server)
    r = admin.get(f"/v1/templates/{tid}")
    code = _error(r, 410)
    assert code == ("template_lost" if damage == "lost" else "template_damaged")
    assert _rss(server) - before < 256 * 1024 * 1024  # the bomb was never inflated
    assert admin.get("/v1/templates").json()["count"] == 0
    assert _error(admin.get(f"/v1/templates/{tid}"), 404) == "template_not_found"
    assert {p.name.split(".")[0] for p in (store_dir / "quarantine").iterdir()} >= {tid}
    ready = admin.get("/readyz").json()
    assert ready["checks"]["templates"] == "file"
    metrics = admin.get("/metrics").text
    assert "facefuse_template_store_incidents_total" in metrics
    # Registered again, it is fresh and whole.
    again = _register(admin, sample_paths["obama"].read_bytes(), name="victim")
    assert again.status_code == 201, again.text
    assert admin.get(f"/v1/templates/{tid}").status_code == 200


def test_a_listing_survives_a_damaged_summary(admin: httpx.Client, store_dir: Path,
                                              sample_paths: dict[str, Path]) -> None:
    ids = [_register(admin, sample_paths[n].read_bytes()).json()["id"]
           for n in ("obama", "biden")]
    (store_dir / f"{ids[0]}.json").write_text('{"id": "' + ids[0] + '", "name": "\\ud800"}')
    listing = admin.get("/v1/templates")
    assert listing.status_code == 200, listing.text
    assert [t["id"] for t in listing.json()["templates"]] == [ids[1]]
    assert admin.get(f"/v1/templates/{ids[1]}").status_code == 200


def test_leftover_records_count_against_the_bound_then_are_set_aside(
        admin: httpx.Client, store_dir: Path, sample_paths: dict[str, Path]) -> None:
    store_dir.mkdir(exist_ok=True)
    orphan = store_dir / ("ab" * 16 + ".tpl")
    orphan.write_bytes(os.urandom(MAX_BYTES - 100_000))
    image = sample_paths["obama"].read_bytes()
    assert _error(_register(admin, image), 507) == "template_store_full"
    old = time.time() - 3600  # an interrupted put of long ago
    os.utime(orphan, (old, old))
    assert admin.get("/v1/templates").json()["count"] == 0
    assert not orphan.exists()
    assert _register(admin, image).status_code == 201


def test_reregistering_an_image_with_other_labels_is_409(
        admin: httpx.Client, sample_paths: dict[str, Path]) -> None:
    image = sample_paths["biden"].read_bytes()
    first = _register(admin, image, name="a", metadata='{"k": "1"}')
    assert first.status_code == 201, first.text
    tid = first.json()["id"]
    same = _register(admin, image, name="a", metadata='{"k": "1"}')
    assert same.status_code == 200 and same.json()["id"] == tid
    other = _register(admin, image, name="b", metadata='{"k": "2"}')
    assert _error(other, 409) == "template_exists"
    assert other.json()["error"]["id"] == tid
    detail = admin.get(f"/v1/templates/{tid}").json()
    assert (detail["name"], detail["metadata"]) == ("a", {"k": "1"})
