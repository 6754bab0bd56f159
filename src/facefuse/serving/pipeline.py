"""The asynchronous analysis and fusion pipeline behind the HTTP routes.

Per request, nothing CPU-heavy runs on the event loop:

* image work — decode (+ pixel hash), letterboxing, ROI warps, chip cuts, the
  fusion itself and encoding — runs in a bounded *CPU pool*;
* model inputs of ONE image region at a time (a detector letterbox, a mesh ROI, an
  eye ROI, a recognizer chip) are submitted to one :class:`MicroBatcher` per model,
  which stacks the inputs of concurrent requests into one model call run in the
  bounded *inference pool*. The batch function looks the model up in the registry
  at every call, so a hot reload takes effect at the next batch while running
  batches finish on the old session.

Each model has two batchers over the same pool: the batched one and a direct one
(``enabled=False``: every item alone, no queue delay) for routes configured as
latency-critical (``Settings.unbatched_routes``) or with batching switched off.

The L1 cache (:class:`~facefuse.serving.cache.ByteLRU`) holds the analysis of one
decoded image — faces with mesh, alignment and (when computed) embeddings — keyed by
the SHA-256 of its pixels plus the model versions and analysis settings. Cached
:class:`~facefuse.faces.types.Face` objects are shared and must not be mutated.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from facefuse.config import Settings
from facefuse.errors import (
    ImageTooLargeError,
    ImageTooSmallError,
    InvalidArgumentError,
    NoFaceError,
)
from facefuse.faces.analyser import FaceAnalyser, StageTimer, make_face
from facefuse.faces.detectors import detector_model, turns_to_try
from facefuse.faces.recognizer import normalize
from facefuse.faces.rotation import (
    REORIENT_BELOW,
    REORIENT_TURNS,
    rotate_image,
    turned_detection,
    unrotate_detection,
)
from facefuse.faces.types import Detection, Face
from facefuse.fusion.engine import FaceFuser, check_usable
from facefuse.fusion.quality import cosine
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import DecodeLimits, decode_image, probe_image
from facefuse.imaging.encode import content_type, encode_image
from facefuse.models.registry import ModelRegistry
from facefuse.serving.batching import BatchFn, BatchObserver, MicroBatcher
from facefuse.serving.cache import ByteLRU, analysis_key, phash, pixels_sha256

__all__ = [
    "Analysis",
    "FuseOutcome",
    "Pipeline",
    "RequestContext",
    "check_header",
    "gather_all",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Bytes charged per cached face besides its arrays, and per analysis entry.
FACE_OVERHEAD = 1024
ANALYSIS_OVERHEAD = 512


@dataclass
class RequestContext:
    """Per-request state the pipeline needs.

    Attributes:
        deadline: ``time.monotonic()`` seconds after which the request gives up (504).
        batched: use the micro-batchers (False: the direct, one-item batchers).
        timer: wall time per stage, milliseconds (summed over the request's images;
            stages of the source and target images overlap in time).
        l1: L1 lookups of this request, ``"hit"`` / ``"miss"`` per image.
    """

    deadline: float | None = None
    batched: bool = True
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
    (re-analysed on the output) to the source face's; None when not computed.
    """

    body: bytes
    content_type: str
    similarity: float | None
    faces_fused: int
    notes: tuple[str, ...] = ()


def _face_nbytes(face: Face) -> int:
    arrays = (face.bbox, face.keypoints, face.landmarks, face.landmarks5, face.chip_transform,
              face.embedding, face.embedding_raw)
    return FACE_OVERHEAD + sum(a.nbytes for a in arrays if a is not None)


def _analysis_nbytes(a: Analysis) -> int:
    return ANALYSIS_OVERHEAD + sum(_face_nbytes(f) for f in a.faces)


def check_header(data: bytes, limits: DecodeLimits) -> None:
    """Format allow-list and pixel limit from the header alone (cheap; no decoding).

    Raises the same typed errors :func:`~facefuse.imaging.decode.decode_image` would
    (empty, unsupported format, corrupt header, too large, too small), so a bomb or a
    50000×50000 header is refused before it reaches a worker thread.
    """
    info = probe_image(data)
    if info.pixels > limits.max_pixels:
        raise ImageTooLargeError(
            f"the image is {info.width}×{info.height} = {info.pixels} pixels; "
            f"the limit is {limits.max_pixels} pixels"
        )
    if min(info.width, info.height) < limits.min_side or info.pixels <= 1:
        raise ImageTooSmallError(
            f"the image is {info.width}×{info.height} pixels; each side must be at least "
            f"{limits.min_side}"
        )


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


