"""L1/L2 building blocks: the byte-bounded LRU, the in-process result cache, keys, pHash.

The Redis-backed cache is tested against a real redis-server in
tests/integration/test_redis_cache.py.
"""

from __future__ import annotations

import threading

import cv2
import numpy as np
import pytest

from facefuse.serving.cache.keys import (
    analysis_key,
    result_key,
    sha256_hex,
)
from facefuse.serving.cache.lru import ByteLRU
from facefuse.serving.cache.results import CachedResult, InProcessResultCache, ResultCache

# --- ByteLRU --------------------------------------------------------------------------------


def test_lru_evicts_least_recently_used_to_stay_under_the_byte_bound() -> None:
    lru: ByteLRU[str, bytes] = ByteLRU(100, len)
    assert lru.put("a", b"x" * 40)
    assert lru.put("b", b"x" * 40)
    assert lru.get("a") == b"x" * 40  # a is now the most recent
    assert lru.put("c", b"x" * 40)  # must evict b, not a
    assert "b" not in lru
    assert "a" in lru
    assert "c" in lru
    assert lru.size_bytes == 80
    assert lru.evictions == 1
    stats = lru.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.items) == (1, 0, 1, 2)


def test_lru_replacing_a_key_recharges_its_size() -> None:
    lru: ByteLRU[str, bytes] = ByteLRU(100, len)
    lru.put("a", b"x" * 90)
    lru.put("a", b"x" * 10)
    assert lru.size_bytes == 10
    assert len(lru) == 1
    assert lru.evictions == 0


def test_lru_refuses_values_larger_than_the_bound_and_drops_the_old_value() -> None:
    lru: ByteLRU[str, bytes] = ByteLRU(100, len)
    lru.put("a", b"small")
    assert not lru.put("a", b"x" * 101)
    assert lru.get("a") is None
    assert lru.size_bytes == 0


def test_lru_delete_clear_and_miss_counting() -> None:
    lru: ByteLRU[str, bytes] = ByteLRU(1000, len)
    assert lru.get("nope") is None
    lru.put("a", b"1")
    lru.put("b", b"22")
    assert lru.delete("a")
    assert not lru.delete("a")
    assert lru.size_bytes == 2
    assert lru.clear() == 1
    assert lru.size_bytes == 0
    assert lru.stats().misses == 1
    assert lru.stats().hit_ratio == 0.0


def test_lru_with_array_values_charges_nbytes() -> None:
    lru: ByteLRU[int, np.ndarray] = ByteLRU(10_000, lambda a: a.nbytes)
    for i in range(10):
        lru.put(i, np.zeros(1000, np.uint8))
    assert len(lru) == 10
    lru.put(99, np.zeros(2500, np.uint8))
    assert lru.size_bytes <= 10_000
    assert 0 not in lru
    assert 1 not in lru
    assert 2 not in lru
    assert 3 in lru
    assert lru.evictions == 3


def test_lru_stays_consistent_under_threads() -> None:
    lru: ByteLRU[int, bytes] = ByteLRU(5_000, len)

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(2_000):
            k = int(rng.integers(0, 200))
            if rng.random() < 0.5:
                lru.put(k, b"x" * int(rng.integers(1, 300)))
            else:
                lru.get(k)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert lru.size_bytes <= 5_000
    # The byte count equals the sum of the held values: no lost updates.
    total = sum(len(v) for k in range(200) if (v := lru.get(k)) is not None)
    assert total == lru.size_bytes


# --- the in-process result cache -------------------------------------------------------------


@pytest.mark.anyio
async def test_in_process_result_cache_round_trip_and_limits() -> None:
    cache = InProcessResultCache(max_bytes=10_000, max_item_bytes=2_000)
    assert isinstance(cache, ResultCache)
    assert cache.healthy
    value = CachedResult(b"\xff\xd8" + b"j" * 100, "image/jpeg", 0.5)
    assert await cache.get("k1") is None
    assert await cache.put("k1", value)
    assert await cache.get("k1") == value
    assert not await cache.put("big", CachedResult(b"p" * 2_001, "image/png"))
    assert await cache.get("big") is None
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (1, 2)
    assert await cache.purge() == 1
    assert await cache.get("k1") is None


# --- keys ----------------------------------------------------------------------------------------

SRC = sha256_hex(b"source bytes")
TGT = sha256_hex(b"target bytes")
MODELS = {"detector": "0.6.0", "recognizer": "1.0"}


def test_result_key_is_canonical_and_sensitive_to_every_part() -> None:
    opts = {"degree": 0.8, "format": "jpeg", "quality": 90}
    key = result_key(SRC, TGT, opts, MODELS)
    assert len(key) == 64
    # Order of mapping keys does not matter.
    assert (
        result_key(SRC, TGT, dict(reversed(list(opts.items()))), dict(reversed(MODELS.items())))
        == key
    )
    others = {
        result_key(TGT, SRC, opts, MODELS),  # source and target are not interchangeable
        result_key(SRC, TGT, {**opts, "degree": 0.81}, MODELS),
        result_key(SRC, TGT, {**opts, "format": "png"}, MODELS),
        result_key(SRC, TGT, opts, {**MODELS, "recognizer": "1.1"}),
        result_key(SRC, sha256_hex(b"target bytes!"), opts, MODELS),
    }
    assert key not in others
    assert len(others) == 5


def test_result_key_rejects_non_digests() -> None:
    with pytest.raises(ValueError, match="SHA-256"):
        result_key("not-a-digest", TGT, {}, MODELS)
    with pytest.raises(ValueError, match="SHA-256"):
        result_key(SRC, TGT.upper(), {}, MODELS)
    with pytest.raises(ValueError, match=r"JSON compliant"):
        result_key(SRC, TGT, {"degree": float("nan")}, MODELS)


def test_analysis_key_depends_on_the_bytes_models_and_options() -> None:
    a, b = sha256_hex(b"\xff\xd8 one image"), sha256_hex(b"\xff\xd8 one imagf")
    assert analysis_key(a, MODELS) == analysis_key(a, dict(MODELS))
    assert analysis_key(a, MODELS) != analysis_key(b, MODELS)
    assert analysis_key(a, MODELS) != analysis_key(a, MODELS, {"detector": "short"})
    assert analysis_key(a, MODELS) != analysis_key(a, {**MODELS, "recognizer": "1.1"})


# --- pHash on real photos ----------------------------------------------------------------------


def _jpeg_roundtrip(rgb: np.ndarray, quality: int) -> np.ndarray:
    ok, buf = cv2.imencode(
        ".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    assert ok
    bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR)
    assert bgr is not None
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
