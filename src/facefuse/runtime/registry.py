"""The model registry: manifest + verified files + shared ORT sessions.

``ModelRegistry.get(name)`` returns a :class:`LoadedModel` (spec + session),
choosing the precision variant the settings ask for, verifying its sha256 on
first load and sharing the session across threads afterwards.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from facefuse.config import Settings
from facefuse.runtime.batch_policy import TYPICAL_BATCH
from facefuse.runtime.binding import run_bound
from facefuse.runtime.manifest import Manifest, ModelSpec, verify_file
from facefuse.runtime.providers import ShapeProfile, device_of, session_fallbacks
from facefuse.runtime.session import create_session, models_plan_memory, provider_plan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A verified model and its ONNX Runtime session.

    ``fallbacks``: why a requested execution provider is not the one in use
    (empty when the first choice runs it); ``io_binding``: batches run through
    :func:`~facefuse.runtime.binding.run_bound` on the session's device.
    """

    spec: ModelSpec
    session: ort.InferenceSession
    path: Path
    fallbacks: tuple[str, ...] = ()
    io_binding: bool = False

    @property
    def input_name(self) -> str:
        return self.spec.inputs[0].name

    @property
    def provider(self) -> str:
        return str(self.session.get_providers()[0])

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run with positional inputs (in manifest order); returns all outputs."""
        if self.io_binding:
            return run_bound(self.session, [t.name for t in self.spec.inputs], inputs,
                             device_of(self.provider))
        feeds = {t.name: x for t, x in zip(self.spec.inputs, inputs, strict=True)}
        out: list[Any] = self.session.run(None, feeds)
        return [np.asarray(o) for o in out]


class ModelEntry(Protocol):
    """Anything that names a model by its manifest entry: a :class:`LoadedModel`, or a
    :class:`DeferredModel` whose session the registry builds on its first run."""

    @property
    def spec(self) -> ModelSpec: ...


@dataclass(frozen=True)
class DeferredModel:
    """A model chosen (its manifest entry, precision included) but not loaded: callers
    that only read the spec hold this, and the first model run through
    :meth:`ModelRegistry.get` builds the session."""

    spec: ModelSpec


def gpu_requested(settings: Settings) -> bool:
    """True when a requested GPU provider exists in this onnxruntime build."""
    return provider_plan(settings).gpu


def shape_profile(spec: ModelSpec, max_batch: int) -> ShapeProfile | None:
    """TensorRT's profile for a model with a dynamic batch axis (None: fixed shapes)."""
    if not spec.inputs or not all(isinstance(t.shape[0], str) for t in spec.inputs):
        return None
    dims = {t.name: tuple(int(d) for d in t.shape[1:]) for t in spec.inputs
            if all(isinstance(d, int) for d in t.shape[1:])}
    if len(dims) != len(spec.inputs):
        return None
    top = max(1, max_batch)
    return ShapeProfile(dims, 1, min(TYPICAL_BATCH, top), top)


def choose_variant(manifest: Manifest, name: str, settings: Settings) -> ModelSpec:
    """Pick the manifest entry for ``name`` at the configured precision.

    ``auto``: INT8 on CPU when a gated INT8 variant exists, FP16 on GPU when one
    exists, FP32 otherwise. An explicit precision with no variant falls back to
    FP32 with a logged reason.
    """
    base = manifest.get(name)
    variants = {}
    for m in manifest.models.values():
        if m.base != name:
            continue
        made_from = m.extra.get("base_sha256")
        if made_from is not None and made_from != base.sha256:
            log.warning("ignoring %s: made from an older %s (rebuild it with "
                        "`facefuse models quantize`)", m.name, name)
            continue
        variants[m.precision] = m
    want = settings.precision
    if want == "auto":
        want = "fp16" if gpu_requested(settings) else "int8"
    if want in variants:
        return variants[want]
    if want != "fp32" and settings.precision != "auto":
        log.warning("no %s variant of %s in the manifest; using fp32", want, name)
    return base


