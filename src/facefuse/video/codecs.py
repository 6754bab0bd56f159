"""The encoders a fused clip can be written with, and the containers that hold them.

The PyAV wheel bundles its own FFmpeg (LGPL v3 build) and these encoders
(``facefuse video --list-encoders`` prints what the installed wheel has):

=========  ===============  ===================================  =====================
name       FFmpeg encoder   licence of the encoder library       containers
=========  ===============  ===================================  =====================
``vp9``    ``libvpx-vp9``   BSD-3-Clause (libvpx), royalty-free  .mp4 .mkv .webm .mov
``av1``    ``libsvtav1``    BSD-3-Clause-Clear (SVT-AV1) + the   .mp4 .mkv .webm
                            AOMedia patent licence
``x264``   ``libx264``      **GPL-2.0-or-later** (x264)          .mp4 .mkv .mov
=========  ===============  ===================================  =====================

``vp9`` is the default: its licence suits a commercial image, it is fast enough
in libvpx's real-time mode on two cores, and every browser plays VP9 in MP4.
H.264 only through x264 (the wheel has no OpenH264), so it is an explicit choice
(``--encoder x264``): whoever ships an image that encodes with it takes on the
GPL's terms. The wheel also carries libx265 (GPL), which facefuse never uses.

Audio is never re-encoded: its packets are copied into the output. WebM holds
only Opus and Vorbis audio, so a clip with AAC audio must go to .mp4, .mkv or .mov
(``unsupported_container`` otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Final, Literal

from facefuse.errors import InvalidArgumentError, InvalidVideoError, VideoUnavailableError

__all__ = ["CONTAINERS", "DEFAULT_ENCODER", "ENCODERS", "Encoder", "EncoderName", "check_container",
           "container_format", "encoder", "pyav"]


def pyav() -> ModuleType:
    """The ``av`` module (PyAV), imported on first use: the API image has none.

    Raises:
        VideoUnavailableError: PyAV is not installed (the API image leaves clips to
            the worker image, ``facefuse-worker``).
    """
    try:
        import av
    except ImportError:
        raise VideoUnavailableError(
            "this install has no video codecs (PyAV is not installed): clips are "
            "decoded and encoded by the worker image") from None
    return av


@dataclass(frozen=True)
class Encoder:
    """One way to encode the fused frames.

    Attributes:
        name: the facefuse name (``--encoder``).
        codec: the FFmpeg encoder PyAV opens.
        licence: the encoder library's licence, as docs and ``--list-encoders`` say it.
        options: encoder options (FFmpeg's ``-option value`` pairs).
        containers: output suffixes that can hold this codec.
    """

    name: str
    codec: str
    licence: str
    options: dict[str, str] = field(default_factory=dict)
    containers: tuple[str, ...] = (".mp4", ".mkv", ".mov")


#: The encoders, by facefuse name. Each is tuned for a two-core worker: real-time
#: speed presets with a constant-quality target near visually lossless for faces.
ENCODERS: Final[dict[str, Encoder]] = {
    "vp9": Encoder("vp9", "libvpx-vp9", "BSD-3-Clause",
                   {"deadline": "realtime", "cpu-used": "8", "row-mt": "1", "crf": "28",
                    "b": "0", "lag-in-frames": "0"},
                   (".mp4", ".mkv", ".webm", ".mov")),
    "av1": Encoder("av1", "libsvtav1", "BSD-3-Clause-Clear + AOMedia patent licence",
                   {"preset": "12", "crf": "32"}, (".mp4", ".mkv", ".webm")),
    "x264": Encoder("x264", "libx264", "GPL-2.0-or-later",
                    {"preset": "veryfast", "crf": "20"}, (".mp4", ".mkv", ".mov")),
}
DEFAULT_ENCODER: Final = "vp9"
#: The names of :data:`ENCODERS`, as a type (the options' declaration offers them).
EncoderName = Literal["vp9", "av1", "x264"]

#: Output suffix → FFmpeg muxer name.
CONTAINERS: Final[dict[str, str]] = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska",
                                     ".webm": "webm"}
#: Audio codecs each container can take as a copied stream (None: any).
_AUDIO_IN: Final[dict[str, frozenset[str] | None]] = {
    ".webm": frozenset({"opus", "vorbis"}),
    ".mp4": frozenset({"aac", "mp3", "opus", "flac", "alac", "ac3", "eac3"}),
    ".mov": None, ".mkv": None,
}


def encoder(name: str) -> Encoder:
    """The encoder called ``name``.

    Raises:
        InvalidArgumentError: ``unknown_encoder``, or one this PyAV wheel lacks.
        VideoUnavailableError: no PyAV at all.
    """
    av = pyav()

    enc = ENCODERS.get(name)
    if enc is None:
        raise InvalidArgumentError(
            f"unknown encoder {name!r} (have: {', '.join(ENCODERS)})", code="unknown_encoder")
    if enc.codec not in av.codecs_available:
        raise InvalidArgumentError(f"this PyAV build has no {enc.codec} encoder",
                                   code="unknown_encoder")
    return enc


def container_format(path: Path) -> str:
    """The muxer for an output path, from its suffix.

    Raises:
        InvalidVideoError: ``unsupported_container`` for another suffix.
    """
    fmt = CONTAINERS.get(path.suffix.lower())
    if fmt is None:
        raise InvalidVideoError(
            f"cannot write {path.suffix or 'a file without a suffix'!r}: use "
            f"{', '.join(CONTAINERS)}", code="unsupported_container")
    return fmt


def check_container(suffix: str, enc: Encoder, audio_codec: str | None) -> None:
    """Raise ``unsupported_container`` unless ``suffix`` holds ``enc``'s video and a
    copied ``audio_codec`` stream (None: the clip has no audio)."""
    suffix = suffix.lower()
    if suffix not in enc.containers:
        raise InvalidVideoError(f"{enc.name} video cannot go in {suffix} (use "
                                f"{', '.join(enc.containers)})", code="unsupported_container")
    allowed = _AUDIO_IN.get(suffix)
    if audio_codec is not None and allowed is not None and audio_codec not in allowed:
        raise InvalidVideoError(
            f"the clip's {audio_codec} audio is copied untouched and {suffix} cannot hold "
            f"it: write .mkv or .mov", code="unsupported_container")
