"""The one ONNX Runtime session factory.

Every model in the project is opened here, so one place decides providers,
threads, memory options and precision. Sessions are thread-safe for ``run``
and are shared across threads.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import onnxruntime as ort

from facefuse.config import Settings
from facefuse.errors import ModelCorruptError
from facefuse.runtime.providers import ProviderPlan, ShapeProfile, plan_providers

log = logging.getLogger(__name__)

def provider_plan(settings: Settings, profile: ShapeProfile | None = None) -> ProviderPlan:
    """:func:`~facefuse.runtime.providers.plan_providers` for ``settings`` on this host."""
    return plan_providers(settings.providers, ort.get_available_providers(),
                          precision=settings.precision, cache_dir=settings.optimized_cache,
                          profile=profile)


def resolve_providers(
    settings: Settings, profile: ShapeProfile | None = None
) -> list[str | tuple[str, dict[str, Any]]]:
    """Map ``settings.providers`` to ORT provider entries that exist on this host.

    Unavailable providers are dropped with a logged reason; the CPU provider is
    always last so a session can always be built.
    """
    plan = provider_plan(settings, profile)
    for reason in plan.fallbacks:
        log.warning("execution provider fallback: %s", reason)
    return list(plan.entries)


#: Whether the registry's CPU model sessions opened from now on plan their
#: intermediates (:func:`use_memory_pattern`).
_memory_pattern = False


def use_memory_pattern(on: bool = True) -> None:
    """The registry's model sessions opened from now on in this process, on the CPU,
    plan each input shape's intermediate tensors into one block (ONNX Runtime's
    memory pattern), or not (:func:`models_plan_memory`). Other sessions (the pixel
    graphs, whose input shapes change with every image; GPU ones) keep it off.

    It pays where glibc gives every large block a mapping of its own (a pinned mmap
    threshold, as the server sets: facefuse.serving.run.MMAP_THRESHOLD): a run then
    faults in the planned peak once, not each large tensor afresh. Measured there,
    YuNet's every-face analysis of 48 ~2 MP portraits took 144 -> 70 ms of CPU each,
    a 39-megapixel one 8.7 -> 5.1 s, with the same peak; fusions were unchanged. In a
    process on glibc's dynamic threshold (the library, the CLI) the separate tensors
    are reused from the heap instead, and the pattern cost 46 -> 65 ms: off there.
    """
    global _memory_pattern
    _memory_pattern = on


def models_plan_memory() -> bool:
    """Whether :func:`use_memory_pattern` asked for the memory pattern."""
    return _memory_pattern


def session_options(settings: Settings, optimized_path: Path | None = None, *,
                    memory_pattern: bool = False) -> ort.SessionOptions:
    """SessionOptions tuned for low memory: sequential execution, CPU arena per
    ``settings.ort_cpu_arena`` (off by default), a memory pattern per input shape
    only when asked (:func:`models_plan_memory`), full graph optimisation,
    ``settings.threads`` intra-op workers that do not spin."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = settings.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_cpu_mem_arena = settings.ort_cpu_arena
    so.enable_mem_pattern = memory_pattern
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    # Idle intra-op workers sleep instead of spinning: our model calls are short and
    # interleaved with OpenCV work that needs the same cores. Measured on 2 cores,
    # 2 threads: 59 ms per analysis with spinning, 26 ms without (1 thread: 31 ms).
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized_path is not None:
        optimized_path.parent.mkdir(parents=True, exist_ok=True)
        so.optimized_model_filepath = str(optimized_path)
    return so


def create_session(
    model: Path | bytes,
    settings: Settings,
    *,
    optimized_path: Path | None = None,
    profile: ShapeProfile | None = None,
    memory_pattern: bool = False,
) -> ort.InferenceSession:
    """Open an ONNX model (a path or the serialized bytes) as an InferenceSession.

    ``profile``: the model's input shapes and batch range (TensorRT's shape profile).
    ``memory_pattern``: plan each input shape's intermediates (see
    :func:`use_memory_pattern`).

    Raises :class:`ModelCorruptError` when ONNX Runtime cannot parse the model.
    """
    source = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(
            source,
            sess_options=session_options(settings, optimized_path,
                                         memory_pattern=memory_pattern),
            providers=resolve_providers(settings, profile),
        )
    except Exception as exc:  # ORT raises several private exception types
        name = "model bytes" if isinstance(model, bytes) else str(model)
        raise ModelCorruptError(
            f"ONNX Runtime cannot load {name}: {exc}. Rebuild with `facefuse models build`."
        ) from exc
