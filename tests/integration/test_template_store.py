"""Both template stores through one interface: files under a directory, and a real
redis-server on loopback (the backend several replicas share)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from facefuse.errors import (
    CacheUnavailableError,
    TemplateNotFoundError,
    TemplateStoreFullError,
)
from facefuse.faces.analyser import FaceAnalyser
from facefuse.serving.templates import (
    FileTemplateStore,
    RedisTemplateStore,
    Template,
    TemplateStore,
    template_id,
)


@pytest.fixture(scope="module")
def make_template(analyser: FaceAnalyser, sample_paths) -> Callable[[str], Template]:  # type: ignore[no-untyped-def]
    def make(name: str) -> Template:
        data = sample_paths[name].read_bytes()
        rgb = analyser.decode(data)
        faces = analyser.analyse(rgb)
        return Template(template_id(data), name, data, tuple(faces), rgb.shape[1], rgb.shape[0],
                        {"m": "v"}, {"campaign": "spring"})
    return make


@pytest.fixture(params=["file", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], TemplateStore]:
    """A factory: the Redis client must be made on the loop of the test's asyncio.run."""
    if request.param == "file":
        return lambda: FileTemplateStore(tmp_path / "tpl", max_count=2, max_bytes=10_000_000)
    server = request.getfixturevalue("redis_server")
    return lambda: RedisTemplateStore(server.url, max_count=2, max_bytes=10_000_000)


def run(open_store: Callable[[], TemplateStore], use):  # type: ignore[no-untyped-def]
    """``use(store)`` on a fresh store in one event loop, closing it afterwards."""
    async def go():  # type: ignore[no-untyped-def]
        s = open_store()
        try:
            return await use(s)
        finally:
            await s.close()
    return asyncio.run(go())


def test_round_trip_is_exact_and_ids_are_content_addresses(store, make_template) -> None:  # type: ignore[no-untyped-def]
    t = make_template("obama")

    async def go(store: TemplateStore) -> tuple[bool, bool, Template, list[dict[str, object]]]:
        first = await store.put(t)
        again = await store.put(make_template("obama"))
        return first, again, await store.get(t.id), await store.list()

    first, again, back, listing = run(store, go)
    assert first and not again  # the same upload is stored once
    assert len(t.id) == 32 and t.id == template_id(t.image)
    assert back.image == t.image and back.metadata == {"campaign": "spring"}
    assert len(back.faces) == len(t.faces) >= 1
    for a, b in zip(t.faces, back.faces, strict=True):
        for name in ("bbox", "landmarks", "landmarks5", "chip_transform", "embedding"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
        assert a.score == b.score
    assert [x["id"] for x in listing] == [t.id]
    assert listing[0]["faces"] == len(t.faces) and listing[0]["bytes"] == t.nbytes


def test_bounded_by_count_and_bytes(store, make_template, tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def go(store: TemplateStore) -> None:
        await store.put(make_template("obama"))
        await store.put(make_template("biden"))
        with pytest.raises(TemplateStoreFullError):
            await store.put(make_template("astronaut"))
        await store.delete(template_id(make_template("obama").image))
        await store.put(make_template("astronaut"))
        assert len(await store.list()) == 2

    run(store, go)
    small = FileTemplateStore(tmp_path / "small", max_count=10, max_bytes=1000)
    with pytest.raises(TemplateStoreFullError) as exc:
        asyncio.run(small.put(make_template("obama")))
    assert exc.value.http_status == 507


def test_missing_and_malformed_ids_are_not_found(store) -> None:  # type: ignore[no-untyped-def]
    async def go(store: TemplateStore) -> None:
        for bad in ("0" * 32, "../../etc/passwd", "", "A" * 32):
            with pytest.raises(TemplateNotFoundError):
                await store.get(bad)
            with pytest.raises(TemplateNotFoundError):
                await store.delete(bad)

    run(store, go)


def test_redis_down_is_a_typed_503(redis_server, make_template) -> None:  # type: ignore[no-untyped-def]
    redis_server.kill()

    async def go() -> None:
        s = RedisTemplateStore(redis_server.url, max_count=2, max_bytes=10_000_000,
                               socket_timeout=0.5)
        try:
            with pytest.raises(CacheUnavailableError) as exc:
                await s.put(make_template("obama"))
            assert exc.value.code == "template_store_unavailable"
        finally:
            await s.close()

    asyncio.run(go())


def test_redis_records_are_verified_quarantined_and_losses_counted(
        redis_factory: Callable[..., Any],
        make_template: Callable[[str], Template]) -> None:
    import redis as redis_client

    from facefuse.errors import TemplateDamagedError

    server = redis_factory("--maxmemory-policy", "noeviction", "--appendonly", "yes")
    a, b = make_template("obama"), make_template("biden")
    direct = redis_client.Redis(port=server.port)

    async def go() -> None:
        s = RedisTemplateStore(server.url, max_count=5, max_bytes=10_000_000)
        try:
            assert (await s.health()).durable is True
            await s.put(a)
            await s.put(b)
            key = RedisTemplateStore.PREFIX + a.id
            record = direct.get(key)
            assert isinstance(record, bytes)
            direct.set(key, record[:-100])  # cut short
            with pytest.raises(TemplateDamagedError) as exc:
                await s.get(a.id)
            assert exc.value.code == "template_damaged" and exc.value.http_status == 410
            assert direct.exists(RedisTemplateStore.QUARANTINE + a.id)
            direct.delete(RedisTemplateStore.PREFIX + b.id)  # gone from under its listing
            assert await s.list() == []
            assert s.incidents == {"damaged": 1, "lost": 1}
            direct.flushall()  # a wipe under a running server
            await s.health()
            assert s.incidents["lost"] == 2
        finally:
            await s.close()

    asyncio.run(go())
    direct.close()


def test_a_file_store_on_tmpfs_says_it_is_not_durable() -> None:
    import tempfile

    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm on this machine")
    with tempfile.TemporaryDirectory(dir=shm) as volatile:
        on_tmpfs = asyncio.run(FileTemplateStore(Path(volatile) / "tpl", max_count=1,
                                                 max_bytes=1).health())
    assert (on_tmpfs.durable, "tmpfs" in on_tmpfs.reason) == (False, True)
