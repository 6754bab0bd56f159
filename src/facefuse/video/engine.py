"""The video driver: a clip in, the clip back with the source identity fused in,
tracked and steady.

``VideoFuser(fuser).fuse_video(source, clip, out)`` (or ``facefuse video SOURCE
CLIP -o OUT``). Work is done once, not per frame:

* the **source** photos are decoded and analysed once, before the first frame;
* **detection** runs on the first frame, every ``detect_every`` frames, after a
  scene cut, and as soon as a track is lost; on the frames between, each face's
  mesh is refined from the previous frame's landmarks (one mesh run per face, no
  detector; the iris model every ``iris_every`` frames, the irises carried with
  the eyes between) — :mod:`facefuse.video.tracker`; a fused face's glasses,
  facial hair and iris colour are found every ``regions_every`` frames and
  carried with the face between (:mod:`facefuse.fusion.carry`);
* an IoU + embedding **tracker** keeps each person's identity, so ``one`` keeps
  fusing the same person when a second face enters, ``reference`` fuses only the
  person in the reference photo, and a mapping's ``target`` names a track (0 =
  the first person seen, 1 = the next, ...);
* the **landmarks** each frame is fused with go through a 1€ filter (steady when
  still, no lag when moving) and the rendered face's **tone** through another
  (:mod:`facefuse.video.smoothing`), both reset at a cut;
* frames are decoded, fused and encoded in threads joined by bounded queues:
  the per-frame state machine (cut test, tracking, detection, smoothing) runs in
  frame order, and each frame's faces are rendered ``threads`` frames at a time
  while the next frames are tracked, in forked child processes (``processes``,
  the default on Linux for a fork-safe swapper: :mod:`facefuse.video.processes`)
  or in threads; memory holds a window of frames, never the clip.

The renderer is whatever the :class:`~facefuse.fusion.engine.FaceFuser` has for
``options.swapper``; this module sees only its :class:`FaceLayer` s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import cv2
import numpy as np

from facefuse.errors import CancelledError, FaceError, InvalidArgumentError, MappingError
from facefuse.faces import stages
from facefuse.faces.types import Detection, Face
from facefuse.fusion import mask as masks
from facefuse.fusion.carry import Carried
from facefuse.fusion.engine import FaceFuser, blend_layer
from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.mapping import FacePair, iou, parse_mapping
from facefuse.fusion.select import check_usable, pick_source, usability_error
from facefuse.fusion.swappers.base import FaceLayer, Swapper
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import ImageInput
from facefuse.video import processes as forked
from facefuse.video.codecs import DEFAULT_ENCODER, encoder
from facefuse.video.io import (
    AudioPacket,
    Frame,
    VideoInfo,
    VideoLimits,
    VideoReader,
    VideoWriter,
    probe,
)
from facefuse.video.smoothing import ToneStabiliser
from facefuse.video.tracker import Track, Tracker, carried_eyes, detection_from_mesh

__all__ = ["ClipFusion", "FramePlan", "FrameStats", "Progress", "VideoFuser", "VideoOptions",
           "VideoReport", "frame_threads_only"]

T = TypeVar("T")

#: A tracked mesh whose face-presence falls below this is lost (detect again).
LOST_BELOW = 0.5
#: Mean absolute difference (grey levels) of two 64×36 thumbnails that is a cut.
CUT_ABOVE = 28.0
#: A detection overlapping a tracked face at least this much is that face.
SAME_FACE_IOU = 0.3
#: Largest embedding distance (unit vectors) at which a track is the reference person.
REFERENCE_DISTANCE = 0.45


def frame_threads_only() -> None:
    """Turn OpenCV's own thread pool off, for a process whose work is clips: call it
    once at the start, before other threads run (OpenCV's thread count must not
    change while another thread is in OpenCV). The ``facefuse video`` command and
    the job worker do.

    A clip renders :attr:`VideoOptions.threads` frames at once beside the tracking
    and the encoder: OpenCV's pool on top of them only oversubscribes the cores
    (720p bench clip, whole engine, eight paired runs: 126 → 116 CPU ms a frame,
    14.0 → 14.7 fps after start-up). A photo fused in such a process runs on one
    OpenCV thread too."""
    cv2.setNumThreads(1)


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
    encoder: str = DEFAULT_ENCODER
    detect_every: int = 10
    smooth: bool = True
    window: int = 8
    threads: int = 2
    iris_every: int = 2
    regions_every: int = 4
    processes: bool = True
    work_eye_px: float | None = None
    work_min_scale: float = 0.0

    def __post_init__(self) -> None:
        for name, high in (("detect_every", 300), ("window", 64), ("threads", 16),
                           ("iris_every", 10), ("regions_every", 30)):
            value = getattr(self, name)
            if not isinstance(value, int) or not 1 <= value <= high:
                raise InvalidArgumentError(f"{name} must be an integer in 1..{high}",
                                           code=f"invalid_{name}")
        eye = self.work_eye_px
        if eye is not None and not 16.0 <= eye <= 256.0:
            raise InvalidArgumentError("work_eye_px must be in 16..256 pixels",
                                       code="invalid_work_eye_px")
        if not 0.0 <= self.work_min_scale <= 1.0:
            raise InvalidArgumentError("work_min_scale must be in 0..1",
                                       code="invalid_work_min_scale")


@dataclass
class FrameStats:
    """What happened in one frame: whether the detector ran, which tracks are in
    view and which were fused, the smoothed (478, 3) mesh of each fused face, and
    the boxes (x0, y0, x1, y1) of the frame the fused faces changed."""

    detected: bool
    cut: bool
    tracks: list[int]
    fused: list[int]
    landmarks: dict[int, np.ndarray] = field(default_factory=dict)
    raw_landmarks: dict[int, np.ndarray] = field(default_factory=dict)
    regions: list[tuple[int, int, int, int]] = field(default_factory=list)


@dataclass
class VideoReport:
    """A fused clip's summary (the CLI prints it, a job stores it)."""

    frames: int = 0
    fused_frames: int = 0
    detections: int = 0
    cuts: int = 0
    tracks: int = 0
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    encoder: str = DEFAULT_ENCODER
    notes: list[str] = field(default_factory=list)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"frames": self.frames, "fused_frames": self.fused_frames,
                "detections": self.detections, "cuts": self.cuts, "tracks": self.tracks,
                "seconds": round(self.seconds, 3), "fps": round(self.fps, 2),
                "encoder": self.encoder, "clip": self.info, "notes": self.notes}


