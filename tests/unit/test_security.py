"""API keys (format, constant-time match, 401/403 rules) and the body-limit middleware."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, File, Request, UploadFile

from facefuse.config import Settings
from facefuse.errors import ForbiddenError, InvalidArgumentError, UnauthorizedError
from facefuse.serving.api_keys import MIN_TOKEN_LENGTH, ApiKeys, bearer_token
from facefuse.serving.http.body_limit import BodyLimitMiddleware

USER = "u" * 8 + secrets.token_urlsafe(16)
USER2 = secrets.token_hex(16)
ADMIN = "A" * 8 + secrets.token_urlsafe(16)


# --- API keys ----------------------------------------------------------------------------


def test_disabled_when_nothing_is_configured_but_admin_routes_stay_closed() -> None:
    keys = ApiKeys.from_settings(Settings.from_env({}))
    assert not keys.enabled
    assert keys.check(None) is None
    assert keys.check("Bearer whatever") is None
    for header in (None, "Bearer whatever"):
        with pytest.raises(ForbiddenError):
            keys.check(header, admin=True)


def test_admin_open_opens_admin_routes_only_without_keys() -> None:
    settings = Settings.from_env({"FACEFUSE_ADMIN_OPEN": "true"})
    keys = ApiKeys.from_settings(settings)
    keys.admin_open = settings.admin_open
    assert keys.check(None, admin=True) is None
    keyed = ApiKeys.from_env_value(USER, "")
    keyed.admin_open = True  # keys configured: admin_open changes nothing
    with pytest.raises(ForbiddenError):
        keyed.check(f"Bearer {USER}", admin=True)


def test_env_format_labels_separators_and_admin_keys() -> None:
    settings = Settings.from_env(
        {
            "FACEFUSE_API_KEYS": f" mobile:{USER} ,\n{USER2}\n",
            "FACEFUSE_ADMIN_KEYS": f"ops:{ADMIN}",
        }
    )
    assert USER not in repr(settings) and ADMIN not in repr(settings)
    keys = ApiKeys.from_settings(settings)
    assert keys.enabled
    assert keys.has_admin
    labels = keys.labels()
    assert labels[0] == "mobile"
    assert labels[1].startswith("key-")
    assert len(labels[1]) == 12
    assert labels[2] == "ops"
    assert keys.check(f"Bearer {USER}") == "mobile"
    assert keys.check(f"Bearer {USER2}") == labels[1]
    assert keys.check(f"Bearer {ADMIN}") == "ops"
    assert keys.check(f"Bearer {ADMIN}", admin=True) == "ops"


def test_unknown_missing_and_malformed_keys_are_401() -> None:
    keys = ApiKeys.from_env_value(USER, ADMIN)
    for header in (
        None,
        "",
        "   ",
        f"Basic {USER}",
        "Bearer",
        f"Bearer {USER}x",
        f"Bearer {USER[:-1]}",
        f"{USER}",
    ):
        with pytest.raises(UnauthorizedError) as info:
            keys.check(header)
        assert info.value.http_status == 401
        assert info.value.code == "unauthorized"
        assert USER not in info.value.message  # never echo the token


def test_non_admin_key_on_admin_route_is_403() -> None:
    keys = ApiKeys.from_env_value(USER, ADMIN)
    with pytest.raises(ForbiddenError) as info:
        keys.check(f"Bearer {USER}", admin=True)
    assert info.value.http_status == 403
    assert info.value.code == "forbidden"
    # An unknown key on an admin route is 401, not 403.
    with pytest.raises(UnauthorizedError):
        keys.check("Bearer " + "z" * 32, admin=True)


def test_admin_routes_closed_when_only_api_keys_are_set() -> None:
    keys = ApiKeys.from_env_value(USER)
    assert keys.check(f"Bearer {USER}") is not None
    with pytest.raises(ForbiddenError):
        keys.check(f"Bearer {USER}", admin=True)


def test_same_token_in_both_lists_is_an_admin_key() -> None:
    keys = ApiKeys.from_env_value(f"a:{ADMIN}", f"b:{ADMIN}")
    assert keys.check(f"Bearer {ADMIN}", admin=True) == "b"


def test_bearer_parsing_is_lenient_on_case_and_spaces_only() -> None:
    assert bearer_token(f"Bearer {USER}") == USER
    assert bearer_token(f"bearer   {USER}  ") == USER
    assert bearer_token(f"BEARER {USER}") == USER
    with pytest.raises(UnauthorizedError):
        bearer_token(f"Bearer {USER} extra")
    with pytest.raises(UnauthorizedError):
        bearer_token(f"Bearer\t{USER}")


@pytest.mark.parametrize(
    ("api", "admin", "needle"),
    [
        ("short:abc", "", "shorter than"),
        ("x" * (MIN_TOKEN_LENGTH - 1), "", "shorter than"),
        ("bad!label:" + "x" * 20, "", "label"),
        ("", "ops:" + "x" * 20 + '"quote', "characters"),
        ("", "ops:" + "x" * 10 + "=" + "x" * 10, "characters"),  # '=' only as padding
    ],
)
def test_malformed_entries_are_refused_without_echoing_tokens(
    api: str, admin: str, needle: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=needle) as info:
        ApiKeys.from_env_value(api, admin)
    var = "FACEFUSE_API_KEYS" if api else "FACEFUSE_ADMIN_KEYS"
    assert var in info.value.message
    assert "x" * 10 not in info.value.message


def test_tokens_never_appear_in_repr() -> None:
    keys = ApiKeys.from_env_value(f"m:{USER}", ADMIN)
    text = repr(keys) + repr(keys._keys)
    assert USER not in text
    assert ADMIN not in text
    assert "m" in keys.labels()


def test_match_compares_against_every_key() -> None:
    """The matching loop does not stop at the first hit (constant work per request)."""
    many = [secrets.token_urlsafe(24) for _ in range(5)]
    keys = ApiKeys.from_env_value(",".join(many))
    calls: list[int] = []
    import hmac as hmac_module

    real = hmac_module.compare_digest

    def counting(a: Any, b: Any) -> bool:
        calls.append(1)
        return real(a, b)

    mp = pytest.MonkeyPatch()
    mp.setattr("facefuse.serving.api_keys.hmac.compare_digest", counting)
    try:
        assert keys.match(many[0]) is not None
        assert len(calls) == 5
        assert keys.match("nope" * 8) is None
        assert len(calls) == 10
    finally:
        mp.undo()


# --- body limit ----------------------------------------------------------------------------


async def run_raw(
    app: BodyLimitMiddleware, chunks: list[bytes], headers: list[tuple[bytes, bytes]]
) -> tuple[list[dict[str, Any]], int]:
    """Drive the middleware directly; returns (sent messages, chunks pulled from the client)."""
    pulled = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled < len(chunks):
            pulled += 1
            return {
                "type": "http.request",
                "body": chunks[pulled - 1],
                "more_body": pulled < len(chunks),
            }
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "method": "POST", "path": "/", "headers": headers}
    await app(scope, receive, send)
    return sent, pulled


async def read_all_app(scope: Any, receive: Any, send: Any) -> None:
    """A naive app that reads the whole body, then echoes its length."""
    size = 0
    while True:
        msg = await receive()
        size += len(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    body = json.dumps({"size": size}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def _status_and_json(sent: list[dict[str, Any]]) -> tuple[int, Any]:
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert len(starts) == 1
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return starts[0]["status"], json.loads(body)


@pytest.mark.anyio
async def test_declared_length_over_limit_is_rejected_before_reading() -> None:
    called = False

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal called
        called = True

    sent, pulled = await run_raw(
        BodyLimitMiddleware(app, 1000), [b"x" * 2000], [(b"content-length", b"2000")]
    )
    status, body = _status_and_json(sent)
    assert status == 413
    assert body["error"]["code"] == "body_too_large"
    assert not called
    assert pulled == 0


@pytest.mark.anyio
async def test_streamed_body_stops_being_read_at_the_limit() -> None:
    chunks = [b"x" * 100] * 50  # 5000 bytes, no Content-Length (chunked upload)
    sent, pulled = await run_raw(BodyLimitMiddleware(read_all_app, 1000), chunks, [])
    status, body = _status_and_json(sent)
    assert status == 413
    assert body["error"]["code"] == "body_too_large"
    assert pulled == 11  # the chunk that crossed 1000 bytes, and not one more


@pytest.mark.anyio
async def test_lying_content_length_is_caught_by_counting() -> None:
    sent, pulled = await run_raw(
        BodyLimitMiddleware(read_all_app, 1000), [b"x" * 600] * 3, [(b"content-length", b"10")]
    )
    assert _status_and_json(sent)[0] == 413
    assert pulled == 2


@pytest.mark.anyio
async def test_bodies_within_the_limit_pass_untouched() -> None:
    sent, pulled = await run_raw(
        BodyLimitMiddleware(read_all_app, 1000), [b"x" * 500, b"y" * 500], []
    )
    status, body = _status_and_json(sent)
    assert status == 200
    assert body == {"size": 1000}
    assert pulled == 2


@pytest.mark.anyio
async def test_non_http_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def receive() -> dict[str, Any]:
        return {"type": "lifespan.startup"}

    async def send(message: Any) -> None:
        return None

    await BodyLimitMiddleware(app, 0)({"type": "lifespan"}, receive, send)
    assert seen == ["lifespan"]


def fastapi_app(limit: int) -> FastAPI:
    app = FastAPI()

    @app.post("/upload")
    async def upload(source: UploadFile = File(...)) -> dict[str, int]:  # noqa: B008
        return {"size": len(await source.read())}

    @app.post("/raw")
    async def raw(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    app.add_middleware(BodyLimitMiddleware, max_bytes=limit)
    return app


async def _chunks(total: int, size: int = 4096) -> AsyncIterator[bytes]:
    sent = 0
    while sent < total:
        n = min(size, total - sent)
        sent += n
        yield b"z" * n


@pytest.mark.anyio
async def test_fastapi_multipart_and_raw_bodies_get_413_json_not_400() -> None:
    app = fastapi_app(64 * 1024)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        small = await client.post("/upload", files={"source": ("a.jpg", b"j" * 1000, "image/jpeg")})
        assert small.status_code == 200
        assert small.json() == {"size": 1000}

        big = await client.post(
            "/upload", files={"source": ("a.jpg", b"j" * 200_000, "image/jpeg")}
        )
        assert big.status_code == 413
        assert big.json()["error"]["code"] == "body_too_large"

        # Chunked (no Content-Length): FastAPI would turn the parse failure into a 400.
        streamed = await client.post("/raw", content=_chunks(500_000))
        assert "content-length" not in streamed.request.headers
        assert streamed.status_code == 413
        assert streamed.json()["error"]["code"] == "body_too_large"

        # A chunked multipart upload: FastAPI parses the form itself and maps parse
        # errors to 400; the middleware must still answer 413.
        boundary = "b0undary"
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="source"; '
            f'filename="a.jpg"\r\nContent-Type: image/jpeg\r\n\r\n'
        ).encode()

        async def multipart() -> AsyncIterator[bytes]:
            yield head
            async for chunk in _chunks(500_000):
                yield chunk
            yield f"\r\n--{boundary}--\r\n".encode()

        form = await client.post(
            "/upload",
            content=multipart(),
            headers={"content-type": f"multipart/form-data; boundary={boundary}"},
        )
        assert "content-length" not in form.request.headers
        assert form.status_code == 413, form.text
        assert form.json()["error"]["code"] == "body_too_large"

        ok = await client.post("/raw", content=_chunks(10_000))
        assert ok.status_code == 200
        assert ok.json() == {"size": 10_000}
