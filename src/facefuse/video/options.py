"""How to fuse a clip: :class:`VideoOptions`, each option declared once (its
:class:`~facefuse.fusion.types.OptionSpec`), from which the HTTP job fields and the
``facefuse video`` flags are made. Light on purpose: the CLI builds its parser from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from facefuse.fusion.types import FuseOptions, check_declared, option_field
from facefuse.video.codecs import DEFAULT_ENCODER, EncoderName

__all__ = ["VideoOptions"]


@dataclass(frozen=True)
class VideoOptions:
    """How to fuse a clip.

    Attributes:
        fuse: the fusion options, as for a photo (``evaluate`` is ignored).
        encoder: ``vp9`` (default), ``av1`` or ``x264`` (see :mod:`facefuse.video.codecs`).
        detect_every: frames between detection passes while every face is tracked
            (1: detect on every frame).
        smooth: 1€ smoothing of landmarks and tone (off: each frame's raw fit).
        window: frames in flight between the decoder, the fusion and the encoder.
        threads: frames rendered at once (the renders of frame ``n`` overlap the
            tracking of frame ``n + 1``; 1: one frame at a time).
        processes: render those frames in as many forked child processes rather
            than in threads of this one (on Linux, when the swapper's render is
            safe in a forked child: the classic swapper on OpenCV's pixels; else
            threads). A render holds the GIL for about half its time: two threads
            used ~1.7 of 2 cores (the 720p bench clip without codecs: 25 → 32 fps,
            the frames bit-identical).
        iris_every: between detections, the iris model runs on a tracked face every
            this many frames (1: every frame); on the frames between, the last
            frame's irises and eye contours move with the eyes, unless an eye moved
            or changed shape (a blink) too much to carry them.
        regions_every: a fused face's glasses, facial hair and iris colour are
            found every this many frames and moved with the face between
            (:mod:`facefuse.fusion.carry`; sooner when the face turns, changes
            expression or size; 1: found on every frame, as for a photo).
        work_eye_px: the eye distance (pixels) the frames rendered with carried
            findings are rendered at when their face is larger (None: the
            swapper's own for clips); a live session renders lower (see
            :mod:`facefuse.live.loop`) —
        work_min_scale: — but only a face it would shrink to no less than this
            share of its own resolution; a larger face is rendered at the swapper's
            own (0: every face).
    """

    fuse: FuseOptions = field(default_factory=FuseOptions)
    encoder: EncoderName = option_field(
        DEFAULT_ENCODER, cli="--encoder",
        help="Video encoder: vp9 (BSD), av1 (BSD + AOMedia patent licence) or x264 (GPL).")
    detect_every: int = option_field(
        10, low=1, high=300, cli="--detect-every", metavar="N",
        help="Frames between detection passes while every face is tracked.")
    smooth: bool = option_field(True, cli="--no-smooth",
                                help="Temporal smoothing of landmarks and tone.")
    window: int = option_field(8, low=1, high=64, http=False, help="Frames in flight.")
    threads: int = option_field(2, low=1, high=16, http=False,
                                help="Frames rendered at once.")
    iris_every: int = option_field(2, low=1, high=10, http=False,
                                   help="Frames between iris passes on a tracked face.")
    regions_every: int = option_field(4, low=1, high=30, http=False,
                                      help="Frames between looks for glasses and facial hair.")
    processes: bool = option_field(True, http=False,
                                   help="Render in forked child processes, not threads.")
    work_eye_px: float | None = option_field(
        None, low=16.0, high=256.0, unit="pixels", http=False,
        help="Working eye distance of frames rendered with carried findings.")
    work_min_scale: float = option_field(
        0.0, low=0.0, high=1.0, http=False,
        help="Least share of a face's own resolution the working eye distance may keep.")

    def __post_init__(self) -> None:
        check_declared(self)
