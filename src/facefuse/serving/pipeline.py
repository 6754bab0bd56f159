"""The server's driver of the stages and of the fusion plan: concurrency only.

The stages (:mod:`facefuse.faces.stages`), the fusion plan — what to analyse, which
faces, what to score (:mod:`facefuse.fusion.plan`) — and the rendering
(:meth:`FaceFuser.fuse_mapped`) are the library's; this module decides where each
piece runs. Per request, nothing CPU-heavy runs on the event loop:

* decoding (+ pixel hash), each stage's first step — letterboxing, ROI warps, chip
  cuts — the steps that cut more inputs after a call (a large photo's next detector
  passes, a turned copy) and the fusion and encoding run in a bounded *CPU pool*;
  the short steps that decode a model's outputs run on the loop (see
  :meth:`Pipeline.run`);
* each model call of a stage is answered by one :class:`MicroBatcher` per model,
  which stacks the items of concurrent requests into one model run in the bounded
  *inference pool* (models without a batcher, age and gender, run there directly).
  The batch function looks the model up in the registry at every call, so a hot
  reload takes effect at the next batch while running batches finish on the old
  session.

Each model has two batchers over the same pool: the batched one and a direct one
(``enabled=False``: every item alone, no queue delay) for routes configured as
latency-critical (``Settings.unbatched_routes``) or with batching switched off.

The L1 cache (:class:`~facefuse.serving.cache.lru.ByteLRU`) holds the analysis of one
decoded image — faces with mesh, alignment and (when computed) embeddings — keyed by
the SHA-256 of its pixels plus the model versions and analysis settings. Cached
:class:`~facefuse.faces.types.Face` objects are shared; they are immutable.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from facefuse.config import Settings
from facefuse.errors import ImageTooLargeError
from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser, StageTimer
from facefuse.faces.detectors import Purpose, analysis_options
from facefuse.faces.stages import Done, FaceModels, ModelCall, Stage
from facefuse.faces.types import Face
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.mapping import FacePair
from facefuse.fusion.plan import Analyse, FuseRequest, Planned, Render, fuse_plan
from facefuse.fusion.types import FuseOptions, SkippedFace
from facefuse.imaging.decode import DecodeLimits, check_header, decode_image
from facefuse.imaging.encode import content_type
from facefuse.imaging.output import OutputPolicy
from facefuse.runtime.batch_policy import batch_policy
from facefuse.runtime.manifest import ModelSpec
from facefuse.runtime.providers import device_of
from facefuse.runtime.registry import ModelRegistry
from facefuse.runtime.warmup import warm_up
from facefuse.serving.batching import BatchFn, BatchObserver, MicroBatcher, Owner
from facefuse.serving.budget import BYTES_PER_PIXEL, MemoryBudget, budget_bytes
from facefuse.serving.cache.keys import analysis_key, sha256_hex
from facefuse.serving.cache.lru import ByteLRU

__all__ = [
    "Analysis",
    "FuseOutcome",
    "Pipeline",
    "RequestContext",
    "gather_all",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Bytes charged per cached face besides its arrays, and per analysis entry.
FACE_OVERHEAD = 1024
ANALYSIS_OVERHEAD = 512


@dataclass(eq=False)
class RequestContext(Owner):
    """Per-request state the pipeline needs; the :class:`~facefuse.serving.batching.Owner`
    of its model inputs in the batchers' queues.

    Attributes:
        deadline: ``time.monotonic()`` seconds after which the request gives up (504).
        batched: use the micro-batchers (False: the direct, one-item batchers).
        timer: wall time per stage, milliseconds (summed over the request's images;
            stages of the source and target images overlap in time).
        l1: L1 lookups of this request, ``"hit"`` / ``"miss"`` per image.
        tenant: whose caches this request reads and fills (the API key's label when
            caches are scoped per tenant; empty: shared).
        let_in: (from :class:`~facefuse.serving.batching.Owner`) some of its model
            inputs were let into a batcher's queue: it is no longer refused for a
            full queue.
    """

    deadline: float | None = None
    batched: bool = True
    tenant: str = ""
    timer: StageTimer = field(default_factory=StageTimer)
    l1: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Analysis:
    """One decoded image's faces, largest first (shared via L1: do not mutate).

    ``embedded`` tells whether the faces carry embeddings.
    """

    faces: tuple[Face, ...]
    embedded: bool
    width: int
    height: int


@dataclass(frozen=True)
class FuseOutcome:
    """An encoded fused image and what the response headers report about it.

    ``similarity``: cosine similarity of the first fused face's identity embedding
    (on the output, at the mesh it was rendered with) to the source face's; None when
    not computed.
    """

    body: bytes
    content_type: str
    similarity: float | None
    faces_fused: int
    notes: tuple[str, ...] = ()
    #: Chosen target faces that could not be fused (``many`` mode, a mapping).
    skipped: tuple[SkippedFace, ...] = ()


def _face_nbytes(face: Face) -> int:
    arrays = (face.bbox, face.keypoints, face.landmarks, face.landmarks5, face.chip_transform,
              face.embedding, face.embedding_raw)
    return FACE_OVERHEAD + sum(a.nbytes for a in arrays if a is not None)


def _analysis_nbytes(a: Analysis) -> int:
    return ANALYSIS_OVERHEAD + sum(_face_nbytes(f) for f in a.faces)


async def gather_all(aws: Iterable[Awaitable[T]]) -> list[T]:
    """Await all, in order; on the first failure cancel the rest and raise that error
    (not an ExceptionGroup)."""
    tasks: list[asyncio.Task[T]] = []
    try:
        async with asyncio.TaskGroup() as tg:
            for aw in aws:
                tasks.append(tg.create_task(_as_coro(aw)))
    except BaseExceptionGroup as group:
        raise _first_leaf(group) from None
    return [t.result() for t in tasks]


async def _as_coro(aw: Awaitable[T]) -> T:
    return await aw


def _first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        # Prefer a deliberate error over a cancellation that it caused.
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


async def _in_thread(pool: Executor, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in ``pool`` with the caller's context. If the caller is cancelled
    (its client went away), wait for the thread to finish before re-raising: a thread
    cannot be stopped, and the memory it holds must stay reserved until it ends."""
    ctx = contextvars.copy_context()
    future = asyncio.get_running_loop().run_in_executor(
        pool, functools.partial(ctx.run, fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await future
        raise


class PipelineObserver(BatchObserver, Protocol):
    """The batchers' metric hooks and the pipeline's own
    (:class:`facefuse.serving.metrics.Metrics` has them)."""

    def set_pipeline_requests(self, count: int) -> None:
        """Requests now holding or waiting for a pipeline slot."""


class Pipeline:
    """Models, batchers, pools and the L1 cache of one server process.

    Args:
        settings: the serving settings (batching knobs, pool sizes, limits).
        registry: the model registry (hot reload goes through :meth:`reload`).
        metrics: batch-size, queue and pipeline observer (e.g.
            :class:`~facefuse.serving.metrics.Metrics`).
        budget: the memory budget that decoding reserves from (default: a private one
            of the settings' whole budget).

    Build it in a worker thread (it loads the models), then :meth:`start` it on the
    event loop that will serve requests.
    """

    def __init__(
        self,
        settings: Settings,
        registry: ModelRegistry,
        *,
        metrics: PipelineObserver | None = None,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.settings = settings
        self.budget = budget or MemoryBudget(budget_bytes(settings), settings.memory_wait_s)
        self.registry = registry
        self.metrics = metrics
        self.limits = DecodeLimits.from_settings(settings)
        self.output = OutputPolicy.from_settings(settings)
        self.fuser = FaceFuser(settings, FaceAnalyser(settings, registry))
        self.model_names: tuple[str, ...] = self.models.names
        #: Those loaded with the models (the recogniser loads on its first run):
        #: readiness waits for them, warm-up runs them.
        self.startup_models: tuple[str, ...] = tuple(
            n for n in self.model_names if n in registry.loaded())
        self._deferred = self._deferred_specs()
        self._unbatched = stages.registry_runner(registry)
        self.infer_pool: Executor = ThreadPoolExecutor(
            max(1, settings.inference_workers), thread_name_prefix="ff-infer"
        )
        self.cpu_pool: Executor = ThreadPoolExecutor(
            max(1, settings.cpu_workers), thread_name_prefix="ff-cpu"
        )
        self.l1: ByteLRU[str, Analysis] = ByteLRU(settings.l1_cache_bytes, _analysis_nbytes)
        # The models are loaded by now: the policy follows where they really run.
        self.policy = batch_policy(settings, gpu=any(
            device_of(registry.get(n).provider) != "cpu" for n in self.startup_models))
        log.info("batch policy", extra={"fields": self.policy.to_dict()})
        self._batched = {n: self._batcher(n, enabled=settings.batching) for n in self.model_names}
        self._direct = {n: self._batcher(n, enabled=False) for n in self.model_names}
        self._versions = self._model_versions()
        self._reload_lock = asyncio.Lock()
        self._active = asyncio.Semaphore(max(1, settings.max_active))
        #: Requests in :meth:`admit`: holding or waiting for budget and a slot.
        self.admitted = 0
        self.started = False

    # --- construction ------------------------------------------------------------------

    def _batcher(self, name: str, *, enabled: bool) -> MicroBatcher:
        s = self.settings
        return MicroBatcher(
            name,
            self._runner(name),
            executor=self.infer_pool,
            max_batch_size=self.policy.max_batch_size,
            max_queue_delay_ms=self.policy.max_queue_delay_ms,
            max_queue_size=s.max_queue_size,
            enabled=enabled,
            # As many batches of one model at a time as there are inference threads:
            # on CPU (one ORT thread per session) a batch runs on one core, so a single
            # batch in flight would leave the other cores idle when every request is
            # at the same stage. Batches fill while all threads are busy.
            max_concurrent_batches=max(1, s.inference_workers),
            metrics=self.metrics,
        )

    def _runner(self, name: str) -> BatchFn:
        delay = self.settings.debug_batch_delay_ms / 1000.0
        registry = self.registry

        def run(batch: np.ndarray) -> list[np.ndarray]:
            if delay > 0:
                time.sleep(delay)  # test-only slow path
            return registry.get(name).run(batch)

        return run

    def _deferred_specs(self) -> dict[str, ModelSpec]:
        """The manifest entries of the models the stages run that are not loaded yet
        (read off the event loop: the registry's lock is held through a load)."""
        loaded = self.registry.loaded()
        return {n: self.registry.entry(n).spec for n in self.model_names if n not in loaded}

    def model_specs(self) -> dict[str, ModelSpec]:
        """name → manifest entry of every model the stages run, loaded or loaded on its
        first run, and of any other loaded one (age, gender), by name."""
        loaded = {n: m.spec for n, m in self.registry.loaded().items()}
        return dict(sorted({**self._deferred, **loaded}.items()))

    @property
    def deferred_bytes(self) -> int:
        """Memory to keep for the models still to load on their first run: twice their
        files' size (a session holds about its file; loading it, twice that)."""
        loaded = self.registry.loaded()
        return sum(2 * s.size for n, s in self._deferred.items() if n not in loaded)

    def _model_versions(self) -> dict[str, str]:
        """Every model the stages may run, loaded or not yet (its manifest entry)."""
        return {name: spec.sha256[:16] for name, spec in self.model_specs().items()}

    @property
    def models(self) -> FaceModels:
        """The face models the stages run over (rebuilt on reload)."""
        return self.fuser.analyser.models

    @property
    def model_versions(self) -> dict[str, str]:
        """name → sha256 prefix of every loaded model (part of every cache key)."""
        return self._versions

    def warmup(self) -> None:
        """Run each batched model on zeros at the policy's warm sizes
        (:meth:`~facefuse.runtime.batch_policy.BatchPolicy.warm_sizes`: on a GPU every
        size the batcher forms, each new shape may build kernels or a TensorRT engine;
        on the CPU batch 1). Blocking."""
        sizes = self.policy.warm_sizes(self.settings.batching)
        for name in self.startup_models:
            warm_up(self.registry.get(name), sizes)

    def start(self) -> None:
        """Start every batcher on the running event loop."""
        for b in (*self._batched.values(), *self._direct.values()):
            b.start()
        self.started = True

    @property
    def batchers(self) -> dict[str, MicroBatcher]:
        """The batched batcher of each model, by model name."""
        return dict(self._batched)

    @property
    def running(self) -> bool:
        """All batchers are running (for /readyz)."""
        return self.started and all(
            b.running for b in (*self._batched.values(), *self._direct.values())
        )

    async def drain(self, timeout: float) -> bool:
        """Stop taking items and finish queued batches (graceful shutdown)."""
        end = time.monotonic() + timeout
        ok = True
        for b in (*self._batched.values(), *self._direct.values()):
            ok = await b.drain(max(0.0, end - time.monotonic())) and ok
        return ok

    def close(self) -> None:
        """Shut the pools down (after :meth:`drain`)."""
        for pool in (self.cpu_pool, self.infer_pool):
            pool.shutdown(wait=False, cancel_futures=True)
        self.fuser.close()

    # --- hot reload --------------------------------------------------------------------

    async def reload(self) -> list[str]:
        """Reload changed models from disk (see :meth:`ModelRegistry.reload`).

        New sessions are built in a worker thread beside the old ones; on success the
        analyser and fuser are rebuilt on the new models and the cache keys change
        with the model versions. On failure the old models keep serving.
        """
        async with self._reload_lock:
            loop = asyncio.get_running_loop()
            changed = await loop.run_in_executor(None, self._reload_blocking)
            return changed

    def _reload_blocking(self) -> list[str]:
        loaded = self.registry.loaded()
        changed = self.registry.reload(
            self.startup_models, check=[n for n in self.model_names if n not in loaded])
        self._deferred = self._deferred_specs()
        if changed:
            old, self.fuser = self.fuser, FaceFuser(self.settings,
                                                    FaceAnalyser(self.settings, self.registry))
            old.close()  # renders still on it finish (their source sides inline)
        self._versions = self._model_versions()
        return changed

    # --- helpers -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def admit(self, images: Sequence[bytes] = ()) -> AsyncIterator[None]:
        """Hold memory for decoding ``images`` and one of ``max_active`` pipeline slots.

        The headers of ``images`` (every image the block will decode) are checked
        first, so a bad or over-limit image is refused before any waiting; then
        :data:`~facefuse.serving.budget.BYTES_PER_PIXEL` per pixel is reserved from
        the memory budget (a bounded wait, then 503), then a slot is taken (waits,
        under the caller's deadline). Decoded images and intermediate arrays exist
        only inside the block, so memory grows with the budget, not with the number
        of connected clients.

        Raises:
            InvalidImageError: a header is malformed or over the decoder limits.
            ImageTooLargeError: the images need more than the whole request pool.
            OverloadedError: no budget within ``memory_wait_s``.
        """
        pixels = sum(check_header(data, self.limits).pixels for data in images)
        cost = pixels * BYTES_PER_PIXEL
        if not self.budget.fits(cost):
            raise ImageTooLargeError(
                f"the images have {pixels} pixels; this server's memory budget allows "
                f"{self.budget.capacity // BYTES_PER_PIXEL} decoded pixels per request")
        self._count_admitted(1)
        try:
            async with self.budget.hold(cost, "decoding"), self._active:
                yield
        finally:
            self._count_admitted(-1)

    def _count_admitted(self, step: int) -> None:
        self.admitted += step
        if self.metrics is not None:
            self.metrics.set_pipeline_requests(self.admitted)

    async def in_cpu_pool(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the CPU pool (with the caller's context: request id)."""
        return await _in_thread(self.cpu_pool, fn, *args)

    async def in_inference_pool(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the inference pool (unbatched model calls)."""
        return await _in_thread(self.infer_pool, fn, *args)

    def _submit(
        self, name: str, xs: Sequence[np.ndarray], ctx: RequestContext
    ) -> Coroutine[Any, Any, list[list[np.ndarray]]]:
        batcher = (self._batched if ctx.batched else self._direct)[name]
        return batcher.submit_many(xs, deadline=ctx.deadline, owner=ctx)

    # --- decode ------------------------------------------------------------------------

    async def decode(self, data: bytes, ctx: RequestContext) -> tuple[np.ndarray, str]:
        """Encoded bytes → (RGB uint8 (H, W, 3), L1 image digest: SHA-256 of the bytes).

        The header is checked on the loop first (cheap); decoding and hashing run in
        the CPU pool.
        """
        check_header(data, self.limits)
        t = time.perf_counter()
        rgb, digest = await self.in_cpu_pool(self._decode_and_digest, data)
        ctx.timer.add("decode", t)
        return rgb, digest

    def _decode_and_digest(self, data: bytes) -> tuple[np.ndarray, str]:
        # Keyed by the exact file: identity values (embeddings, similarity) must never
        # be shared between two different images, however alike. The same bytes decode
        # to the same pixels, and hashing a 2 MP JPEG's ~300 KB instead of its 6 MB of
        # pixels saves ~6 ms of CPU per image.
        rgb = decode_image(data, self.limits)
        return rgb, sha256_hex(data)

    # --- driving a stage ---------------------------------------------------------------

    async def run(self, stage: Stage[T], ctx: RequestContext) -> T:
        """Drive ``stage``: its model calls through the batchers (or the inference pool
        for models without one).

        The first step — cutting model inputs out of the image (letterbox, ROI and chip
        warps) — runs in the CPU pool. The steps after a model call decode its outputs
        (anchors and NMS, projecting points, 64-px eye crops: a millisecond or two) and
        run on the event loop, as they did before the stages were shared: sent to the
        pool they would queue behind whole fusions when it is busy. A step that cuts
        more inputs (:attr:`~facefuse.faces.stages.ModelCall.then_cuts`: a large
        photo's next detector passes or a turned copy) runs in the CPU pool again, so
        the loop never stalls for seconds on a 40-megapixel upload.
        """
        step: ModelCall | Done[T] = await self.in_cpu_pool(stages.advance, stage, None)
        while isinstance(step, ModelCall):
            heavy = step.then_cuts
            outputs = await self._answer(step, ctx)
            del step  # a large photo's passes: not held while the next are cut
            step = (await self.in_cpu_pool(stages.advance, stage, outputs) if heavy
                    else stages.advance(stage, outputs))
        return step.value

    async def _answer(self, call: ModelCall, ctx: RequestContext) -> stages.Outputs:
        if call.model in self._batched:
            # All items of one call enter the queue together (bounded per request).
            return await self._submit(call.model, call.inputs, ctx)
        return await self.in_inference_pool(self._unbatched, call)

    # --- analysis ----------------------------------------------------------------------

    def _l1_key(self, digest: str, purpose: Purpose, tenant: str = "") -> str:
        options = analysis_options(self.settings, purpose)
        if tenant:  # one tenant's uploads never answer another's lookups
            options["tenant"] = tenant
        return analysis_key(digest, self._versions, options)

    async def analyse(
        self, rgb: np.ndarray, digest: str, ctx: RequestContext, *, embed: bool = True,
        purpose: Purpose = "largest",
    ) -> Analysis:
        """Faces of one decoded image, largest first, through L1 and the batchers,
        found by the detector for ``purpose`` (:func:`~facefuse.faces.detectors.detector_for`)."""
        key = self._l1_key(digest, purpose, ctx.tenant)
        cached = self.l1.get(key)
        if cached is not None and (cached.embedded or not embed):
            ctx.l1.append("hit")
            return cached
        ctx.l1.append("miss")
        models = self.models
        if cached is not None:  # geometry cached, embeddings wanted
            faces = list(cached.faces)
        else:
            t = time.perf_counter()
            detector = models.detectors[purpose]
            detections = await self.run(stages.detect(
                detector, rgb, models.turns, coarse_first=purpose == "largest"), ctx)
            t = ctx.timer.add("detect", t)
            faces = await self.run(stages.confirmed(detector, models.mesh, rgb, detections,
                                                    models.turns), ctx)
            ctx.timer.add("mesh", t)
        if embed and faces:
            t = time.perf_counter()
            faces = await self.run(stages.embed(models.recognizer, rgb, faces), ctx)
            ctx.timer.add("embed", t)
        result = Analysis(tuple(faces), embed, int(rgb.shape[1]), int(rgb.shape[0]))
        self.l1.put(key, result)
        return result

    async def attributes(
        self, rgb: np.ndarray, faces: Sequence[Face], ctx: RequestContext
    ) -> list[Face]:
        """Copies of ``faces`` with age / gender (small models, unbatched)."""
        return await self.run(stages.attributes(self.models, rgb, faces), ctx)

    # --- fusion ------------------------------------------------------------------------

    async def fuse(
        self,
        source: bytes | Sequence[bytes],
        target: bytes,
        options: FuseOptions,
        ctx: RequestContext,
        *,
        fmt: str = "jpeg",
        quality: int = 92,
        reference: bytes | None = None,
        similarity: bool = False,
        mapping: Sequence[FacePair] | None = None,
        target_analysis: Analysis | None = None,
        target_purpose: Purpose | None = None,
    ) -> FuseOutcome:
        """Decode, run the fusion plan (:func:`~facefuse.fusion.plan.fuse_plan`: the
        library's decisions) and encode one request.

        ``source``: one image, or several (face mapping: one per person). With
        ``target_analysis`` (a stored template's faces) the target is decoded but not
        analysed; ``target_purpose`` overrides the detector purpose the mode implies
        for the target's analysis. ``options.evaluate`` is ignored: the only figure a response
        carries is the similarity (when ``similarity``).
        """
        sources = [source] if isinstance(source, bytes) else list(source)
        known = target_analysis
        req = FuseRequest(
            dataclasses.replace(options, evaluate=False), len(sources),
            tuple(mapping) if mapping else None, reference=reference is not None,
            similarity=similarity, target_faces=known.faces if known is not None else None,
            target_size=(known.width, known.height) if known is not None else None,
            target_purpose=target_purpose,
            source_embedding=self.fuser.swapper(options.swapper).needs_source_embedding)
        blobs = [*sources, target]
        if req.uses_reference:
            assert reference is not None
            blobs.append(reference)
        decoded = await gather_all(self.decode(b, ctx) for b in blobs)
        planned = await self.run_plan(req, decoded, ctx)
        result = planned.result
        t = time.perf_counter()
        body = await self.in_cpu_pool(self.output.encode, result.image, fmt, quality)
        ctx.timer.add("encode", t)
        return FuseOutcome(body, content_type(fmt), planned.similarity, len(result.fused),
                           tuple(result.notes), tuple(result.skipped))

    async def run_plan(self, req: FuseRequest, decoded: Sequence[tuple[np.ndarray, str]],
                       ctx: RequestContext) -> Planned:
        """Answer the plan's steps over ``decoded`` (RGB image, L1 digest) pairs: the
        analyses of one step concurrently through L1 and the batchers, the rendering
        in the CPU pool, the scoring stages through the batchers."""
        plan = fuse_plan(req, self.models, [rgb for rgb, _ in decoded])
        answer: Any = None
        while True:
            try:
                step = plan.send(answer)
            except StopIteration as stop:
                planned: Planned = stop.value
                return planned
            t = time.perf_counter()
            if isinstance(step, Analyse):
                analyses = await gather_all(
                    self.analyse(*decoded[job.image], ctx, embed=job.embed, purpose=job.purpose)
                    for job in step.jobs)
                answer = [a.faces for a in analyses]
            elif isinstance(step, Render):
                answer = await self.in_cpu_pool(functools.partial(
                    self.fuser.fuse_mapped, step.sources_rgb, step.pairs, step.target_rgb,
                    step.target_faces, step.options, in_place=step.in_place))
                ctx.timer.add("fuse", t)
            else:
                answer = await self.run(step.stage, ctx)
                ctx.timer.add("evaluate", t)
