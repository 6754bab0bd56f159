"""Face tracks across frames: who is who, and where to look for them next.

A :class:`Track` is one person. Between detections its mesh is refined from
the previous frame's landmarks (MediaPipe's face-mesh tracking): a detection-like
record is built from the last mesh (:func:`detection_from_mesh`) whose ROI is
the one the detector's box gave when the track was last detected, moved and
turned with the face. A detection pass (every few frames, after a cut, or when
a track is lost) is matched to the tracks by box overlap (IoU) and identity
(embedding distance): overlap decides while the camera runs on; identity alone
after a cut or for a person coming back, so each person keeps their track id
across cuts and occlusions. On frames where the iris model does not run,
:func:`carried_eyes` moves the last frame's irises with the eyes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from facefuse.faces.landmarker import EYE_CONTOUR_INDICES, MESH_POINTS
from facefuse.faces.types import Detection, Face
from facefuse.fusion.carry import Carried
from facefuse.fusion.mapping import iou
from facefuse.video.smoothing import OneEuroFilter

__all__ = ["Track", "Tracker", "carried_eyes", "detection_from_mesh", "mesh_box"]

#: Mesh points of the image-left eye, the image-right eye, nose tip, mouth centre,
#: and the two ear-side cheek points (BlazeFace's six keypoints, in its order).
_KEYPOINTS = ((33, 133), (362, 263), (1,), (13,), (234,), (454,))
#: A track lost this many frames ago or fewer still matches on position.
RECENT_FRAMES = 2
#: Most tracks remembered (active and lost) for re-identification.
MAX_TRACKS = 32
#: The iris points of the image-left and the image-right eye (centre first).
_IRIS = (tuple(range(MESH_POINTS, MESH_POINTS + 5)),
         tuple(range(MESH_POINTS + 5, MESH_POINTS + 10)))
#: An eye whose contour moved by more than this (eye widths, its centre) since the
#: last frame is measured again by the iris model rather than carried.
CARRY_MOVE = 0.25
#: ... or whose contour changed shape by more than this (eye widths, the largest
#: point's distance from the previous contour moved along rigidly): a blink, a squint.
CARRY_SHAPE = 0.05


def mesh_box(landmarks: np.ndarray) -> np.ndarray:
    """(4,) float64 ``x0, y0, x1, y1`` of the mesh's points (first 468)."""
    pts = np.asarray(landmarks, np.float64)[:468, :2]
    return np.concatenate([pts.min(axis=0), pts.max(axis=0)])


def _keypoints(landmarks: np.ndarray) -> np.ndarray:
    lm = np.asarray(landmarks, np.float64)[:, :2]
    return np.stack([lm[list(ix)].mean(axis=0) for ix in _KEYPOINTS]).astype(np.float32)


@dataclass(frozen=True)
class BoxCalibration:
    """How a detector box sat on the mesh box when the track was last detected:
    centre offset and long side, in units of the mesh box's long side."""

    dx: float = 0.0
    dy: float = 0.0
    side: float = 0.75

    @classmethod
    def of(cls, face: Face) -> BoxCalibration:
        assert face.landmarks is not None
        m = mesh_box(face.landmarks)
        ms = max(m[2] - m[0], m[3] - m[1], 1e-6)
        b = np.asarray(face.bbox, np.float64)
        return cls(((b[0] + b[2]) - (m[0] + m[2])) / 2.0 / ms,
                   ((b[1] + b[3]) - (m[1] + m[3])) / 2.0 / ms,
                   max(b[2] - b[0], b[3] - b[1]) / ms)


def detection_from_mesh(landmarks: np.ndarray, calib: BoxCalibration,
                        score: float = 1.0) -> Detection:
    """A detection whose mesh ROI follows ``landmarks`` (478, 3) image pixels: the
    box placed on the mesh box as ``calib`` says, keypoints from the mesh."""
    m = mesh_box(landmarks)
    ms = max(m[2] - m[0], m[3] - m[1], 1e-6)
    cx = (m[0] + m[2]) / 2.0 + calib.dx * ms
    cy = (m[1] + m[3]) / 2.0 + calib.dy * ms
    half = calib.side * ms / 2.0
    box = np.array([cx - half, cy - half, cx + half, cy + half], np.float32)
    return Detection(bbox=box, score=score, keypoints=_keypoints(landmarks))