#: ``progress(frames_done, frames_expected, fps)``: called after every frame.
Progress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class _Source:
    rgb: np.ndarray
    face: Face
    #: Its key in :attr:`ClipFusion.sources` (a render in a child process names it so).
    key: int | None = None


@dataclass
class _Tone:
    """A track's tone stabiliser, reset in frame order: the tracker resets a track's
    filters while a frame is planned (:meth:`reset` counts it), and
    :meth:`ClipFusion.finish` applies that when it reaches the frame, so frames
    still being rendered before it keep the old state."""

    stabiliser: ToneStabiliser = field(default_factory=ToneStabiliser)
    resets: int = 0
    applied: int = 0

    def reset(self) -> None:
        self.resets += 1

    def __call__(self, resets: int, face: np.ndarray, mask: np.ndarray, t: float
                 ) -> np.ndarray:
        """The stabilised ``face`` of the frame planned after ``resets`` resets."""
        if resets > self.applied:
            self.stabiliser.reset()
            self.applied = resets
        return self.stabiliser(face, mask, t)


@dataclass(frozen=True)
class _Target:
    """A face to fuse in a frame: its track, its smoothed face, its source, its
    tone state with the resets counted when the frame was planned, and what the
    renderer carries over from an earlier frame of the face."""

    track: Track
    face: Face
    source: _Source
    tone: _Tone
    resets: int
    carried: Carried | None = None


#: A face to render: its source's key in :attr:`ClipFusion.sources`, the face, and
#: what the renderer carries over from an earlier frame.
RenderItem = tuple[int | None, Face, Carried | None]


