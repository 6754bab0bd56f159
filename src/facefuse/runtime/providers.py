"""Which ONNX Runtime execution providers a session gets, and why.

``FACEFUSE_PROVIDERS`` lists providers in order of preference
(``tensorrt,cuda,cpu``). :func:`plan_providers` turns that list and the
providers this onnxruntime build has into a :class:`ProviderPlan`: the ORT
provider entries with their options, and one logged reason per requested
provider that was dropped. It is a pure function of its arguments (the
available providers are passed in), so the choice is testable on any host.

After a session is built, :func:`session_fallbacks` compares the plan with the
providers the session really kept (ORT drops CUDA silently when its libraries
fail to load) and adds those reasons too; ``GET /v1/models`` shows them per model.

Options set for the GPU providers:

* TensorRT: FP16 kernels when the precision allows it (``auto`` or ``fp16``),
  the engine and timing caches under ``<optimized_cache>/trt`` (engines are
  built once per model and shape profile, minutes on first start), and one
  dynamic-shape profile per model input from batch 1 to the largest batch the
  batcher will form, optimised for the most common size.
* CUDA: the device, an arena that grows by what is asked (not by powers of
  two: batches of 64 would otherwise reserve twice their size), cuDNN's
  heuristic algorithm search (no exhaustive search per new shape), and copies
  in the default stream (IO binding relies on it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from facefuse.config import PROVIDER_NAMES

CPU: Final = "CPUExecutionProvider"
CUDA: Final = "CUDAExecutionProvider"
TENSORRT: Final = "TensorrtExecutionProvider"

#: Providers that run on a GPU (sessions on them take FP16 variants and IO binding).
GPU_PROVIDERS: Final = frozenset({CUDA, TENSORRT})

ProviderEntry = str | tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class ShapeProfile:
    """One dynamic-shape profile for TensorRT: per input name, (C, H, W) and the
    batch sizes (min, opt, max)."""

    inputs: Mapping[str, tuple[int, ...]]
    batch_min: int = 1
    batch_opt: int = 8
    batch_max: int = 8

    def option(self, batch: int) -> str:
        """``name:NxCxHxW,...`` as ``trt_profile_*_shapes`` wants it."""
        return ",".join(
            f"{name}:" + "x".join(str(d) for d in (batch, *dims))
            for name, dims in self.inputs.items()
        )


@dataclass(frozen=True)
class ProviderPlan:
    """The provider entries for ``InferenceSession`` and the reasons for dropped ones.

    Attributes:
        entries: ORT providers (names or ``(name, options)``), CPU always last.
        fallbacks: one human-readable reason per requested provider not used.
    """

    entries: tuple[ProviderEntry, ...]
    fallbacks: tuple[str, ...] = field(default=())

    @property
    def names(self) -> list[str]:
        return [e if isinstance(e, str) else e[0] for e in self.entries]

    @property
    def gpu(self) -> bool:
        """True when the first choice runs on a GPU."""
        return self.names[0] in GPU_PROVIDERS


def plan_providers(
    requested: Sequence[str],
    available: Iterable[str],
    *,
    precision: str = "auto",
    cache_dir: Path | None = None,
    profile: ShapeProfile | None = None,
    device_id: int = 0,
) -> ProviderPlan:
    """The providers to open a session with, in preference order.

    Args:
        requested: short or ORT names in order of preference (``("tensorrt", "cuda")``).
        available: what ``onnxruntime.get_available_providers()`` returns on this host.
        precision: the configured precision; TensorRT's FP16 kernels are on for
            ``auto`` and ``fp16``.
        cache_dir: where TensorRT keeps engines and timing caches (None: no cache).
        profile: the model's input shapes and batch range (None: TensorRT decides).
        device_id: the CUDA device.

    Returns:
        A plan whose entries end with the CPU provider, so a session can always be built.
    """
    have = set(available)
    entries: list[ProviderEntry] = []
    fallbacks: list[str] = []
    seen: set[str] = set()
    for short in requested:
        name = PROVIDER_NAMES.get(short, short)
        if name in seen:
            continue
        seen.add(name)
        if name not in have:
            fallbacks.append(f"{name} requested but not available in this onnxruntime "
                             f"build (have: {', '.join(sorted(have)) or 'none'})")
            continue
        if name == TENSORRT:
            entries.append((name, tensorrt_options(precision, cache_dir, profile, device_id)))
        elif name == CUDA:
            entries.append((name, cuda_options(device_id)))
        else:
            entries.append(name)
    if CPU not in seen:
        entries.append(CPU)
    return ProviderPlan(tuple(entries), tuple(fallbacks))


def tensorrt_options(
    precision: str, cache_dir: Path | None, profile: ShapeProfile | None, device_id: int
) -> dict[str, Any]:
    """TensorRT provider options (see the module docstring)."""
    opts: dict[str, Any] = {
        "device_id": device_id,
        "trt_fp16_enable": precision in ("auto", "fp16"),
        "trt_int8_enable": False,
    }
    if cache_dir is not None:
        trt = str(cache_dir / "trt")
        opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=trt,
                    trt_timing_cache_enable=True, trt_timing_cache_path=trt)
    if profile is not None:
        opts.update(trt_profile_min_shapes=profile.option(profile.batch_min),
                    trt_profile_opt_shapes=profile.option(profile.batch_opt),
                    trt_profile_max_shapes=profile.option(profile.batch_max))
    return opts


def cuda_options(device_id: int) -> dict[str, Any]:
    """CUDA provider options (see the module docstring)."""
    return {
        "device_id": device_id,
        "arena_extend_strategy": "kSameAsRequested",
        "cudnn_conv_algo_search": "HEURISTIC",
        "do_copy_in_default_stream": True,
    }


def session_fallbacks(plan: ProviderPlan, kept: Sequence[str]) -> list[str]:
    """The plan's fallbacks plus a reason for every planned provider the session lost.

    Args:
        plan: what the session was asked to use.
        kept: ``session.get_providers()`` after construction.
    """
    lost = [n for n in plan.names if n not in kept]
    return [*plan.fallbacks, *(
        f"{n} could not be initialised for this model (see the onnxruntime log); "
        f"running on {kept[0] if kept else CPU}" for n in lost)]


def device_of(provider: str) -> str:
    """``cuda`` for a GPU provider, else ``cpu`` (the device IO binding targets)."""
    return "cuda" if provider in GPU_PROVIDERS else "cpu"