@dataclass
class Track:
    """One person across frames.

    Attributes:
        id: 0, 1, ... in order of first appearance.
        face: the last analysed face (raw mesh, not smoothed).
        calib: the detector box relative to the mesh box at the last detection.
        embedding: running mean of the unit-norm identity vectors (None: not yet).
        last_seen: index of the last frame the face was found in.
        active: found in the last frame processed.
        landmarks: the 1€ filter of the (478, 3) mesh.
        tone: per-track state a fusion driver keeps (e.g. a tone stabiliser).
    """

    id: int
    face: Face
    calib: BoxCalibration
    embedding: np.ndarray | None
    last_seen: int
    active: bool = True
    landmarks: OneEuroFilter = field(default_factory=lambda: OneEuroFilter(1.0, 0.8, 1.0))
    tone: object | None = None
    #: The mesh-box area when first seen (the "largest person" of mode ``one``).
    first_area: float = 0.0
    #: The last frame's dense (468, 3) mesh before the iris model refined its eye
    #: contours (None: not known), and the frames since the iris model last ran.
    raw_mesh: np.ndarray | None = None
    iris_age: int = 0
    #: What the renderer found on the face to reuse on the next frames (None: find
    #: it on the next), and the index of the frame it was found on.
    carried: Carried | None = None
    carried_at: int = 0

    def add_embedding(self, e: np.ndarray | None) -> None:
        if e is None:
            return
        e = np.asarray(e, np.float64)
        self.embedding = e if self.embedding is None else self.embedding * 0.8 + e * 0.2
        n = float(np.linalg.norm(self.embedding))
        if n > 0:
            self.embedding = self.embedding / n

    def reset_filters(self) -> None:
        """Forget the motion history (a cut)."""
        self.landmarks.reset()
        self.raw_mesh = None
        reset = getattr(self.tone, "reset", None)
        if callable(reset):
            reset()


@dataclass
class Tracker:
    """Matches each frame's detected faces to tracks (see the module docstring).

    Attributes:
        min_iou: least box overlap for a match on position.
        max_distance: largest embedding distance (unit vectors, Euclidean) for a
            match on identity alone (the sample photos: one person 0.24-0.31 apart,
            two people 0.58-0.63; dlib's 0.6 on raw vectors is about 0.43 here).
        position_max_distance: largest embedding distance that still lets an
            overlapping box match (a different person stepping into the same place
            does not take the track over).
    """

    min_iou: float = 0.3
    max_distance: float = 0.45
    position_max_distance: float = 0.55
    tracks: list[Track] = field(default_factory=list)
    _next: int = 0

    @property
    def active(self) -> list[Track]:
        return [t for t in self.tracks if t.active]

    def update(self, faces: list[Face], frame: int, *, cut: bool = False,
               keep: frozenset[int] = frozenset()) -> list[Track]:
        """Assign ``faces`` (meshed, embedded when available) found by a detection
        pass in ``frame`` to tracks; returns the tracks in ``faces``' order. A track
        not matched becomes inactive; a face not matched starts a new track.
        ``cut``: the frame follows a scene cut, so positions say nothing.
        ``keep``: ids of tracks already placed in this frame (neither matched nor
        deactivated)."""
        pairs: list[tuple[float, int, int]] = []
        for fi, f in enumerate(faces):
            assert f.landmarks is not None
            box = mesh_box(f.landmarks)
            for ti, t in enumerate(self.tracks):
                if t.id in keep:
                    continue
                assert t.face.landmarks is not None
                recent = t.active or frame - t.last_seen <= RECENT_FRAMES
                overlap = 0.0 if cut or not recent else iou(box, mesh_box(t.face.landmarks))
                dist = _distance(f.embedding, t.embedding)
                if overlap >= self.min_iou and (dist is None or dist <= self.position_max_distance):
                    pairs.append((1.0 - overlap, fi, ti))  # position first
                elif dist is not None and dist <= self.max_distance:
                    pairs.append((1.0 + dist, fi, ti))  # identity: after every overlap
        pairs.sort()
        taken_f: dict[int, int] = {}
        taken_t: set[int] = set()
        for _, fi, ti in pairs:
            if fi in taken_f or ti in taken_t:
                continue
            taken_f[fi] = ti
            taken_t.add(ti)
        out: list[Track] = []
        for ti, t in enumerate(self.tracks):
            if ti not in taken_t and t.id not in keep:
                t.active = False
        for fi, f in enumerate(faces):
            if fi in taken_f:
                t = self.tracks[taken_f[fi]]
                if not t.active or cut:
                    t.reset_filters()
                t.face, t.calib, t.last_seen, t.active = f, BoxCalibration.of(f), frame, True
                t.raw_mesh = None
                t.add_embedding(f.embedding)
            else:
                t = self._new(f, frame)
            out.append(t)
        return out

    def _new(self, face: Face, frame: int) -> Track:
        assert face.landmarks is not None
        b = mesh_box(face.landmarks)
        t = Track(self._next, face, BoxCalibration.of(face), None, frame,
                  first_area=float((b[2] - b[0]) * (b[3] - b[1])))
        t.add_embedding(face.embedding)
        self._next += 1
        self.tracks.append(t)
        if len(self.tracks) > MAX_TRACKS:  # forget the longest unseen
            gone = min((x for x in self.tracks if not x.active), key=lambda x: x.last_seen,
                       default=None)
            if gone is not None:
                self.tracks.remove(gone)
        return t


