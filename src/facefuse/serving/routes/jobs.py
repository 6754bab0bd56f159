"""Routes of long work: fusion jobs run by ``facefuse worker`` processes.

* ``POST /v1/jobs``: ``source`` (+ ``source_1`` … for a mapping, an optional
  ``reference``) and either ``clip`` (a video) or ``target`` (an image), with the
  options of ``/v1/fuse`` and the clip options below → ``202 Accepted`` with
  ``Location: /v1/jobs/{id}``. An ``Idempotency-Key`` header seen before (for the
  same API key, its job still there) answers with that job instead of a new one
  (atomic: simultaneous first requests with one key make one job), when the
  request is the same (its files and options: :func:`request_digest`); with
  another request it is ``409 idempotency_conflict``. Everything that
  can be known without decoding is checked here, with the codes ``/v1/fuse`` gives
  the same fault: the options (the swapper among this process's: the job names the
  one chosen, the default filled in), the mapping's form (:func:`request_mapping`), the
  sources numbered without gaps, every image's bytes and header (empty, not an
  image, truncated, over the limits), the clip's header and a bounded probe
  (413/400, by the worker, failing the job, where this install has no PyAV), and
  whether the output container takes the encoder and the clip's audio
  (``unsupported_container``). A key with ``jobs_max_queued`` jobs waiting, or a
  queue at ``jobs_max_queued_total``, is ``503 queue_full`` with ``Retry-After``.
* ``GET /v1/jobs/{id}``: the state (``queued``, ``running`` with frames done,
  percent, fps and ETA, ``succeeded``, ``failed`` with its typed error,
  ``cancelled``).
* ``GET /v1/jobs/{id}/result``: the fused clip or image (409
  ``job_not_finished`` before).
* ``DELETE /v1/jobs/{id}``: cancels a queued or running job (202); deletes an
  ended one and its result (204).

A key sees only its own jobs (another key's id is a 404). Jobs and results
expire after ``jobs_ttl_s``.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from facefuse.errors import (
    CacheUnavailableError,
    FacefuseError,
    InvalidArgumentError,
    JobNotFinishedError,
    VideoTooLargeError,
    VideoUnavailableError,
)
from facefuse.fusion.select import check_reference
from facefuse.imaging.decode import DecodeLimits, check_encoded
from facefuse.serving.api_keys import bearer_token
from facefuse.serving.http.inputs import read_request, validate_params
from facefuse.serving.jobs.queue import broker, enqueue
from facefuse.serving.jobs.store import FINAL, JobStore, job_options, request_digest
from facefuse.serving.routes.fuse_request import (
    SOURCE_FIELDS,
    numbered_sources,
    request_mapping,
)
from facefuse.serving.routes.requests import require_key
from facefuse.serving.routes.responses import ERRORS
from facefuse.serving.routes.schemas import ErrorBody, VideoParams, image_request_body
from facefuse.serving.state import services
from facefuse.video.codecs import ENCODERS, check_container, pyav
from facefuse.video.io import VideoInfo, VideoLimits, probe

__all__ = ["router"]

T = TypeVar("T")

#: Longest ``Idempotency-Key`` accepted, characters.
MAX_IDEMPOTENCY_KEY = 200

router = APIRouter(
    prefix="/v1", dependencies=[Depends(require_key)], tags=["jobs"],
    responses={**ERRORS,
               404: {"model": ErrorBody, "description": "No such job (or another key's)"},
               409: {"model": ErrorBody, "description": "The job has no result (yet); or an "
                     "Idempotency-Key used before for another request"}})


class JobParams(VideoParams):
    """Options of ``POST /v1/jobs``: those of ``/v1/fuse`` (``format`` and
    ``quality`` for an image job) and, for a clip, these."""

    container: Literal["mp4", "webm", "mkv", "mov"] = Field(
        "mp4", description="Output container of a clip (audio is copied: webm holds only "
        "Opus/Vorbis audio).")


class _Jobs:
    """The job store and the queue broker of one app (built on first use)."""

    def __init__(self, store: JobStore, queue: Any) -> None:
        self.store = store
        self.queue = queue


def _jobs(request: Request) -> _Jobs:
    app = request.app
    jobs: _Jobs | None = getattr(app.state, "jobs", None)
    if jobs is None:
        # Mounted only with FACEFUSE_JOBS_REDIS_URL set (see app.py).
        settings = services(request).settings
        jobs = _Jobs(JobStore(settings), broker(settings))
        app.state.jobs = jobs
    return jobs


def _owner(request: Request) -> str:
    """Who owns the jobs of this request: a digest of its API key (``open`` when
    authentication is off)."""
    if not services(request).keys.enabled:
        return "open"
    token = bearer_token(request.headers.get("authorization"))
    return hashlib.sha256(token.encode()).hexdigest()[:32]


async def _redis(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking store call off the event loop; Redis trouble is a typed 503."""
    import redis

    try:
        return await asyncio.to_thread(fn, *args)
    except redis.RedisError as exc:
        raise CacheUnavailableError(f"the job store is unreachable: {type(exc).__name__}",
                                    code="jobs_unavailable") from None