class ModelRegistry:
    """Thread-safe lazy loader of the models in one model directory."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.models_dir = settings.model_dir
        self._lock = threading.Lock()
        self._reload_lock = threading.Lock()
        self._manifest: Manifest | None = None
        self._loaded: dict[str, LoadedModel] = {}
        #: Incremented by every :meth:`reload` that swapped in a new model set.
        self.generation = 0

    @property
    def manifest(self) -> Manifest:
        """The manifest in force (read from disk on first use)."""
        with self._lock:
            return self._current_manifest()

    def _current_manifest(self) -> Manifest:
        """The manifest in force; call with ``_lock`` held."""
        if self._manifest is None:
            self._manifest = Manifest.load(self.models_dir)
        return self._manifest

    def has(self, name: str) -> bool:
        return name in self.manifest.models

    def entry(self, name: str) -> ModelEntry:
        """``name``'s model without loading it: the loaded one if there is one, else a
        :class:`DeferredModel` of the entry :meth:`get` would load (same variant)."""
        loaded = self._loaded.get(name)
        if loaded is not None:
            return loaded
        with self._lock:
            return DeferredModel(choose_variant(self._current_manifest(), name, self.settings))

    def get(self, name: str) -> LoadedModel:
        """The loaded model for a base name (precision chosen by settings)."""
        loaded = self._loaded.get(name)
        if loaded is not None:
            return loaded
        with self._lock:
            # The variant is chosen under the lock, from the manifest in force: a
            # reload swapping manifests meanwhile cannot pair an old spec with the
            # new model set.
            loaded = self._loaded.get(name)
            if loaded is None:
                loaded = self._load(choose_variant(self._current_manifest(), name,
                                                   self.settings))
                self._loaded[name] = loaded
        return loaded

    def _load(self, spec: ModelSpec) -> LoadedModel:
        path = verify_file(self.models_dir, spec)
        optimized = None
        if self.settings.optimized_cache is not None:
            optimized = self.settings.optimized_cache / f"{spec.sha256[:16]}.opt.onnx"
        s = self.settings
        profile = shape_profile(spec, max(s.max_batch_size, s.gpu_max_batch_size))
        providers = provider_plan(s, profile)
        session = create_session(path, s, optimized_path=optimized, profile=profile,
                                 memory_pattern=models_plan_memory() and not providers.gpu)
        kept = session.get_providers()
        fallbacks = tuple(session_fallbacks(providers, kept))
        for reason in fallbacks:
            log.warning("model %s: %s", spec.name, reason)
        bind = s.io_binding == "on" or (s.io_binding == "auto" and device_of(kept[0]) != "cpu")
        log.info("loaded model %s (%s, %s)", spec.name, spec.precision, kept[0])
        return LoadedModel(spec=spec, session=session, path=path, fallbacks=fallbacks,
                           io_binding=bind)

    def loaded(self) -> dict[str, LoadedModel]:
        """The models loaded so far, by base name."""
        return dict(self._loaded)

    def reload(self, names: Iterable[str] | None = None, *,
               check: Iterable[str] = ()) -> list[str]:
        """Re-read the manifest on disk and swap in new sessions, all or nothing.

        Every model loaded so far (plus ``names``) is resolved against the new
        manifest and its file verified by sha256; so is every model of ``check``
        that is not loaded (one loaded on its first run), without loading it.
        Unchanged models (same file and sha256) keep their session; changed ones get
        a new session built beside the old one. Only when every model loaded (and
        every checked file is sound) does the registry swap its manifest and model
        dict in one step: callers holding an old :class:`LoadedModel` finish on it,
        the next :meth:`get` returns the new one.

        Returns:
            The base names whose model changed (empty when nothing did), those of
            ``check`` whose entry changed included.

        Raises:
            ModelError: a missing, corrupt or unloadable model or manifest; nothing
                is swapped and the old models keep serving.
        """
        with self._reload_lock:
            manifest = Manifest.load(self.models_dir)
            current = dict(self._loaded)
            wanted = list(dict.fromkeys([*current, *(names or ())]))
            fresh: dict[str, LoadedModel] = {}
            changed: list[str] = []
            for name in wanted:
                spec = choose_variant(manifest, name, self.settings)
                old = current.get(name)
                if old is not None and old.spec == spec:
                    verify_file(self.models_dir, spec)  # same entry: is the file still it?
                    fresh[name] = old
                else:
                    fresh[name] = self._load(spec)
                    changed.append(name)
            for name in dict.fromkeys(check):
                if name in fresh:
                    continue
                spec = choose_variant(manifest, name, self.settings)
                verify_file(self.models_dir, spec)
                with self._lock:
                    before = choose_variant(self._current_manifest(), name, self.settings)
                if spec != before:
                    changed.append(name)
            with self._lock:
                # Models lazily loaded meanwhile from the old manifest are dropped; the
                # next get() loads them from the new one.
                self._manifest = manifest
                self._loaded = fresh
                self.generation += 1
            if changed:
                log.info("reloaded models: %s", ", ".join(changed))
            return changed
