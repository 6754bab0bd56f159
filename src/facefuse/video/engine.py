"""A clip's per-frame engine (:class:`ClipFusion`): the source identity fused into each
frame, tracked and steady; :class:`~facefuse.video.fuser.VideoFuser` drives it over a
clip's files, live sessions frame by frame. Work is done once, not per frame:

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

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import cv2
import numpy as np

from facefuse.errors import FaceError, InvalidArgumentError, MappingError
from facefuse.faces import stages
from facefuse.faces.types import Detection, Face
from facefuse.fusion import mask as masks
from facefuse.fusion.carry import Carried
from facefuse.fusion.engine import FaceFuser, blend_layer
from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.mapping import FacePair, iou, parse_mapping
from facefuse.fusion.select import check_reference, check_usable, pick_source, usability_error
from facefuse.fusion.swappers.base import FaceLayer, Swapper
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import ImageInput
from facefuse.video.options import VideoOptions
from facefuse.video.smoothing import ToneStabiliser
from facefuse.video.tracker import Track, Tracker, carried_eyes, detection_from_mesh

__all__ = ["ClipFusion", "FramePlan", "FrameStats", "VideoOptions", "frame_threads_only"]

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
        check_reference(fo.mode, reference is not None, self.pairs is not None)
        if fo.mode == "reference" and self.pairs is None:
            assert reference is not None  # check_reference
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
