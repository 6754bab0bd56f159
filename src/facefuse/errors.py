"""Typed errors with stable codes.

Every error the library raises on purpose is a :class:`FacefuseError`. Each class
carries three stable identifiers that callers can rely on across releases:

* ``code`` — a short snake_case string, used in HTTP JSON bodies
  (``{"error": {"code", "message"}}``) and in CLI error lines;
* ``http_status`` — the 4xx/5xx status the HTTP API answers with;
* ``exit_code`` — the process exit status of the ``facefuse`` CLI.

Exit codes: 2 usage, 3 bad input image, 4 face problem, 5 model or codec problem,
6 build/fetch problem, 7 service (queue/deadline) problem.
"""

from __future__ import annotations

from typing import ClassVar


class FacefuseError(Exception):
    """Base class of every deliberate facefuse error."""

    code: ClassVar[str] = "facefuse_error"
    http_status: ClassVar[int] = 500
    exit_code: ClassVar[int] = 1

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            # Instance-level refinement of the class code (e.g. which image).
            self.code = code  # type: ignore[misc]

    def to_dict(self) -> dict[str, dict[str, str]]:
        """The JSON error body: ``{"error": {"code": ..., "message": ...}}``."""
        return {"error": {"code": self.code, "message": self.message}}


# --- input images --------------------------------------------------------------------


class InvalidImageError(FacefuseError):
    """The bytes are not an image we can use."""

    code = "invalid_image"
    http_status = 400
    exit_code = 3


class EmptyImageError(InvalidImageError):
    code = "empty_image"


class UnsupportedFormatError(InvalidImageError):
    code = "unsupported_format"
    http_status = 415


class CorruptImageError(InvalidImageError):
    code = "corrupt_image"


class ImageTooLargeError(InvalidImageError):
    code = "image_too_large"
    http_status = 413


class ImageTooSmallError(InvalidImageError):
    code = "image_too_small"
    http_status = 422


# --- faces -----------------------------------------------------------------------------


class FaceError(FacefuseError):
    """A face is missing or unusable."""

    code = "face_error"
    http_status = 422
    exit_code = 4


class NoFaceError(FaceError):
    code = "no_face"


class FaceTooSmallError(FaceError):
    code = "face_too_small"


class FaceProfileError(FaceError):
    code = "face_profile"


class FaceIndexError(FaceError):
    code = "face_index_out_of_range"


# --- arguments -------------------------------------------------------------------------


class InvalidArgumentError(FacefuseError):
    """An option is out of range or of the wrong type."""

    code = "invalid_argument"
    http_status = 422
    exit_code = 2


# --- models ----------------------------------------------------------------------------


class ModelError(FacefuseError):
    """A model is missing, corrupt or cannot be loaded."""

    code = "model_error"
    http_status = 503
    exit_code = 5


class ModelMissingError(ModelError):
    code = "model_missing"


class ModelCorruptError(ModelError):
    code = "model_corrupt"


class BuildError(FacefuseError):
    """Fetching or converting pinned sources failed."""

    code = "build_failed"
    exit_code = 6


class ChecksumError(BuildError):
    code = "checksum_mismatch"


class QuantizationGateError(BuildError):
    """A quantized model failed the accuracy gate and was not registered."""

    code = "quantization_gate_failed"


# --- service ---------------------------------------------------------------------------


class OverloadedError(FacefuseError):
    """The bounded queue is full: retry later."""

    code = "overloaded"
    http_status = 503
    exit_code = 7


class DeadlineExceededError(FacefuseError):
    code = "deadline_exceeded"
    http_status = 504
    exit_code = 7


# --- HTTP access -----------------------------------------------------------------------


class UnauthorizedError(FacefuseError):
    """No API key, or one that is not valid (HTTP 401 with ``WWW-Authenticate``)."""

    code = "unauthorized"
    http_status = 401
    exit_code = 2


class ForbiddenError(FacefuseError):
    """A valid API key that may not use this route (admin routes need an admin key)."""

    code = "forbidden"
    http_status = 403
    exit_code = 2


class BodyTooLargeError(FacefuseError):
    """The request body is over the configured limit (checked before reading it all)."""

    code = "body_too_large"
    http_status = 413
    exit_code = 2


class RequestTimeoutError(FacefuseError):
    """The client sent its request (headers or body) too slowly."""

    code = "request_timeout"
    http_status = 408
    exit_code = 2


