"""Settings from the environment, and precision-variant choice in the registry."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.runtime.manifest import Manifest
from facefuse.runtime.registry import choose_variant


def test_env_values_are_parsed_and_free_text_kept_verbatim() -> None:
    s = Settings.from_env({
        "FACEFUSE_THREADS": "3", "FACEFUSE_PRECISION": "INT8", "FACEFUSE_ATTRIBUTES": "yes",
        "FACEFUSE_HOME": "/tmp/ff", "FACEFUSE_REDIS_URL": "redis://:PaSs@127.0.0.1:6379/0",
    })
    assert s.threads == 3 and s.precision == "int8" and s.attributes is True
    assert s.home == Path("/tmp/ff") and s.model_dir == Path("/tmp/ff/models")
    assert s.redis_url == "redis://:PaSs@127.0.0.1:6379/0"


@pytest.mark.parametrize("env", [
    {"FACEFUSE_THREADS": "many"}, {"FACEFUSE_PRECISION": "int4"},
    {"FACEFUSE_ATTRIBUTES": "perhaps"}, {"FACEFUSE_DET_SCORE_THRESHOLD": "1.5"},
])
def test_bad_env_values_are_typed_errors(env: dict[str, str]) -> None:
    with pytest.raises(InvalidArgumentError):
        Settings.from_env(env)


def _with_variant(manifest: Manifest, base_sha: str) -> Manifest:
    base = manifest.get("dlib_resnet")
    variant = dataclasses.replace(base, name="dlib_resnet.int8", base="dlib_resnet",
                                  precision="int8", extra={"base_sha256": base_sha})
    return Manifest({**manifest.models, variant.name: variant})


def test_auto_precision_picks_a_current_int8_variant_and_skips_a_stale_one(
        model_dir: Path) -> None:
    manifest = Manifest.load(model_dir)
    auto = Settings(precision="auto", providers=("cpu",))
    current = _with_variant(manifest, manifest.get("dlib_resnet").sha256)
    assert choose_variant(current, "dlib_resnet", auto).precision == "int8"
    stale = _with_variant(manifest, "0" * 64)
    assert choose_variant(stale, "dlib_resnet", auto).precision == "fp32"
    assert choose_variant(current, "dlib_resnet", Settings(precision="fp32")).precision == "fp32"


@pytest.mark.parametrize("change", [
    {"max_batch_size": 0}, {"cpu_workers": 0}, {"redis_url": "http://cache"},
    {"log_level": "chatty"}, {"det_nms_iou": 1.0}, {"jobs_redis_url": "http://queue"},
])
def test_every_settings_object_is_validated_when_made(change: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError, match=next(iter(change))):
        Settings(**change)  # type: ignore[arg-type]  # out-of-range values on purpose
    with pytest.raises(InvalidArgumentError):
        Settings().replace(**change)


def test_the_job_queue_never_shares_the_caches_redis() -> None:
    """Jobs on the L2 cache's Redis would be evicted under its LRU: refused; the
    template store's Redis (durable too) may serve."""
    cache, durable = "redis://cache:6379/0", "redis://durable:6379/0"
    with pytest.raises(InvalidArgumentError, match="jobs_redis_url must not be the L2"):
        Settings(redis_url=cache, jobs_redis_url="redis://:pw@cache/0")
    # Another database of the cache's server is under the same eviction policy.
    for other in ("redis://cache:6379/1", "redis://cache/3"):
        with pytest.raises(InvalidArgumentError, match="jobs_redis_url must not be the L2"):
            Settings(redis_url=cache, jobs_redis_url=other)
        with pytest.raises(InvalidArgumentError, match="templates_redis_url must not be"):
            Settings(redis_url=cache, templates_redis_url=other)
    assert Settings(redis_url=cache, jobs_redis_url="redis://cache:6380/0").jobs_redis_url
    s = Settings(redis_url=cache, templates_redis_url=durable, jobs_redis_url=durable)
    assert s.jobs_redis_url == durable and "durable" not in repr(s)


def test_keys_and_log_level_are_settings_like_the_rest() -> None:
    s = Settings.from_env({"FACEFUSE_LOG_LEVEL": "DEBUG", "FACEFUSE_API_KEYS": "web:Secret"})
    assert s.log_level == "debug" and s.api_keys == "web:Secret"
    assert "Secret" not in repr(s)
