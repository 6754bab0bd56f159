"""One ``Settings`` object for the whole project, read from ``FACEFUSE_*`` env.

Settings are passed down explicitly; nothing reads the environment after
:meth:`Settings.from_env` has run (the server's API keys and log level included).
Every Settings is validated when it is made (:meth:`Settings.validate`), so an
out-of-range value fails at the boundary with a typed error naming it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from facefuse.errors import InvalidArgumentError

Precision = Literal["auto", "fp32", "int8", "fp16"]


def default_home() -> Path:
    """``$FACEFUSE_HOME`` or ``~/.cache/facefuse``."""
    env = os.environ.get("FACEFUSE_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "facefuse"


#: The Settings fields that model sessions (registry, providers, threads, precision,
#: shape profiles), the detectors, the decoder limits and the pixel backend are built
#: from; the others only configure the HTTP service, outputs and templates. The one
#: list of what an analysis depends on besides the image, the models and the purpose:
#: the library shares analysers by it (:meth:`Settings.analysis_key`), the server keys
#: its analysis cache by it (:func:`facefuse.faces.detectors.analysis_options`).
ANALYSIS_FIELDS: Final = (
    "home", "models_dir", "threads", "providers", "precision", "io_binding", "pixel_backend",
    "ort_cpu_arena", "optimized_cache", "detector", "det_rotations", "det_score_threshold",
    "det_yunet_score_threshold", "det_nms_iou", "det_tile_above", "attributes", "max_pixels",
    "max_bytes", "min_side", "max_batch_size", "gpu_max_batch_size",
)


@dataclass(frozen=True)
class Settings:
    """Runtime configuration. Every field maps to ``FACEFUSE_<FIELD>`` in upper case."""

    home: Path = field(default_factory=default_home)
    #: Where manifest.json and the ONNX files live; default ``<home>/models``.
    models_dir: Path | None = None
    #: ONNX Runtime intra-op threads per session (0 = ORT decides).
    threads: int = 1
    #: Execution providers in order of preference: ``tensorrt``, ``cuda``, ``cpu``
    #: (e.g. ``FACEFUSE_PROVIDERS=tensorrt,cuda,cpu``); unavailable ones are skipped
    #: with a logged reason, shown per model in ``GET /v1/models``.
    providers: tuple[str, ...] = ("cpu",)
    #: ``auto``: FP16 variants on a GPU provider, INT8 on the CPU, when they exist.
    precision: Precision = "auto"
    #: Model batches through ORT's IO binding: ``auto`` (on for GPU sessions), ``on``, ``off``.
    io_binding: Literal["auto", "on", "off"] = "auto"
    #: Where the fusion pixel stages run: ``opencv``, ``onnx`` (ORT graphs on the
    #: session providers) or ``auto`` (``onnx`` on a GPU provider, else ``opencv``).
    pixel_backend: Literal["auto", "opencv", "onnx"] = "auto"
    #: ONNX Runtime's CPU memory arena: off (the default) returns a batch's
    #: activations after each call — measured ~35 MB less peak RSS under
    #: micro-batching for 0–8 % more detector time and none on the other models;
    #: on keeps the largest batch's activations allocated for the process's life.
    ort_cpu_arena: bool = False
    #: Directory where ORT writes optimised graphs / TensorRT engines (None: off).
    optimized_cache: Path | None = None
    #: ``auto``: the detector each purpose calls for (the largest face, or every
    #: face); a name of :data:`facefuse.faces.detectors.DETECTORS` forces that one
    #: everywhere. The names are the registry's, checked there when models are built.
    detector: str = "auto"
    #: When an image has no face upright, try it turned 90°, 270° and 180°.
    det_rotations: bool = True
    det_score_threshold: float = 0.5
    #: YuNet's minimum score (its scores run higher than BlazeFace's: at 0.8 it
    #: reports nothing on the face-free and synthetic sets of bench/detect.py).
    det_yunet_score_threshold: float = 0.8
    det_nms_iou: float = 0.3
    #: Images whose long side exceeds this are also scanned in tiles, in pixels.
    det_tile_above: int = 1280
    #: dlib's same-person threshold on the Euclidean distance of raw embeddings.
    same_person_distance: float = 0.6
    #: Run the age / gender models during analysis.
    attributes: bool = False
    #: Decoder limits.
    max_pixels: int = 40_000_000
    max_bytes: int = 10 * 1024 * 1024
    min_side: int = 16
    #: The swapper a fusion uses when the request or call names none: ``classic`` or
    #: the name of a manifest ``task: "swap"`` entry (docs/swappers.md). A name that
    #: is neither stops the fuser from being built (``unknown_swapper``), so a server
    #: or worker with a wrong default fails at start-up.
    swapper: str = "classic"

    # --- the HTTP service (facefuse serve); see docs/operations.md ------------------------
    #: L2 result cache in Redis (``redis://[:password@]host:port/db``); empty: in process.
    redis_url: str = ""
    #: Time to live of an L2 entry in Redis, seconds.
    redis_ttl_s: int = 3600
    #: Redis connect/command timeout, seconds (a cache slower than computing is useless).
    redis_timeout_s: float = 0.1
    #: ``tenant``: each API key (by label) has its own L1 and L2 entries, so a cache hit
    #: never tells one tenant what another uploaded; ``shared``: one cache for all keys
    #: (one tenant, or tenants that trust each other). Without API keys: shared.
    cache_scope: Literal["tenant", "shared"] = "tenant"
    #: L1 analysis cache bound (decoded-image analyses), bytes.
    l1_cache_bytes: int = 32 * 1024 * 1024
    #: In-process L2 result cache bound (when no Redis), bytes.
    l2_cache_bytes: int = 64 * 1024 * 1024
    #: Largest single result stored in L2, bytes.
    l2_max_item_bytes: int = 8 * 1024 * 1024
    #: Micro-batching: most items per model call, and the longest wait for company.
    #: 0: a batch starts as soon as an inference thread is free, and the items that
    #: arrive while every thread is busy form the next one (measured best on CPU:
    #: throughput is flat from 0 to 10 ms, and each ms adds ~10 ms to a lone fuse;
    #: see BENCHMARKS.md). On a GPU, 5-20 ms fills batches that cost ~one item.
    max_batch_size: int = 8
    max_queue_delay_ms: float = 0.0
    #: The same two knobs when the models run on a GPU provider (a batch costs about
    #: one item there, so a short wait that fills it pays). Not yet measured on a GPU.
    gpu_max_batch_size: int = 32
    gpu_max_queue_delay_ms: float = 5.0
    #: Items waiting per model queue; beyond it requests get 503 + Retry-After.
    max_queue_size: int = 64
    #: Switch micro-batching off for every route (batch of one, no queue delay).
    batching: bool = True
    #: Route paths (e.g. ``/v1/embed``) that run without micro-batching.
    unbatched_routes: tuple[str, ...] = ()
    #: Requests accepted at once (beyond: 503 + Retry-After).
    max_inflight: int = 64
    #: Of those, requests decoded and in the pipeline at once; the others wait their
    #: turn holding only their upload (bounds memory). Three keep two inference and
    #: two CPU workers busy on 2 cores: on a quiet host 4 instead of 8 lowered the
    #: peak RSS after 32 clients by 39-61 MB (VmHWM; anonymous 61-84 MB) at req/s
    #: within 3 % either way, and 3 instead of 4 by 18-31 MB more (anonymous ~29 MB)
    #: at req/s within 3 % (4 rounds of 8 clients: 14.17 against 14.14); 2 served
    #: 5 % fewer.
    max_active: int = 3
    #: Per-request deadline, seconds (504 when passed); clients may ask for less.
    request_timeout_s: float = 30.0
    #: Threads that run model batches, and threads for decode/warp/blend/encode.
    inference_workers: int = 2
    cpu_workers: int = 2
    #: Threads per process that run a render's source side beside its target side
    #: (0: each render in one thread). Off by default: on a quiet 2-core host two of
    #: them shortened a 1.5-MP render (wall 0.80-0.99x in four runs) for about the
    #: same CPU (0.96-1.10x), but at 4 MP one run was slower (1.14x) and under load
    #: they only add threads to cores OpenCV's own already fill.
    render_side_threads: int = 0
    #: Request body limit, bytes (checked before reading it all).
    max_body_bytes: int = 10 * 1024 * 1024
    #: Slow clients: the request line and headers must arrive within this many seconds
    #: (408 and closed otherwise); no gap between two body reads may be longer than
    #: ``body_timeout_s``; and the whole body must arrive within
    #: ``body_timeout_s + length / min_upload_rate`` seconds (408 otherwise).
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    #: Slowest accepted average upload, bytes per second (after ``body_timeout_s``).
    min_upload_rate: int = 32 * 1024
    #: Memory the process may use, MiB; 0: 90 % of the cgroup (container) limit when
    #: there is one, else 2048. Decides how many bodies and decoded pixels may be in
    #: flight at once (see docs/operations.md, limits and budgets).
    memory_budget_mb: int = 0
    #: Longest wait for memory budget before a 503 + Retry-After, seconds.
    memory_wait_s: float = 5.0
    #: With no admin key configured, admin routes are refused (403) unless this is
    #: true (local development only).
    admin_open: bool = False
    #: Allowed CORS origins (comma-separated); empty: CORS off.
    cors_origins: tuple[str, ...] = ()
    #: Seconds in-flight requests get to finish on shutdown.
    shutdown_grace_s: float = 20.0
    #: Poll the model directory this often for a hot reload, seconds (0: off).
    reload_poll_s: float = 2.0
    #: Seconds a client is told to wait (Retry-After) when overloaded.
    retry_after_s: int = 1
    #: TEST ONLY: sleep this long in every model batch (makes queues fill up).
    debug_batch_delay_ms: float = 0.0
    #: Level of the service's JSON logs: ``debug`` also logs probe and metrics requests.
    log_level: str = "info"
    #: API keys, ``[label:]token`` entries separated by commas or whitespace (format in
    #: :mod:`facefuse.serving.api_keys`); no keys at all: authentication off.
    api_keys: str = field(default="", repr=False)
    #: Keys that may also call the admin routes.
    admin_keys: str = field(default="", repr=False)

    # --- fused outputs: provenance and labels (see docs/api.md) ------------------------
    #: Write the IPTC digital source type and software agent (XMP) into every output.
    provenance: bool = True
    #: Stamp a visible label on every output (off by default: it changes the pixels).
    label: bool = False
    label_text: str = "AI-generated"
    #: ``bottom-right``, ``bottom-left``, ``top-right`` or ``top-left``.
    label_corner: LabelCorner = "bottom-right"
    #: Label text height as a fraction of the image's shorter side.
    label_scale: float = 0.035
    #: C2PA signing (needs c2pa-python): PEM certificate chain and private key files.
    c2pa_cert: Path | None = None
    c2pa_key: Path | None = None

    # --- templates (see docs/api.md) ---------------------------------------------------
    #: ``file`` (under ``templates_dir``, one replica) or ``redis`` (``templates_redis_url``,
    #: shared by replicas).
    templates_backend: Literal["file", "redis"] = "file"
    #: The Redis of the template store: templates are user data, so a Redis of their
    #: own (``maxmemory-policy noeviction``, ``appendonly yes``), never the L2 cache's.
    templates_redis_url: str = field(default="", repr=False)
    #: Where the file backend keeps templates; default ``<home>/templates``.
    templates_dir: Path | None = None
    #: Most templates stored, and most bytes (images + analyses) over all of them.
    templates_max_count: int = 200
    templates_max_bytes: int = 512 * 1024 * 1024

    # --- video and jobs (see docs/video.md) --------------------------------------------
    #: The Redis of the job queue (job records, uploads, results and Dramatiq's
    #: messages); empty: no jobs (the ``/v1/jobs`` routes do not exist). Jobs are work
    #: in progress, so a Redis that never evicts and persists (``maxmemory-policy
    #: noeviction``, ``appendonly yes``), never the L2 cache's; the template store's
    #: may serve (its keys are apart).
    jobs_redis_url: str = field(default="", repr=False)
    #: Limits of one clip (checked from the container header before decoding): bytes,
    #: seconds, the longer side in pixels, frames per second, and frames.
    video_max_bytes: int = 64 * 1024 * 1024
    video_max_duration_s: float = 300.0
    video_max_side: int = 1920
    video_max_fps: float = 60.0
    video_max_frames: int = 18_000
    #: Jobs one API key may have waiting in the queue beyond which its ``POST /v1/jobs``
    #: answers 503 ``queue_full`` + Retry-After; and the bound over every key's.
    jobs_max_queued: int = 32
    jobs_max_queued_total: int = 256
    #: How long a finished job (status and result) is kept, seconds.
    jobs_ttl_s: int = 24 * 3600
    #: Longest a clip job may work on its frames, seconds (the waits for an absent
    #: Redis not counted), then it fails ``deadline_exceeded``; also the age past
    #: which a job's temporary files are swept.
    jobs_timeout_s: int = 1800
    #: Attempts per job (a retry follows a worker killed mid-job).
    jobs_max_tries: int = 3
    #: A worker silent this long (no broker heartbeat) is dead: its job goes back on
    #: the queue for another, seconds.
    jobs_heartbeat_s: float = 30.0
    #: A worker whose memory (PSS, with any child processes) is above this after a job,
    #: MB, exits cleanly once the job is written, for its supervisor to start a fresh
    #: one (0: never).
    jobs_soft_memory_mb: int = 0

    # --- live sessions over WebRTC (see docs/live.md) ------------------------------------
    #: Live sessions one process runs at once (beyond: 503 ``live_full`` + Retry-After);
    #: each takes about one core at 640x480 (see BENCHMARKS.md).
    live_max_sessions: int = 2
    #: A session whose camera sent no frame for this long is closed, with everything
    #: it holds (a client that vanished, a connection that never came up), seconds.
    live_idle_s: float = 5.0
    #: WHEP viewers one session may have at once.
    live_max_viewers: int = 4
    #: Camera frames whose longer side is over this are fused scaled down, pixels.
    live_max_side: int = 1280
    #: Frames of one session rendered at once (2: the render of one overlaps the
    #: tracking and render of the next; more throughput on idle cores, more latency).
    live_render_threads: int = 1
    #: Render a session's frames in a child process forked for it (where the swapper
    #: is fork-safe, on Linux), out of the way of the server's interpreter lock. Off:
    #: on the 2-core benchmark host it measured no better than threads (BENCHMARKS.md).
    live_render_processes: bool = False
    #: The server side's STUN / TURN servers (``turn:turn.example.org:3478``, comma
    #: separated); also sent to clients as ``Link: <...>; rel="ice-server"`` headers.
    live_ice_servers: tuple[str, ...] = ()
    live_ice_username: str = field(default="", repr=False)
    live_ice_credential: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        self.validate()

    def analysis_key(self) -> tuple[object, ...]:
        """The values of :data:`ANALYSIS_FIELDS`: two Settings with the same key build
        the same model sessions, analyser and fuser (the library shares those)."""
        return tuple(getattr(self, name) for name in ANALYSIS_FIELDS)

    @property
    def model_dir(self) -> Path:
        """The resolved model directory."""
        return self.models_dir if self.models_dir is not None else self.home / "models"

    @property
    def template_dir(self) -> Path:
        """The resolved directory of the file template store."""
        return self.templates_dir if self.templates_dir is not None else self.home / "templates"

    @property
    def samples_dir(self) -> Path:
        return self.home / "samples"

    @property
    def downloads_dir(self) -> Path:
        return self.home / "downloads"

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read ``FACEFUSE_*`` variables; ``overrides`` win. Bad values raise
        :class:`~facefuse.errors.InvalidArgumentError` naming the variable."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            key = "FACEFUSE_" + f.name.upper()
            if key not in env or f.name in overrides:
                continue
            raw = env[key]
            try:
                values[f.name] = _parse(f.name, str(f.type), raw)
            except ValueError as exc:
                raise InvalidArgumentError(f"{key}={raw!r}: {exc}") from exc
        values.update(overrides)
        return cls(**values)

    def validate(self) -> None:
        """Raise :class:`InvalidArgumentError` on the first out-of-range value."""
        for ok, message in self._checks():
            if not ok:
                raise InvalidArgumentError(f"settings: {message}")

    def _checks(self) -> list[tuple[bool, str]]:
        """(holds, what must hold) for every constraint on the fields."""
        s = self
        return [
            (s.precision in ("auto", "fp32", "int8", "fp16"),
             f"precision must be auto|fp32|int8|fp16, not {s.precision!r}"),
            (all(p in PROVIDER_NAMES or p in PROVIDER_NAMES.values() for p in s.providers),
             f"unknown execution provider in {','.join(s.providers)}; use tensorrt, cuda or cpu"),
            (s.label_corner in LABEL_CORNERS,
             f"label_corner must be one of {'|'.join(LABEL_CORNERS)}, not {s.label_corner!r}"),
            (s.io_binding in ("auto", "on", "off"),
             f"io_binding must be auto|on|off, not {s.io_binding!r}"),
            (s.pixel_backend in ("auto", "opencv", "onnx"),
             f"pixel_backend must be auto|opencv|onnx, not {s.pixel_backend!r}"),
            (bool(s.detector), "detector must name a detector (auto, or a registered one)"),
            (0.0 < s.det_score_threshold < 1.0, "det_score_threshold must be in (0, 1)"),
            (0.0 < s.det_yunet_score_threshold < 1.0,
             "det_yunet_score_threshold must be in (0, 1)"),
            (0.0 < s.det_nms_iou < 1.0, "det_nms_iou must be in (0, 1)"),
            (s.det_tile_above >= 64, "det_tile_above must be at least 64 pixels"),
            (s.threads >= 0, "threads must be >= 0"),
            (s.max_pixels > 0 and s.max_bytes > 0, "max_pixels and max_bytes must be positive"),
            (s.min_side >= 1, "min_side must be >= 1"),
            (bool(s.swapper), "swapper must name a swapper (classic, or a swap model)"),
            (s.log_level in LOG_LEVELS, f"log_level must be one of {'|'.join(LOG_LEVELS)}"),
            (s.max_batch_size >= 1, "max_batch_size must be >= 1"),
            (s.max_queue_delay_ms >= 0, "max_queue_delay_ms must be >= 0"),
            (s.max_queue_size >= 1, "max_queue_size must be >= 1"),
            (s.gpu_max_batch_size >= 1, "gpu_max_batch_size must be >= 1"),
            (s.gpu_max_queue_delay_ms >= 0, "gpu_max_queue_delay_ms must be >= 0"),
            (s.max_inflight >= 1 and s.max_active >= 1, "max_inflight and max_active >= 1"),
            (s.request_timeout_s > 0, "request_timeout_s must be > 0"),
            (s.inference_workers >= 1 and s.cpu_workers >= 1,
             "inference_workers and cpu_workers must be >= 1"),
            (s.render_side_threads >= 0, "render_side_threads must be >= 0"),
            (s.max_body_bytes > 0, "max_body_bytes must be > 0"),
            (s.header_timeout_s > 0 and s.body_timeout_s > 0,
             "header_timeout_s and body_timeout_s must be > 0"),
            (s.min_upload_rate >= 1, "min_upload_rate must be >= 1 byte/s"),
            (s.memory_budget_mb >= 0, "memory_budget_mb must be >= 0 (0: derive)"),
            (s.memory_wait_s >= 0, "memory_wait_s must be >= 0"),
            (s.l1_cache_bytes >= 0 and s.l2_cache_bytes >= 0, "cache sizes must be >= 0"),
            (s.redis_ttl_s > 0 and s.redis_timeout_s > 0, "redis_ttl_s and redis_timeout_s > 0"),
            (s.shutdown_grace_s >= 0 and s.reload_poll_s >= 0, "grace and poll must be >= 0"),
            (s.retry_after_s >= 1, "retry_after_s must be >= 1"),
            (s.debug_batch_delay_ms >= 0, "debug_batch_delay_ms must be >= 0"),
            (0.005 <= s.label_scale <= 0.25, "label_scale must be in 0.005..0.25"),
            (0 < len(s.label_text) <= 64, "label_text must be 1..64 characters"),
            (s.cache_scope in ("tenant", "shared"),
             f"cache_scope must be tenant|shared, not {s.cache_scope!r}"),
            (s.templates_backend in ("file", "redis"),
             f"templates_backend must be file|redis, not {s.templates_backend!r}"),
            (s.templates_max_count >= 1 and s.templates_max_bytes >= 1,
             "templates_max_count and templates_max_bytes must be >= 1"),
            (not s.redis_url or s.redis_url.startswith(("redis://", "rediss://", "unix://")),
             "redis_url must start with redis://, rediss:// or unix://"),
            (s.video_max_bytes > 0 and s.video_max_duration_s > 0 and s.video_max_side >= 16
             and s.video_max_fps > 0 and s.video_max_frames >= 1,
             "video limits must be positive (video_max_side >= 16)"),
            (s.jobs_max_queued >= 1 and s.jobs_max_queued_total >= 1 and s.jobs_ttl_s >= 1
             and s.jobs_timeout_s >= 1 and s.jobs_max_tries >= 1 and s.jobs_heartbeat_s >= 1,
             "jobs_* settings must be >= 1"),
            (s.jobs_soft_memory_mb >= 0, "jobs_soft_memory_mb must be >= 0 (0: no limit)"),
            (s.live_max_sessions >= 0 and s.live_max_viewers >= 0 and s.live_idle_s > 0,
             "live_max_sessions and live_max_viewers must be >= 0, live_idle_s > 0"),
            (s.live_max_side >= 64 and 1 <= s.live_render_threads <= 8,
             "live_max_side must be >= 64 and live_render_threads in 1..8"),
            (all(u.startswith(("stun:", "turn:", "turns:")) for u in s.live_ice_servers),
             "live_ice_servers are stun:, turn: or turns: URLs"),
            (not s.templates_redis_url or s.templates_redis_url.startswith(
                ("redis://", "rediss://", "unix://")),
             "templates_redis_url must start with redis://, rediss:// or unix://"),
            (s.templates_backend != "redis" or bool(s.templates_redis_url),
             "templates_backend=redis needs templates_redis_url (a Redis of its own, with "
             "noeviction and appendonly: the L2 cache's Redis evicts)"),
            (not s.templates_redis_url or _redis_target(s.templates_redis_url)
             != _redis_target(s.redis_url),
             "templates_redis_url must not be the L2 cache's redis_url: under the cache's "
             "eviction policy templates would be evicted"),
            (not s.jobs_redis_url or s.jobs_redis_url.startswith(
                ("redis://", "rediss://", "unix://")),
             "jobs_redis_url must start with redis://, rediss:// or unix://"),
            (not s.jobs_redis_url or _redis_target(s.jobs_redis_url)
             != _redis_target(s.redis_url),
             "jobs_redis_url must not be the L2 cache's redis_url: under the cache's "
             "eviction policy queued jobs and results would be evicted"),
        ]


#: Short names accepted in ``FACEFUSE_PROVIDERS`` → ONNX Runtime provider names.
PROVIDER_NAMES: Final[Mapping[str, str]] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}

#: A corner the visible label may sit in (``FACEFUSE_LABEL_CORNER``).
LabelCorner = Literal["bottom-right", "bottom-left", "top-right", "top-left"]
LABEL_CORNERS: Final[tuple[LabelCorner, ...]] = (
    "bottom-right", "bottom-left", "top-right", "top-left")

#: Log levels the service accepts (Python's, lower case).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")

#: String fields that are keywords, so case does not matter.
_ENUM_FIELDS = frozenset({"precision", "detector", "log_level", "io_binding", "pixel_backend",
                          "templates_backend", "label_corner", "cache_scope"})


def _redis_target(url: str) -> tuple[str, int]:
    """(host, port) — or (socket path, 0) — of the Redis server a URL points at,
    passwords and database left out: ``maxmemory`` and the eviction policy are the
    server's, so another database of the cache's server is evicted just the same."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    if u.scheme == "unix":
        return (u.path, 0)
    return (u.hostname or "", u.port or 6379)


def _parse(name: str, type_name: str, raw: str) -> Any:
    if "Path" in type_name:
        return Path(raw).expanduser() if raw else None
    if "tuple" in type_name:
        return tuple(p.strip().lower() for p in raw.split(",") if p.strip())
    if type_name == "bool":
        low = raw.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off", ""):
            return False
        raise ValueError("expected a boolean")
    if type_name == "int":
        return int(raw)
    if type_name == "float":
        return float(raw)
    if name in _ENUM_FIELDS:
        return raw.strip().lower()
    return raw.strip()  # free-form (URLs with passwords, origins): verbatim