def _probe_clip(data: bytes, limits: VideoLimits) -> VideoInfo | None:
    """The clip's header, checked (typed errors; see :func:`facefuse.video.io.probe`).

    Without PyAV (the API image: FFmpeg ships in the worker image only) only the
    byte limit is checked here and the header is None, unknown: the worker checks
    the header against the same limits before it decodes a frame, and a clip over
    them fails its job with the same typed error.
    """
    if len(data) > limits.max_bytes:
        raise VideoTooLargeError(f"the clip is {len(data)} bytes; the limit is "
                                 f"{limits.max_bytes}", code="video_too_large")
    try:
        pyav()
    except VideoUnavailableError:
        return None
    with tempfile.NamedTemporaryFile(prefix="facefuse-probe-") as f:
        f.write(data)
        f.flush()
        return probe(Path(f.name), limits)


def _check_images(files: dict[str, bytes], mode: str, limits: DecodeLimits) -> None:
    """Every image the job will decode (the reference only in ``mode`` reference, as
    ``/v1/fuse``), checked as the decode checks it first (typed: ``empty_image``,
    ``unsupported_format``, ``corrupt_image``, ``image_too_large``,
    ``image_too_small``)."""
    for name, data in files.items():
        if name != "clip" and (name != "reference" or mode == "reference"):
            check_encoded(data, limits)


@router.post(
    "/jobs", summary="Queue a fusion job: a clip (or an image) fused in the background",
    status_code=202,
    openapi_extra=image_request_body(
        {"source": "The face to put in.", "clip": "The video clip (or send `target`).",
         "target": "An image to fuse, instead of a clip.",
         "reference": "For mode reference: the person to replace."},
        JobParams, ("source",)),
)
async def create_job(request: Request) -> JSONResponse:
    """``202`` with ``Location`` and the job's status body."""
    svc = services(request)
    settings = svc.settings
    jobs = _jobs(request)
    owner = _owner(request)
    idem = request.headers.get("idempotency-key")
    if idem is not None and not (0 < len(idem) <= MAX_IDEMPOTENCY_KEY and idem.isprintable()):
        raise InvalidArgumentError(f"Idempotency-Key must be 1..{MAX_IDEMPOTENCY_KEY} "
                                   "printable characters", code="invalid_idempotency_key")
    files, fields = await read_request(
        request, ("source",), (*SOURCE_FIELDS[1:], "reference", "clip", "target"))
    if ("clip" in files) == ("target" in files):
        raise InvalidArgumentError("send either a 'clip' (a video) or a 'target' (an image)",
                                   code="job_input_missing")
    kind = "clip" if "clip" in files else "image"
    params = validate_params(JobParams, fields)
    raw = params.model_dump()
    video, _, _, _ = job_options(raw, kind)  # the typed option errors now, not in the worker
    # The swapper checked against this process's and named in the job, so the worker
    # renders with the one the request meant, whatever its own default.
    raw["swapper"] = svc.require_pipeline().fuser.resolve(video.fuse).swapper
    mapping = request_mapping(params.mapping, len(numbered_sources(files)))
    check_reference(video.fuse.mode, "reference" in files, mapping is not None)
    _check_images(files, video.fuse.mode, DecodeLimits.from_settings(settings))
    frames = 1
    if kind == "clip":
        info = await asyncio.to_thread(_probe_clip, files["clip"],
                                       VideoLimits.from_settings(settings))
        check_container(f".{params.container}", ENCODERS[video.encoder],
                        info.audio_codec if info is not None else None)
        frames = info.expected_frames if info is not None else 0
    job_id, created = await _redis(jobs.store.create, owner, kind, files, raw, frames, idem,
                                   request_digest(kind, files, raw))
    if created:
        try:
            await _redis(enqueue, jobs.queue, job_id)
        except FacefuseError:
            await _redis(jobs.store.fail, job_id, "jobs_unavailable", "could not be queued")
            raise
    job = await _redis(jobs.store.get, job_id, owner)
    headers = {"Location": f"/v1/jobs/{job_id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(job.to_json(), status_code=202, headers=headers)


@router.get("/jobs/{job_id}", summary="A job's state and progress")
async def get_job(job_id: str, request: Request) -> JSONResponse:
    """The status body (404 ``job_not_found`` for an unknown, expired or another key's
    job)."""
    jobs = _jobs(request)
    job = await _redis(jobs.store.get, job_id, _owner(request))
    return JSONResponse(job.to_json())


@router.get("/jobs/{job_id}/result", summary="A finished job's fused clip or image",
            responses={200: {"description": "The fused clip or image",
                             "content": {"video/mp4": {}, "video/webm": {},
                                         "video/x-matroska": {}, "video/quicktime": {},
                                         "image/jpeg": {}, "image/png": {}, "image/webp": {}}}})
async def get_result(job_id: str, request: Request) -> Response:
    jobs = _jobs(request)
    job = await _redis(jobs.store.get, job_id, _owner(request))
    data = await _redis(jobs.store.result, job_id) if job.state == "succeeded" else None
    if data is None:
        raise JobNotFinishedError(f"job {job_id} is {job.state}; it has no result")
    return Response(data, media_type=job.result_type or "application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{job_id}"'})


@router.delete("/jobs/{job_id}", summary="Cancel a job, or delete an ended one",
               status_code=202, responses={204: {"description": "Deleted"}})
async def delete_job(job_id: str, request: Request) -> Response:
    jobs = _jobs(request)
    job = await _redis(jobs.store.get, job_id, _owner(request))
    if job.state not in FINAL and await _redis(jobs.store.cancel, job_id):
        job = await _redis(jobs.store.get, job_id, None)
        return JSONResponse(job.to_json(), status_code=202)
    await _redis(jobs.store.delete, job_id)
    return Response(status_code=204)
