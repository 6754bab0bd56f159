"""Property-based fuzzing of the live server from its own OpenAPI schema (schemathesis).

Every operation of the schema gets a bounded number of generated requests (valid
and invalid by the schema), sent to a real server on loopback. Image fields are
mostly replaced by real sample photos — re-encoded as JPEG, PNG or WebP, resized,
or mutated (bytes flipped, truncated, truncated with an end marker, header sizes
changed) — so the requests reach decoding and face analysis, not only the
format check. schemathesis's checks then hold the server to its schema: no 5xx,
only documented status codes, content types, headers and bodies.

Bounded to a couple of minutes on 2 cores: ``MAX_EXAMPLES`` per operation and
generation mode, no shrinking.
"""

from __future__ import annotations

import base64
import io
import random
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from PIL import Image
from schemathesis import GenerationMode
from schemathesis import checks as st_checks
from server_harness import ServerProcess, graceful, metric_values

from facefuse.config import Settings

MAX_EXAMPLES = 25
IMAGE_FIELDS = ("source", "target", "reference", "image", "a", "b")


@schemathesis.serializer("application/sdp")
def _sdp(context: Any, value: Any) -> bytes:
    """An SDP offer (``POST /v1/live`` and its viewers) is text."""
    return value.encode("utf-8", "replace") if isinstance(value, str) else str(value).encode()


@pytest.fixture(scope="module")
def fuzz_server(
    settings: Settings, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("fuzz"), {
        "FACEFUSE_MAX_BODY_BYTES": str(4 * 1024 * 1024),
        "FACEFUSE_RELOAD_POLL_S": "0",
    }, name="fuzz")
    with graceful(proc):
        yield proc


@pytest.fixture(scope="module")
def api_schema(fuzz_server: ServerProcess) -> Any:
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


@pytest.fixture(scope="module")
def fuzz_images(sample_images: dict[str, np.ndarray]) -> dict[str, list[bytes]]:
    """Real photos in every accepted format and a few sizes, then mutations of them."""
    out: list[bytes] = []
    for _, rgb in sorted(sample_images.items()):
        im = Image.fromarray(rgb)
        for fmt, scale in (("JPEG", 1.0), ("PNG", 0.5), ("WEBP", 0.7)):
            small = im.resize((max(32, int(im.width * scale)), max(32, int(im.height * scale))))
            buf = io.BytesIO()
            small.save(buf, fmt)
            out.append(buf.getvalue())
    rng = random.Random(7)
    mutated = []
    for data in out:
        flipped = bytearray(data)
        for _ in range(3):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        mutated += [bytes(flipped), data[: len(data) // 3], data[: len(data) // 2] + b"\xff\xd9"]
    resized_header = bytearray(out[1])  # PNG: claim a far larger image in IHDR
    resized_header[16:24] = (60000).to_bytes(4, "big") + (60000).to_bytes(4, "big")
    mutated.append(bytes(resized_header))
    return {"real": out, "mutated": mutated}


def _with_real_images(case: Any, images: dict[str, list[bytes]]) -> None:
    """Replace most generated image fields by real photos or their mutations (a
    choice fixed by the case's own content, so a failing case replays)."""
    body = case.body
    if not isinstance(body, dict):
        return
    raw = (case.media_type or "").startswith("multipart/")
    seed = zlib.crc32(repr(sorted((k, repr(v)[:64]) for k, v in body.items())).encode())
    rng = random.Random(seed)
    for name in IMAGE_FIELDS:
        roll = rng.random()
        if name not in body or roll < 0.2:
            continue  # keep some generated values: they test the format checks
        data = rng.choice(images["real"] if roll < 0.7 else images["mutated"])
        if raw:
            body[name] = data  # a file part: the bytes themselves
        elif isinstance(body[name], str):
            body[name] = base64.b64encode(data).decode()  # JSON: base64


def _fuzz(operation: Any, mode: GenerationMode, images: dict[str, list[bytes]]) -> Callable[[], None]:
    """A hypothesis test of ``operation``'s ``mode`` cases against the live server."""
    real = mode is GenerationMode.POSITIVE  # a negative case's invalid image stays invalid

    @given(case=operation.as_strategy(mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def run(case: Any) -> None:
        if real:
            _with_real_images(case, images)
        # Valid-by-schema requests may still be refused for their image's content
        # (no face: 422, corrupt: 400), which no schema can express.
        case.call_and_validate(timeout=120, excluded_checks=[st_checks.positive_data_acceptance])

    return run


def test_every_operation_keeps_to_its_schema(
    api_schema: Any, fuzz_images: dict[str, list[bytes]], fuzz_server: ServerProcess
) -> None:
    """Valid and invalid requests for every operation; schemathesis's checks on each
    answer (schemathesis's own pytest plugin is bypassed: one test drives them all)."""
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 9, [op.label for op in operations]
    failures: dict[str, str] = {}
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(operation, mode, fuzz_images)()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # no parameter that could be invalid
            except Exception as exc:  # one operation's failure must not hide the others'
                failures[f"{operation.label} ({mode.value})"] = str(exc)[:3000]
    assert not failures, "\n\n".join(f"{k}:\n{v}" for k, v in failures.items())
    # The real photos did reach face analysis, and some requests succeeded with them.
    with fuzz_server.client() as c:
        text = c.get("/metrics").text
    meshed = metric_values(text, "facefuse_stage_duration_seconds_count").get('{stage="mesh"}', 0)
    served = metric_values(text, "facefuse_http_requests_total")
    ok = {k: v for k, v in served.items() if 'status="200"' in k and "/v1/" in k}
    assert meshed >= 5 and len(ok) >= 3, (meshed, served)
