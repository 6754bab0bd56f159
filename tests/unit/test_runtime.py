"""Execution-provider choice, IO binding, warm-up sizes and the batch policy."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser
from facefuse.runtime.batch_policy import batch_policy, warm_batch_sizes
from facefuse.runtime.binding import run_bound
from facefuse.runtime.providers import (
    CPU,
    CUDA,
    TENSORRT,
    ProviderEntry,
    ShapeProfile,
    plan_providers,
    session_fallbacks,
)
from facefuse.runtime.registry import ModelRegistry, shape_profile
from facefuse.runtime.session import create_session, session_options, use_memory_pattern
from facefuse.runtime.warmup import warm_up

GPU_HOST = (TENSORRT, CUDA, CPU)


def options_of(entry: ProviderEntry) -> dict[str, Any]:
    """The options of a provider entry that carries them."""
    assert not isinstance(entry, str), entry
    return entry[1]

# -- provider plans (available providers injected) -----------------------------------------


def test_gpu_host_keeps_the_requested_order_with_options() -> None:
    profile = ShapeProfile({"input": (3, 150, 150)}, 1, 8, 32)
    plan = plan_providers(("tensorrt", "cuda", "cpu"), GPU_HOST, precision="auto",
                          cache_dir=Path("/cache"), profile=profile)
    assert plan.names == [TENSORRT, CUDA, CPU] and plan.gpu and plan.fallbacks == ()
    trt = options_of(plan.entries[0])
    assert trt["trt_fp16_enable"] is True
    assert trt["trt_engine_cache_enable"] is True and trt["trt_engine_cache_path"] == "/cache/trt"
    assert trt["trt_profile_min_shapes"] == "input:1x3x150x150"
    assert trt["trt_profile_opt_shapes"] == "input:8x3x150x150"
    assert trt["trt_profile_max_shapes"] == "input:32x3x150x150"
    cuda = options_of(plan.entries[1])
    assert cuda["arena_extend_strategy"] == "kSameAsRequested"


def test_fp32_precision_turns_tensorrt_fp16_off_and_no_cache_means_no_cache_options() -> None:
    plan = plan_providers(("trt",), GPU_HOST, precision="fp32")
    opts = options_of(plan.entries[0])
    assert opts["trt_fp16_enable"] is False and "trt_engine_cache_path" not in opts
    assert "trt_profile_min_shapes" not in opts
    assert plan.names == [TENSORRT, CPU]


def test_cpu_only_host_falls_back_with_one_reason_per_missing_provider() -> None:
    plan = plan_providers(("tensorrt", "cuda", "cpu"), (CPU,))
    assert plan.names == [CPU] and not plan.gpu
    assert len(plan.fallbacks) == 2
    assert TENSORRT in plan.fallbacks[0] and CUDA in plan.fallbacks[1]
    assert all("not available" in r for r in plan.fallbacks)


def test_cuda_only_build_skips_tensorrt_and_repeats_are_ignored() -> None:
    plan = plan_providers(("tensorrt", "cuda", "cuda", "CUDAExecutionProvider"), (CUDA, CPU))
    assert plan.names == [CUDA, CPU] and plan.gpu
    assert len(plan.fallbacks) == 1 and TENSORRT in plan.fallbacks[0]


def test_a_provider_the_session_dropped_is_reported() -> None:
    plan = plan_providers(("cuda",), (CUDA, CPU))
    reasons = session_fallbacks(plan, [CPU])
    assert len(reasons) == 1 and CUDA in reasons[0] and "could not be initialised" in reasons[0]
    assert session_fallbacks(plan, [CUDA, CPU]) == []


def test_unknown_provider_names_are_a_typed_error() -> None:
    with pytest.raises(InvalidArgumentError, match="gpu"):
        Settings.from_env({"FACEFUSE_PROVIDERS": "gpu,cpu"})
    s = Settings.from_env({"FACEFUSE_PROVIDERS": "TensorRT, CUDA,cpu",
                           "FACEFUSE_IO_BINDING": "ON"})
    assert s.providers == ("tensorrt", "cuda", "cpu") and s.io_binding == "on"
    with pytest.raises(InvalidArgumentError, match="io_binding"):
        Settings.from_env({"FACEFUSE_IO_BINDING": "sometimes"})


# -- the registry on this host --------------------------------------------------------------


def test_registry_records_fallbacks_per_model_and_keeps_cpu(
        caplog: pytest.LogCaptureFixture, settings: Settings, model_dir: Path) -> None:
    import onnxruntime as ort

    if CUDA in ort.get_available_providers():
        pytest.skip("this host has CUDA: nothing falls back")
    reg = ModelRegistry(settings.replace(providers=("tensorrt", "cuda", "cpu")))
    with caplog.at_level(logging.WARNING, logger="facefuse.runtime.registry"):
        m = reg.get("dlib_resnet")
    assert m.provider == CPU and not m.io_binding
    assert len(m.fallbacks) == 2 and CUDA in m.fallbacks[1]
    assert any("dlib_resnet" in r.getMessage() and CUDA in r.getMessage()
               for r in caplog.records)


def test_shape_profile_follows_the_manifest_inputs(registry: ModelRegistry) -> None:
    prof = shape_profile(registry.manifest.get("facemesh"), 64)
    assert prof is not None and prof.option(prof.batch_max) == "input:64x3x192x192"
    assert (prof.batch_min, prof.batch_opt) == (1, 8)
    small = shape_profile(registry.manifest.get("iris"), 4)
    assert small is not None and (small.batch_opt, small.batch_max) == (4, 4)


# -- IO binding against plain run() --------------------------------------------------------


@pytest.mark.parametrize("name", ["dlib_resnet", "facemesh", "blazeface_full", "iris"])
def test_io_binding_on_cpu_gives_plain_run_outputs(
        name: str, settings: Settings, model_dir: Path, registry: ModelRegistry) -> None:
    spec = registry.manifest.get(name)
    session = create_session(model_dir / spec.file, settings)
    rng = np.random.default_rng(7)
    dims = [int(d) for d in spec.inputs[0].shape[1:]]
    for n in (1, 8):
        x = rng.uniform(-1.0, 1.0, (n, *dims)).astype(np.float32)
        plain = session.run(None, {spec.inputs[0].name: x})
        bound = run_bound(session, [spec.inputs[0].name], [x], "cpu")
        assert len(bound) == len(plain) == len(spec.outputs)
        for a, b in zip(plain, bound, strict=True):
            assert b.shape == a.shape and b.dtype == a.dtype
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_registry_with_io_binding_on_embeds_a_real_face_like_plain_run(
        settings: Settings, model_dir: Path, registry: ModelRegistry, analyser: FaceAnalyser,
        sample_images: dict[str, np.ndarray], analysed_faces: dict[str, Any]) -> None:
    bound_reg = ModelRegistry(settings.replace(io_binding="on"))
    bound, plain = bound_reg.get("dlib_resnet"), registry.get("dlib_resnet")
    assert bound.io_binding and not plain.io_binding
    rgb, face = sample_images["obama"], analysed_faces["obama"]
    chips = np.asarray(analyser.models.recognizer.preprocess(stages.chips(rgb, [face])), np.float32)
    np.testing.assert_allclose(bound.run(chips)[0], plain.run(chips)[0], atol=1e-5)


# -- warm-up and batch policy --------------------------------------------------------------


def test_the_cpu_warms_batch_one_and_a_gpu_every_size_the_batcher_forms() -> None:
    s = Settings(max_batch_size=8, gpu_max_batch_size=32)
    assert batch_policy(s, gpu=False).warm_sizes() == (1,)
    assert batch_policy(s, gpu=True).warm_sizes() == (1, 8, 32)
    assert batch_policy(s, gpu=True).warm_sizes(batching=False) == (1,)


def test_warm_batch_sizes() -> None:
    assert warm_batch_sizes(1) == (1,)
    assert warm_batch_sizes(4) == (1, 4)
    assert warm_batch_sizes(8) == (1, 8)
    assert warm_batch_sizes(64) == (1, 8, 64)


def test_warm_up_runs_each_size_once(registry: ModelRegistry) -> None:
    model = registry.get("iris")
    seen: list[tuple[int, ...]] = []

    class Spy:
        spec = model.spec

        def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
            seen.append(inputs[0].shape)
            return model.run(*inputs)

    assert warm_up(Spy(), (8, 1, 8, 32)) == [1, 8, 32]
    assert [s[0] for s in seen] == [1, 8, 32] and seen[0][1:] == (3, 64, 64)


def test_batch_policy_gpu_defaults_and_cpu_defaults_unchanged() -> None:
    s = Settings()
    cpu = batch_policy(s, gpu=False)
    assert (cpu.max_batch_size, cpu.max_queue_delay_ms, cpu.device) == (8, 0.0, "cpu")
    gpu = batch_policy(s, gpu=True)
    assert gpu.device == "gpu" and gpu.max_batch_size > cpu.max_batch_size
    assert 0.0 < gpu.max_queue_delay_ms <= 20.0
    custom = batch_policy(s.replace(gpu_max_batch_size=64, gpu_max_queue_delay_ms=2.0), True)
    assert (custom.max_batch_size, custom.max_queue_delay_ms) == (64, 2.0)


def test_model_sessions_plan_their_memory_only_once_the_process_asks(
        settings: Settings) -> None:
    """The memory pattern is off in a plain process and on for the registry's CPU
    sessions opened after :func:`use_memory_pattern` (the server, under its pinned mmap
    threshold); a model runs alike either way."""
    assert session_options(settings).enable_mem_pattern is False
    x = np.random.default_rng(0).random((2, 3, 192, 192), np.float32) * 255
    plain = ModelRegistry(settings).get("blazeface_full")
    assert plain.session.get_session_options().enable_mem_pattern is False
    use_memory_pattern()
    try:
        planned = ModelRegistry(settings).get("blazeface_full")
    finally:
        use_memory_pattern(False)
    assert planned.session.get_session_options().enable_mem_pattern is True
    for a, b in zip(plain.run(x), planned.run(x), strict=True):
        np.testing.assert_array_equal(a, b)