class CacheUnavailableError(FacefuseError):
    """An operation that needs the shared cache (e.g. an admin purge) cannot reach it."""

    code = "cache_unavailable"
    http_status = 503
    exit_code = 7


class BadRequestError(InvalidArgumentError):
    """The body cannot be parsed at all (malformed JSON or multipart)."""

    code = "bad_request"
    http_status = 400


class UnsupportedMediaTypeError(FacefuseError):
    """The request body is neither multipart/form-data nor JSON."""

    code = "unsupported_media_type"
    http_status = 415
    exit_code = 2


# --- face mapping and templates --------------------------------------------------------


class MappingError(InvalidArgumentError):
    """A face mapping names a face that is not there, or a target twice.

    Refined codes: ``mapping_too_many``, ``mapping_invalid``,
    ``mapping_source_out_of_range``, ``mapping_target_out_of_range``,
    ``mapping_rect_no_face``, ``mapping_duplicate_target``.
    """

    code = "invalid_mapping"


class TemplateNotFoundError(FacefuseError):
    """No template has that id."""

    code = "template_not_found"
    http_status = 404
    exit_code = 2


class TemplateDamagedError(FacefuseError):
    """A template whose stored record failed its checks (hash, format, bounds) or
    vanished from under its listing; it was set aside (quarantined) and is gone.

    Refined code: ``template_lost`` (the record is missing: evicted or wiped).
    """

    code = "template_damaged"
    http_status = 410
    exit_code = 2


class TemplateExistsError(FacefuseError):
    """The image is registered already, with another name or metadata (ids are
    content addresses: delete the template first to register it again)."""

    code = "template_exists"
    http_status = 409
    exit_code = 2


class TemplateStoreFullError(FacefuseError):
    """The template store is at its bound (count or bytes); delete one first."""

    code = "template_store_full"
    http_status = 507
    exit_code = 7


# --- video and jobs --------------------------------------------------------------------


class InvalidVideoError(FacefuseError):
    """The bytes are not a video clip we can use.

    Refined codes: ``corrupt_video`` (the container or a frame cannot be decoded),
    ``no_video_stream``, ``unsupported_container`` (the output suffix or an audio
    codec it cannot hold), ``video_not_found`` (a clip path that is not there or
    cannot be read).
    """

    code = "invalid_video"
    http_status = 400
    exit_code = 3


class VideoTooLargeError(InvalidVideoError):
    """Over a clip limit. Refined codes: ``video_too_large`` (bytes),
    ``video_too_long`` (seconds or frames), ``video_resolution_too_high``,
    ``video_fps_too_high``."""

    code = "video_too_large"
    http_status = 413


class VideoUnavailableError(FacefuseError):
    """This install has no video codecs: PyAV (and the FFmpeg it bundles) is not
    installed, as in the API image, which leaves clips to the worker image."""

    code = "video_unavailable"
    http_status = 501
    exit_code = 5


class CancelledError(FacefuseError):
    """The work was cancelled (a job deleted while it ran)."""

    code = "cancelled"
    http_status = 409
    exit_code = 7


class JobNotFoundError(FacefuseError):
    """No job has that id for this key (or it expired)."""

    code = "job_not_found"
    http_status = 404
    exit_code = 2


class JobNotFinishedError(FacefuseError):
    """The job has no result (yet): it is queued, running, failed or cancelled."""

    code = "job_not_finished"
    http_status = 409
    exit_code = 2


# --- live sessions -----------------------------------------------------------------------


class InvalidOfferError(FacefuseError):
    """An SDP offer a live session cannot take. Refined codes:
    ``offer_without_video`` (no video it sends, or for a viewer receives),
    ``unsupported_codec`` (no VP8 or H.264 video offered)."""

    code = "invalid_offer"
    http_status = 422
    exit_code = 2


class LiveSessionNotFoundError(FacefuseError):
    """No live session (or viewer, or uploaded live source) has that id for this key;
    or it ended."""

    code = "live_session_not_found"
    http_status = 404
    exit_code = 2


class LiveUnavailableError(FacefuseError):
    """This install cannot run live sessions: aiortc or PyAV is not installed (the
    API image has no PyAV; the live deployment runs the worker image)."""

    code = "live_unavailable"
    http_status = 501
    exit_code = 5


class IdempotencyConflictError(FacefuseError):
    """An ``Idempotency-Key`` used before for another request (another body: other
    files or options); the first request's job stands, this one is not queued."""

    code = "idempotency_conflict"
    http_status = 409
    exit_code = 2