def _similarity(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares similarity (rotation + uniform scale ``R`` (2, 2), shift
    ``t`` (2,)) taking points ``a`` (N, 2) onto ``b`` (N, 2): ``b ≈ a @ R.T + t``."""
    ca, cb = a.mean(axis=0), b.mean(axis=0)
    da, db = a - ca, b - cb
    n = float((da**2).sum())
    if n <= 0.0:
        return np.eye(2), cb - ca
    p = float((da * db).sum()) / n
    q = float((da[:, 0] * db[:, 1] - da[:, 1] * db[:, 0]).sum()) / n
    r = np.array([[p, -q], [q, p]])
    return r, cb - ca @ r.T


def carried_eyes(mesh: np.ndarray, raw_before: np.ndarray, before: np.ndarray,
                 refined_contours: bool = True) -> np.ndarray | None:
    """This frame's (478, 3) landmarks without an iris-model run: the dense ``mesh``
    (468+, 3) with the last frame's iris points (and, with ``refined_contours``, its
    iris-refined eye contours) moved along with each eye.

    ``raw_before`` is the last frame's dense mesh before refinement and ``before`` its
    (478, 3) landmarks. Each eye's motion is the similarity that takes its contour in
    ``raw_before`` onto the one in ``mesh``. None when an eye moved more than
    :data:`CARRY_MOVE` or changed shape more than :data:`CARRY_SHAPE` (then the iris
    model should look again)."""
    now = np.asarray(mesh, np.float64)[:MESH_POINTS]
    old_raw = np.asarray(raw_before, np.float64)[:MESH_POINTS]
    old = np.asarray(before, np.float64)
    out = np.zeros((MESH_POINTS + 10, 3), np.float64)
    out[:MESH_POINTS] = now
    for contour, iris in zip(EYE_CONTOUR_INDICES, _IRIS, strict=True):
        idx = list(contour)
        a, b = old_raw[idx, :2], now[idx, :2]
        width = max(float(np.linalg.norm(b[0] - b[8])), 1.0)  # the eye's two corners
        r, t = _similarity(a, b)
        if (float(np.linalg.norm(b.mean(axis=0) - a.mean(axis=0))) > CARRY_MOVE * width
                or float(np.abs(a @ r.T + t - b).max()) > CARRY_SHAPE * width):
            return None
        ix = list(iris)
        out[ix, :2] = old[ix, :2] @ r.T + t
        out[ix, 2] = old[ix, 2] + float(now[idx, 2].mean() - old_raw[idx, 2].mean())
        if refined_contours:
            out[idx, :2] = old[idx, :2] @ r.T + t
    return out.astype(np.float32)


def _distance(a: np.ndarray | None, b: np.ndarray | None) -> float | None:
    if a is None or b is None:
        return None
    return float(np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64)))