class Pipeline:
    """Models, batchers, pools and the L1 cache of one server process.

    Args:
        settings: the serving settings (batching knobs, pool sizes, limits).
        registry: the model registry (hot reload goes through :meth:`reload`).
        metrics: batch-size / queue observer (e.g. :class:`~facefuse.serving.metrics.Metrics`).

    Build it in a worker thread (it loads the models), then :meth:`start` it on the
    event loop that will serve requests.
    """

    def __init__(
        self,
        settings: Settings,
        registry: ModelRegistry,
        *,
        metrics: BatchObserver | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.metrics = metrics
        self.limits = DecodeLimits.from_settings(settings)
        self.analyser = FaceAnalyser(settings, registry)
        self.fuser = FaceFuser(settings, self.analyser)
        self.det_name = detector_model(settings)
        self.model_names: tuple[str, ...] = tuple(
            n for n in (self.det_name, "facemesh", "iris", "dlib_resnet") if registry.has(n)
        )
        self.infer_pool: Executor = ThreadPoolExecutor(
            max(1, settings.inference_workers), thread_name_prefix="ff-infer"
        )
        self.cpu_pool: Executor = ThreadPoolExecutor(
            max(1, settings.cpu_workers), thread_name_prefix="ff-cpu"
        )
        self.l1: ByteLRU[str, Analysis] = ByteLRU(settings.l1_cache_bytes, _analysis_nbytes)
        self._batched = {n: self._batcher(n, enabled=settings.batching) for n in self.model_names}
        self._direct = {n: self._batcher(n, enabled=False) for n in self.model_names}
        self._versions = self._model_versions()
        self._reload_lock = asyncio.Lock()
        self._active = asyncio.Semaphore(max(1, settings.max_active))
        self.started = False

    # --- construction ------------------------------------------------------------------

    def _batcher(self, name: str, *, enabled: bool) -> MicroBatcher:
        s = self.settings
        return MicroBatcher(
            name,
            self._runner(name),
            executor=self.infer_pool,
            max_batch_size=s.max_batch_size,
            max_queue_delay_ms=s.max_queue_delay_ms,
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

    def _model_versions(self) -> dict[str, str]:
        loaded = self.registry.loaded()
        return {name: m.spec.sha256[:16] for name, m in sorted(loaded.items())}

    @property
    def model_versions(self) -> dict[str, str]:
        """name → sha256 prefix of every loaded model (part of every cache key)."""
        return self._versions

    def warmup(self) -> None:
        """Run each batched model once on zeros (first ORT runs are slow). Blocking."""
        for name in self.model_names:
            spec = self.registry.get(name).spec
            shape = [1 if isinstance(d, str) else int(d) for d in spec.inputs[0].shape]
            self.registry.get(name).run(np.zeros(shape, np.float32))

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
        changed = self.registry.reload(self.model_names)
        if changed:
            analyser = FaceAnalyser(self.settings, self.registry)
            fuser = FaceFuser(self.settings, analyser)
            self.analyser, self.fuser = analyser, fuser
        self._versions = self._model_versions()
        return changed

    # --- helpers -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def admit(self) -> AsyncIterator[None]:
        """Hold one of ``max_active`` pipeline slots (waits, under the caller's deadline).

        Decoded images and intermediate arrays exist only inside a slot, so memory
        grows with ``max_active``, not with the number of connected clients.
        """
        async with self._active:
            yield

    async def cpu(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the CPU pool (with the caller's context: request id)."""
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.cpu_pool, functools.partial(ctx.run, fn, *args))

    async def infer(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the inference pool (unbatched model calls)."""
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.infer_pool, functools.partial(ctx.run, fn, *args))

    def _submit(
        self, name: str, x: np.ndarray, ctx: RequestContext
    ) -> Coroutine[Any, Any, list[np.ndarray]]:
        batcher = (self._batched if ctx.batched else self._direct)[name]
        return batcher.submit(x, deadline=ctx.deadline)

    # --- decode ------------------------------------------------------------------------

    async def decode(self, data: bytes, ctx: RequestContext) -> tuple[np.ndarray, str]:
        """Encoded bytes → (RGB uint8 (H, W, 3), L1 image digest).

        The header is checked on the loop first (cheap); decoding and hashing run in
        the CPU pool.
        """
        check_header(data, self.limits)
        t = time.perf_counter()
        rgb, digest = await self.cpu(self._decode_and_digest, data)
        ctx.timer.add("decode", t)
        return rgb, digest

    def _decode_and_digest(self, data: bytes) -> tuple[np.ndarray, str]:
        rgb = decode_image(data, self.limits)
        if self.settings.l1_phash:
            # Opt-in near-duplicate matching: keys ONLY this image's analysis (the
            # size is part of it so coordinates stay valid), never a fused result.
            digest = f"phash:{phash(rgb):016x}:{rgb.shape[1]}x{rgb.shape[0]}"
        else:
            digest = pixels_sha256(rgb)
        return rgb, digest

    # --- analysis ----------------------------------------------------------------------

    def _l1_key(self, digest: str) -> str:
        s = self.settings
        options = {"detector": s.detector, "rotations": s.det_rotations,
                   "score": s.det_score_threshold, "yunet_score": s.det_yunet_score_threshold,
                   "nms": s.det_nms_iou, "tile_above": s.det_tile_above}
        return analysis_key(digest, self._versions, options)

    async def analyse(
        self, rgb: np.ndarray, digest: str, ctx: RequestContext, *, embed: bool = True
    ) -> Analysis:
        """Faces of one decoded image, largest first, through L1 and the batchers."""
        key = self._l1_key(digest)
        cached = self.l1.get(key)
        if cached is not None and (cached.embedded or not embed):
            ctx.l1.append("hit")
            return cached
        ctx.l1.append("miss")
        if cached is not None:  # geometry cached, embeddings wanted
            faces = [copy.copy(f) for f in cached.faces]
        else:
            detections = await self.detect(rgb, ctx)
            faces = await self.reorient(rgb, await self.mesh(rgb, detections, ctx), ctx)
            faces.sort(key=lambda f: -f.area)
        if embed and faces:
            await self.embed(rgb, faces, ctx)
        result = Analysis(tuple(faces), embed, int(rgb.shape[1]), int(rgb.shape[0]))
        self.l1.put(key, result)
        return result

    async def detect(self, rgb: np.ndarray, ctx: RequestContext) -> list[Detection]:
        """The detector over the whole image (and tiles of large images), batched; turned
        copies of the image are tried in turn when none is found upright."""
        t = time.perf_counter()
        detector = self.analyser.detector
        h, w = rgb.shape[:2]
        dets: list[Detection] = []
        for turns in turns_to_try(self.settings):
            image = rotate_image(rgb, turns)
            items = await self.cpu(detector.preprocess, image)
            outs = await gather_all(self._submit(self.det_name, x, ctx) for x, _ in items)
            regs = np.stack([o[0] for o in outs])
            scores = np.stack([o[1] for o in outs])
            found = detector.postprocess(regs, scores, [box for _, box in items])
            if found:
                dets = [unrotate_detection(d, turns, w, h) for d in found]
                break
        ctx.timer.add("detect", t)
        return dets

    async def mesh(
        self, rgb: np.ndarray, detections: Sequence[Detection], ctx: RequestContext,
        *, stage: str = "mesh",
    ) -> list[Face]:
        """Dense mesh (+ iris) for each detection, batched; Faces without embeddings."""
        if not detections:
            return []
        t = time.perf_counter()
        fm = self.analyser.mesh
        rois = await self.cpu(lambda: [fm.roi(rgb, d) for d in detections])
        outs = await gather_all(self._submit("facemesh", x, ctx) for x, _ in rois)
        meshes = [fm.postprocess(o[0].reshape(-1), M) for o, (_, M) in zip(outs, rois, strict=True)]
        presences = [fm.presence(o[1]) for o in outs]
        if "iris" in self.model_names and fm.iris is not None:
            eyes = await self.cpu(lambda: [fm.eye_rois(rgb, m) for m in meshes])
            flat = [x for pair in eyes for x, _ in pair]
            iris_out = await gather_all(self._submit("iris", x, ctx) for x in flat)
            full = []
            for i, m in enumerate(meshes):
                contours = np.stack([iris_out[2 * i][0].reshape(-1),
                                     iris_out[2 * i + 1][0].reshape(-1)])
                irises = np.stack([iris_out[2 * i][1].reshape(-1),
                                   iris_out[2 * i + 1][1].reshape(-1)])
                full.append(fm.refine(m, contours, irises, [M for _, M in eyes[i]]))
        else:
            full = [fm.estimate_iris(m) for m in meshes]
        faces = [
            make_face(d, lm, p) for d, lm, p in zip(detections, full, presences, strict=True)
        ]
        ctx.timer.add(stage, t)
        return faces

    async def reorient(self, rgb: np.ndarray, faces: list[Face], ctx: RequestContext) -> list[Face]:
        """Faces whose mesh presence is low meshed again in the other quarter turns of
        their ROI, keeping the best (as :meth:`FaceAnalyser.face_from_detection`)."""
        weak = [i for i, f in enumerate(faces) if (f.mesh_score or 0.0) < REORIENT_BELOW]
        if not weak:
            return faces
        turns = REORIENT_TURNS
        tries = [
            turned_detection(Detection(bbox=faces[i].bbox, score=faces[i].score,
                                       keypoints=faces[i].keypoints), k)
            for i in weak for k in turns
        ]
        found = await self.mesh(rgb, tries, ctx, stage="mesh")
        out = list(faces)
        for n, i in enumerate(weak):
            for cand in found[n * len(turns) : (n + 1) * len(turns)]:
                if (cand.mesh_score or 0.0) > (out[i].mesh_score or 0.0):
                    out[i] = dataclasses.replace(
                        cand, bbox=faces[i].bbox, keypoints=faces[i].keypoints)
        return out

    async def embed(
        self, rgb: np.ndarray, faces: list[Face], ctx: RequestContext, *, stage: str = "embed"
    ) -> None:
        """Fill ``embedding_raw`` / ``embedding`` of each face (recognizer chips, batched)."""
        t = time.perf_counter()
        analyser = self.analyser
        tensors = await self.cpu(lambda: analyser.recognizer.preprocess(analyser.chips(rgb, faces)))
        outs = await gather_all(self._submit("dlib_resnet", x, ctx) for x in tensors)
        for f, o in zip(faces, outs, strict=True):
            raw = o[0].reshape(-1).astype(np.float32)
            f.embedding_raw = raw
            f.embedding = normalize(raw)
        ctx.timer.add(stage, t)

    async def attributes(self, rgb: np.ndarray, faces: Sequence[Face]) -> list[Face]:
        """Copies of ``faces`` with age / gender (small models, unbatched)."""
        out = [copy.copy(f) for f in faces]
        await self.infer(self.analyser.add_attributes, rgb, out)
        return out

    # --- fusion ------------------------------------------------------------------------

    async def fuse(
        self,
        source: bytes,
        target: bytes,
        options: FuseOptions,
        ctx: RequestContext,
        *,
        fmt: str = "jpeg",
        quality: int = 92,
        reference: bytes | None = None,
        similarity: bool = True,
    ) -> FuseOutcome:
        """Decode, analyse (L1), select, fuse, score and encode one request."""
        blobs = [source, target] + ([reference] if reference is not None else [])
        decoded = await gather_all(self.decode(b, ctx) for b in blobs)
        (src_rgb, src_digest), (tgt_rgb, tgt_digest) = decoded[0], decoded[1]
        want_target_embed = options.mode == "reference"
        jobs = [self.analyse(src_rgb, src_digest, ctx, embed=True),
                self.analyse(tgt_rgb, tgt_digest, ctx, embed=want_target_embed)]
        if reference is not None:
            jobs.append(self.analyse(decoded[2][0], decoded[2][1], ctx, embed=True))
        analyses = await gather_all(jobs)
        fuser = self.fuser
        _, _, src_face, notes = fuser.pick_source([(src_rgb, list(analyses[0].faces))])
        check_usable(src_face, "source")
        ref_face = None
        if options.mode == "reference":
            if len(analyses) < 3:
                raise InvalidArgumentError(
                    "mode 'reference' needs a reference image", code="reference_required"
                )
            if not analyses[2].faces:
                raise NoFaceError("no face found in the reference image", code="reference_no_face")
            ref_face = analyses[2].faces[0]
        tgt_faces = list(analyses[1].faces)
        chosen = fuser.select_targets(tgt_faces, options, ref_face)
        for i in chosen:
            check_usable(tgt_faces[i], "target")
        t = time.perf_counter()
        plain = dataclasses.replace(options, evaluate=False)
        result = await self.cpu(
            fuser.fuse_faces, src_rgb, src_face, tgt_rgb, tgt_faces, chosen, plain
        )
        ctx.timer.add("fuse", t)
        sim: float | None = None
        if similarity and result.fused and result.fused[0].region[2] > result.fused[0].region[0]:
            sim = await self._similarity(result.image, src_face, result.fused[0].target_face, ctx)
        t = time.perf_counter()
        body = await self.cpu(encode_image, result.image, fmt, quality)
        ctx.timer.add("encode", t)
        return FuseOutcome(body, content_type(fmt), sim, len(result.fused),
                           tuple(notes + result.notes))

    async def _similarity(
        self, output: np.ndarray, source_face: Face, target_face: Face, ctx: RequestContext
    ) -> float | None:
        """Identity similarity of the output face (re-analysed in place) to the source."""
        if source_face.embedding is None:
            return None
        det = Detection(bbox=target_face.bbox, score=target_face.score,
                        keypoints=target_face.keypoints)
        faces = await self.mesh(output, [det], ctx, stage="evaluate")
        await self.embed(output, faces, ctx, stage="evaluate")
        if not faces or faces[0].embedding is None:
            return None
        return cosine(faces[0].embedding, source_face.embedding)