@dataclass
class FramePlan:
    """One frame between :meth:`ClipFusion.plan` and :meth:`ClipFusion.finish`:
    the decoded (H, W, 3) frame ``rgb``, its time ``t`` (seconds), what happened,
    and the faces to fuse."""

    rgb: np.ndarray
    t: float
    stats: FrameStats
    targets: list[_Target]


class ClipFusion:
    """The per-frame state machine (tracker, filters, source faces) of one clip.

    Drive it with :meth:`process` on upright RGB frames in order; it does not
    touch files, so bench scripts and tests run it on arrays.
    """

    def __init__(self, fuser: FaceFuser, options: VideoOptions, sources: Sequence[ImageInput],
                 *, reference: ImageInput | None = None,
                 mapping: Sequence[FacePair | dict[str, Any]] | None = None) -> None:
        self.fuser = fuser
        self.analyser = fuser.analyser
        fo = fuser.resolve(options.fuse)  # unknown_swapper before any image is read
        self.options = dataclasses.replace(options, fuse=fo)
        # Nothing reads a frame's evaluation measures: not computed.
        self._render_options = dataclasses.replace(fo, evaluate=False)
        self.swapper: Swapper = fuser.swapper(fo.swapper)
        if not sources:
            raise InvalidArgumentError("no source image given", code="source_missing")
        self.pairs = parse_mapping(mapping) if mapping is not None else None
        decoded = [self.analyser.decode(s) for s in sources]
        faces = [self.analyser.analyse(rgb, purpose="largest" if self.pairs is None else "all")
                 for rgb in decoded]
        self.sources: dict[int | None, _Source] = {}
        self.notes: list[str] = []
        if self.pairs is None:
            source, notes = self._pick(decoded, faces)
            self.sources[None] = source
            self.notes += notes
        else:
            for p in self.pairs:
                if p.target is None:
                    raise MappingError("a clip's mapping names targets by track (0 = the "
                                       "first person seen), not by rectangle",
                                       code="mapping_invalid")
                if p.source >= len(decoded) or p.source_face >= len(faces[p.source]):
                    raise MappingError(f"mapping: source {p.source}.{p.source_face} is not "
                                       "there", code="mapping_source_out_of_range")
                face = faces[p.source][p.source_face]
                check_usable(face, "source", fo.min_face_size)
                self.sources[p.target] = _Source(decoded[p.source], face, p.target)
        self.reference: Face | None = None
        if fo.mode == "reference" and self.pairs is None:
            if reference is None:
                raise InvalidArgumentError("mode 'reference' needs a reference image",
                                           code="reference_required")
            ref = self.analyser.analyse(reference, purpose="largest")
            if not ref:
                raise FaceError("no face found in the reference image",
                                code="reference_no_face")
            self.reference = ref[0]
        every_face = fo.mode != "one" or self.pairs is not None
        self.purpose: Any = "all" if every_face else "largest"
        self.tracker = Tracker()
        #: Moves on whenever what :meth:`render_faces` reads of the clip changes (a
        #: new source or options: :meth:`render_inputs`).
        self.revision = 0
        self._thumb: np.ndarray | None = None
        self._last_detect = -(10**9)
        self.detections = 0
        self.cuts = 0

    def _pick(self, decoded: Sequence[np.ndarray], faces: Sequence[list[Face]]
              ) -> tuple[_Source, list[str]]:
        i, face, notes = pick_source(faces)
        check_usable(face, "source", self.options.fuse.min_face_size)
        return _Source(decoded[i], face), notes

    # ---- changes between frames (a live session) ------------------------------------------

    def prepare_source(self, sources: Sequence[ImageInput]) -> object:
        """Decode and analyse new source photos (of one person) for :meth:`use_source`,
        without touching the clip's state: any thread, while frames go on.

        Raises:
            FaceError, InvalidImageError: no usable face, a bad image (typed).
            InvalidArgumentError: the clip fuses by a mapping (its sources are fixed).
        """
        if self.pairs is not None:
            raise InvalidArgumentError("a clip fused by a mapping keeps its sources",
                                       code="mapping_fixed")
        if not sources:
            raise InvalidArgumentError("no source image given", code="source_missing")
        decoded = [self.analyser.decode(s) for s in sources]
        return self._pick(decoded, [self.analyser.analyse(rgb, purpose="largest")
                                    for rgb in decoded])[0]

    def use_source(self, prepared: object) -> None:
        """Fuse the source :meth:`prepare_source` made from the next planned frame on
        (in frame order, between frames): what each track carried over from the old
        source and its tone history are dropped."""
        assert isinstance(prepared, _Source)
        self.sources[None] = prepared
        self.revision += 1
        for tr in self.tracker.tracks:
            tr.carried = None
            if isinstance(tr.tone, _Tone):
                tr.tone.reset()

    def retune(self, fuse: FuseOptions) -> None:
        """Fuse with ``fuse`` from the next planned frame on (between frames; the
        swapper, the mode and the source stay: a degree, a blend or a texture
        change). Tracks, filters and sources are kept.

        Raises:
            InvalidArgumentError: another swapper or mode (those need a new clip).
        """
        old = self.options.fuse
        fuse = self.fuser.resolve(fuse)
        if (fuse.swapper, fuse.mode) != (old.swapper, old.mode):
            raise InvalidArgumentError("the swapper and the mode are fixed for a clip",
                                       code="option_fixed")
        self.options = dataclasses.replace(self.options, fuse=fuse)
        self._render_options = dataclasses.replace(fuse, evaluate=False)
        self.revision += 1

    def render_inputs(self) -> tuple[dict[int | None, object], FuseOptions]:
        """What :meth:`render_faces` reads of the clip besides its arguments: the
        sources by key and the render options. They pickle: a child process that
        renders for this clip is handed them again when :attr:`revision` moves."""
        return dict(self.sources), self._render_options

    def use_render_inputs(self, inputs: tuple[dict[int | None, object], FuseOptions]
                          ) -> None:
        """Render with another clip's :meth:`render_inputs` (in a child process that
        renders for it)."""
        sources, options = inputs
        assert all(isinstance(s, _Source) for s in sources.values())
        self.sources = {k: s for k, s in sources.items() if isinstance(s, _Source)}
        self._render_options = options

    # ---- one frame ------------------------------------------------------------------------

    def process(self, rgb: np.ndarray, index: int, t: float) -> tuple[np.ndarray, FrameStats]:
        """Fuse one upright RGB uint8 (H, W, 3) frame shown at ``t`` seconds; returns
        the fused frame (a new array; ``rgb`` unchanged) and what happened.

        The same as :meth:`finish` of :meth:`render` of :meth:`plan`, which a
        driver may split: ``plan`` and ``finish`` in frame order, ``render`` of
        several frames at once in other threads."""
        plan = self.plan(rgb, index, t)
        return self.finish(plan, self.render(plan))

    def plan(self, rgb: np.ndarray, index: int, t: float) -> FramePlan:
        """The frame's cut test, tracking and detection, and its faces to fuse with
        their smoothed meshes (in frame order: it moves the tracks on)."""
        cut = self._is_cut(rgb)
        if cut:
            self.cuts += 1
            for tr in self.tracker.tracks:
                tr.active, tr.carried = False, None
        tracked = self._track(rgb)
        lost = any(f is None for f in tracked.values())
        for tid, f in tracked.items():
            tr = self._by_id(tid)
            if f is None:
                tr.active, tr.carried = False, None
            else:
                tr.face, tr.last_seen = f, index
        due = index - self._last_detect >= self.options.detect_every
        detected = cut or lost or due or not self.tracker.active
        if detected:
            self._detect(rgb, index, cut)
        active = self.tracker.active
        plan = FramePlan(rgb, t, FrameStats(detected, cut, [tr.id for tr in active], []), [])
        fo = self.options.fuse
        if fo.degree == 0 and fo.shape in (None, 0) and fo.texture in (None, 0):
            return plan
        for tr, src in self._targets(active):
            face = self._smoothed(tr, t)
            if usability_error(face, "target", fo.min_face_size) is not None:
                continue
            if not isinstance(tr.tone, _Tone):
                tr.tone = _Tone()
            plan.targets.append(_Target(tr, face, src, tr.tone, tr.tone.resets,
                                        self._carried(tr, rgb, face, src.face, index)))
            assert face.landmarks is not None and tr.face.landmarks is not None
            plan.stats.landmarks[tr.id] = np.asarray(face.landmarks)
            plan.stats.raw_landmarks[tr.id] = np.asarray(tr.face.landmarks)
        return plan

    def render(self, plan: FramePlan) -> list[FaceLayer]:
        """The rendered layer of each of the plan's faces, over the decoded frame.
        Thread-safe: touches no state of the clip. Faces whose regions overlap are
        not rendered here (an empty list): each must be rendered over the frame its
        neighbour was already blended into, which :meth:`finish` does in order."""
        request = self.render_request(plan)
        return [] if request is None else self.render_faces(*request)

    def render_request(self, plan: FramePlan) -> tuple[np.ndarray, list[RenderItem]] | None:
        """What :meth:`render` renders, as :meth:`render_faces`' arguments (the frame
        and each face with its source's key and carried findings: they pickle, for
        a render in a child process that holds this clip's state); None when there
        is nothing to render here."""
        if not plan.targets or _overlapping(plan):
            return None
        return plan.rgb, [(x.source.key, x.face, x.carried) for x in plan.targets]

    def render_faces(self, rgb: np.ndarray, items: Sequence[RenderItem]) -> list[FaceLayer]:
        """Each face of ``items`` rendered with its source over the (H, W, 3) frame
        ``rgb`` (see :meth:`render_request`). Thread-safe."""
        out = []
        for key, face, carried in items:
            src = self.sources[key]
            out.append(self.swapper.render(src.rgb, src.face, rgb, face, self._render_options,
                                           carried))
        return out

    def finish(self, plan: FramePlan, layers: Sequence[FaceLayer]) -> tuple[np.ndarray,
                                                                             FrameStats]:
        """The fused frame (a new array) from the plan's rendered ``layers`` (or,
        when :meth:`render` left overlapping faces to it, each rendered over the
        frame as blended so far): each face's tone steadied over time, then blended
        in (in frame order)."""
        out = plan.rgb.copy()
        stats = plan.stats
        serial = len(layers) != len(plan.targets)
        for i, x in enumerate(plan.targets):
            layer = (self.swapper.render(x.source.rgb, x.source.face, out, x.face,
                                         self._render_options, x.carried)
                     if serial else layers[i])
            if self.options.smooth:
                layer = dataclasses.replace(
                    layer, face=x.tone(x.resets, layer.face, layer.mask, plan.t))
            blend_layer(out, layer, self.options.fuse.blend, self.fuser.pixels)
            stats.fused.append(x.track.id)
            stats.regions.append(layer.region)
        return out, stats

    # ---- the steps --------------------------------------------------------------------------

    def _is_cut(self, rgb: np.ndarray) -> bool:
        # Every k-th pixel first: an area resize of a full 1080p frame costs ~14 ms.
        k = max(1, min(rgb.shape[0] // 144, rgb.shape[1] // 256))
        grey = cv2.cvtColor(cv2.resize(np.ascontiguousarray(rgb[::k, ::k]), (64, 36),
                                       interpolation=cv2.INTER_AREA),
                            cv2.COLOR_RGB2GRAY).astype(np.float32)
        prev, self._thumb = self._thumb, grey
        return prev is not None and float(np.abs(grey - prev).mean()) > CUT_ABOVE

    def _carried(self, tr: Track, rgb: np.ndarray, face: Face, source: Face, index: int
                 ) -> Carried | None:
        """What the renderer reuses of the track's face in frame ``index``: found again
        once it is ``regions_every`` frames old (counted in frames, not renders: a
        face left unfused for a while is looked at again), or when the face no
        longer fits it. ``source``: the face fused into it."""
        every = self.options.regions_every
        if every <= 1:
            return None
        c = tr.carried
        assert face.landmarks is not None
        if c is None or index - tr.carried_at >= every or not c.fits(face.landmarks):
            c = self.swapper.carry(rgb, face, self._render_options, source)
            eye = self.options.work_eye_px
            if (c is not None and eye is not None
                    and eye >= self.options.work_min_scale * eye_distance(face.landmarks)):
                c = dataclasses.replace(c, work_eye_px=eye)
            tr.carried_at = index
        tr.carried = c
        return c

    def _by_id(self, tid: int) -> Track:
        return next(t for t in self.tracker.tracks if t.id == tid)

    def _track(self, rgb: np.ndarray) -> dict[int, Face | None]:
        """Each active track's face in this frame from its last mesh (None: lost)."""
        active = self.tracker.active
        if not active:
            return {}
        dets = []
        for tr in active:
            assert tr.face.landmarks is not None
            dets.append(detection_from_mesh(tr.face.landmarks, tr.calib, tr.face.score))
        fm = self.analyser.models.mesh
        every = self.options.iris_every if fm.iris is not None else 1

        def carry(i: int, mesh: np.ndarray) -> np.ndarray | None:
            tr = active[i]
            before, tr.raw_mesh = tr.raw_mesh, mesh
            lm = None
            if before is not None and tr.iris_age + 1 < every:
                assert tr.face.landmarks is not None
                lm = carried_eyes(mesh, before, tr.face.landmarks, fm.refine_eyes)
            tr.iris_age = 0 if lm is None else tr.iris_age + 1
            return lm

        faces = self.analyser.run(stages.mesh(fm, rgb, dets, carry=carry))
        out: dict[int, Face | None] = {}
        for tr, f in zip(active, faces, strict=True):
            keep = f.mesh_score is not None and f.mesh_score >= LOST_BELOW
            # The record keeps the embedding it was identified with.
            out[tr.id] = dataclasses.replace(f, embedding=tr.face.embedding) if keep else None
        return out

    def _detect(self, rgb: np.ndarray, index: int, cut: bool) -> None:
        """A detection pass: new faces start (or resume) tracks; tracked faces stay
        on their tracked mesh unless the detector finds them elsewhere."""
        self._last_detect = index
        self.detections += 1
        found = self.analyser.detect(rgb, self.purpose)
        active = self.tracker.active
        fresh: list[Detection] = []
        for d in found:
            best = max((iou(d.bbox, detection_from_mesh(tr.face.landmarks, tr.calib).bbox)
                        for tr in active if tr.face.landmarks is not None), default=0.0)
            if best < SAME_FACE_IOU:
                fresh.append(d)
        if not fresh:
            return
        faces = self.analyser.run(stages.mesh(self.analyser.models.mesh, rgb, fresh))
        faces = [f for f in faces if (f.mesh_score or 0.0) >= LOST_BELOW]
        if faces:
            faces = self.analyser.embed(rgb, stages.largest_first(faces))
        self.tracker.update(faces, index, cut=cut, keep=frozenset(tr.id for tr in active))

    def _targets(self, active: list[Track]) -> Iterator[tuple[Track, _Source]]:
        """The tracks to fuse in this frame, each with its source."""
        fo = self.options.fuse
        if self.pairs is not None:
            for tr in active:
                if tr.id in self.sources:
                    yield tr, self.sources[tr.id]
            return
        src = self.sources[None]
        if fo.mode == "many":
            for tr in active:
                yield tr, src
        elif fo.mode == "reference":
            assert self.reference is not None and self.reference.embedding is not None
            ref = np.asarray(self.reference.embedding, np.float64)
            scored = [(float(np.linalg.norm(tr.embedding - ref)), tr) for tr in active
                      if tr.embedding is not None]
            close = [x for x in scored if x[0] <= REFERENCE_DISTANCE]
            if close:
                yield min(close, key=lambda x: x[0])[1], src
        elif active:
            # One person: the first seen while in view, else the largest in view.
            first = min(self.tracker.tracks, key=lambda tr: tr.id)
            yield (first if first.active else max(active, key=lambda tr: tr.face.area)), src

    def _smoothed(self, tr: Track, t: float) -> Face:
        """The track's face with its 1€-filtered mesh (five points and chip with it)."""
        f = tr.face
        assert f.landmarks is not None
        if not self.options.smooth:
            return f
        scale = max(eye_distance(f.landmarks), 1.0)
        lm = tr.landmarks(np.asarray(f.landmarks), t, scale=scale).astype(np.float32)
        det = Detection(bbox=f.bbox, score=f.score, keypoints=f.keypoints)
        return dataclasses.replace(stages.make_face(det, lm, f.mesh_score or 1.0),
                                   embedding=f.embedding)


class VideoFuser:
    """Fuses a source identity into clips: files in, files out (see the module
    docstring). Thread-safe like the :class:`FaceFuser` it wraps; each clip has its
    own :class:`ClipFusion`."""

    def __init__(self, fuser: FaceFuser | None = None, limits: VideoLimits | None = None) -> None:
        self.fuser = fuser or FaceFuser()
        self.limits = limits or VideoLimits.from_settings(self.fuser.settings)

    def probe(self, clip: Path) -> VideoInfo:
        """The clip's header, checked against the limits (typed 400/413 errors)."""
        return probe(Path(clip), self.limits)

    def fuse_video(
        self,
        source: ImageInput | Sequence[ImageInput],
        clip: Path,
        out: Path,
        options: VideoOptions | None = None,
        *,
        reference: ImageInput | None = None,
        mapping: Sequence[FacePair | dict[str, Any]] | None = None,
        progress: Progress | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> VideoReport:
        """Fuse ``source`` (one photo, or photos of one person; with a mapping, photos
        of different people) into every frame of ``clip``; write ``out`` atomically.

        Raises:
            InvalidArgumentError: ``unknown_swapper`` (before the clip is read).
            InvalidVideoError, VideoTooLargeError: the clip (typed, before any work).
            CancelledError: ``cancelled()`` became true (no output is left).
        """
        options = options or VideoOptions()
        clip, out = Path(clip), Path(out)
        enc = encoder(options.encoder)
        self.fuser.resolve(options.fuse)  # an unknown swapper before the clip is opened
        info = self.probe(clip)
        t0 = time.perf_counter()
        sources: list[ImageInput] = (
            list(source) if isinstance(source, list | tuple) else [source]  # type: ignore[list-item]
        )
        state = ClipFusion(self.fuser, options, sources, reference=reference, mapping=mapping)
        report = VideoReport(info=info.to_dict(), encoder=enc.name, notes=list(state.notes))
        total = info.expected_frames
        # Frames planned, rendering in the pool, not yet finished (audio packets
        # wait behind the frame before them, so the file order is kept).
        pending: deque[tuple[Frame, FramePlan, Future[list[FaceLayer]]] | AudioPacket] = deque()

        def finish_oldest() -> None:
            head = pending.popleft()
            if isinstance(head, AudioPacket):
                sink.put(head)
                return
            item, plan, layers = head
            fused, stats = state.finish(plan, layers.result())
            sink.put((item, fused, stats.regions))
            report.frames += 1
            report.fused_frames += bool(stats.fused)
            if progress is not None:
                progress(report.frames, max(total, report.frames),
                         report.frames / max(time.perf_counter() - t0, 1e-6))

        with (VideoWriter(out, info, enc, clip) as writer,
              _render_pool(state, options) as submit):
            reader = _Pipe(iter(VideoReader(clip, info, self.limits)), options.window, "decode")
            sink = _Sink(writer, options.window)
            try:
                for item in reader:
                    if isinstance(item, AudioPacket):
                        pending.append(item)
                        continue
                    if cancelled is not None and cancelled():
                        raise CancelledError("the clip was cancelled")
                    plan = state.plan(item.rgb, item.index, item.time_s)
                    pending.append((item, plan, submit(plan)))
                    while sum(not isinstance(x, AudioPacket) for x in pending) > options.threads:
                        finish_oldest()
                while pending:
                    finish_oldest()
                sink.close()
            except BaseException:
                for x in pending:
                    if not isinstance(x, AudioPacket):
                        x[2].cancel()
                reader.stop()
                sink.abort()
                raise
        report.seconds = time.perf_counter() - t0
        report.detections, report.cuts = state.detections, state.cuts
        report.tracks = len(state.tracker.tracks)
        if report.fused_frames == 0:
            report.notes.append("no frame had a face that could be fused; the clip is "
                                "re-encoded unchanged")
        return report


@contextlib.contextmanager
def _render_pool(state: ClipFusion, options: VideoOptions
                 ) -> Iterator[Callable[[FramePlan], Future[list[FaceLayer]]]]:
    """``submit(plan)`` -> the future of ``state.render(plan)``, run ``options.threads``
    at a time in forked children (:attr:`VideoOptions.processes`, where the platform
    forks and the swapper's render is safe in a forked child; threads if the fork
    fails) or in threads; the pool is stopped on the way out (on an error, the
    renders not yet started are dropped)."""
    calls: forked.ForkedCalls | None = None
    if options.processes and forked.available() and state.swapper.fork_safe:
        # Out of memory or processes, or no named semaphores (no /dev/shm): threads.
        with contextlib.suppress(OSError, NotImplementedError):
            calls = forked.ForkedCalls(state.render_faces, options.threads)
    if calls is not None:
        with calls:

            def in_child(plan: FramePlan) -> Future[list[FaceLayer]]:
                request = state.render_request(plan)
                if request is None:
                    nothing: Future[list[FaceLayer]] = Future()
                    nothing.set_result([])
                    return nothing
                return calls.submit(*request)

            yield in_child
        return
    with ThreadPoolExecutor(options.threads, thread_name_prefix="render") as pool:
        yield lambda plan: pool.submit(state.render, plan)


_END = object()


def _detached(exc: BaseException) -> BaseException:
    """``exc`` to hand from a helper thread to another: without the helper's own
    frame in its traceback (it holds the helper object, which holds the error: a
    reference cycle only the garbage collector frees, with every array the frames
    below it hold, the decoded frames among them), and with the locals of the
    frames it keeps cleared (their lines stay for the log)."""
    tb = exc.__traceback__
    below = tb.tb_next if tb is not None else None
    if below is not None:
        traceback.clear_frames(below)
    return exc.with_traceback(below)


class _Pipe:
    """Runs an iterator in a thread, ``size`` items ahead; errors re-raise in the
    consumer."""

    def __init__(self, source: Iterator[Any], size: int, name: str) -> None:
        self._q: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(source,), name=name,
                                        daemon=True)
        self._thread.start()

    def _run(self, source: Iterator[Any]) -> None:
        try:
            for item in source:
                if not self._offer(item):
                    return
        except BaseException as exc:
            self._error = _detached(exc)
        self._offer(_END)

    def _offer(self, item: Any) -> bool:
        """Queue ``item`` unless the consumer stopped; False when it did."""
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._q.get()
            if item is _END:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                return
            yield item

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class _Sink:
    """Feeds the writer from a thread through a queue of ``size`` items."""

    def __init__(self, writer: VideoWriter, size: int) -> None:
        self._writer = writer
        self._q: queue.Queue[Any] = queue.Queue(maxsize=size)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="encode", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _END:
                return
            if self._error is not None:
                continue  # drain after a failure
            try:
                if isinstance(item, AudioPacket):
                    self._writer.write_audio(item)
                else:
                    self._writer.write(*item)
            except BaseException as exc:
                self._error = _detached(exc)

    def put(self, item: AudioPacket | tuple[Frame, np.ndarray,
                                            list[tuple[int, int, int, int]]]) -> None:
        if self._error is not None:
            raise self._error
        self._q.put(item)

    def close(self) -> None:
        """Wait for every queued item to be written; re-raise a writer error."""
        self._q.put(_END)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def abort(self) -> None:
        """Stop after a failure elsewhere: queued items are dropped, not written."""
        self._error = self._error or CancelledError("aborted")
        self._q.put(_END)  # the thread drains the queue, so this cannot block for long
        self._thread.join(timeout=30)


def _overlapping(plan: FramePlan) -> bool:
    """Whether two of the plan's faces have blend regions that overlap (the
    region each render covers: the face and twice its feather around it)."""
    if len(plan.targets) < 2:
        return False
    boxes = []
    for x in plan.targets:
        lm = np.asarray(x.face.landmarks, np.float64)
        boxes.append(masks.face_region(lm, plan.rgb.shape, 2 * masks.feather_px(lm)))
    return any(a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
               for i, a in enumerate(boxes) for b in boxes[i + 1:])
