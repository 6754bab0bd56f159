"""The analysis stages, each defined once, driven by the library and the server.

A stage is a generator: it does its CPU work (letterbox, ROI warps, chip cuts,
projection back to image pixels), *yields* a :class:`ModelCall` — one model name
and the model inputs of single items — receives the outputs of each item, and in
the end *returns* its result. Nothing in a stage knows how the model is run:

* the library (:class:`~facefuse.faces.analyser.FaceAnalyser`) drives a stage
  with :func:`run_sync` and :func:`registry_runner`: all items of a call stacked
  into one session run;
* the server (``facefuse.serving.pipeline``) advances the same generator in its
  CPU pool and answers each call through one micro-batcher per model, which may
  stack the items of several requests.

Stages:

==================  =====================================================  ==========
stage               does                                                   models
==================  =====================================================  ==========
:func:`detect`      letterbox (+ tiles) → detections, best first           detector
:func:`mesh`        per detection: 468-point mesh, iris (478 points),      facemesh,
                    five points and chip transform → :class:`Face`         iris
:func:`embed`       aligned 150×150 chips → unit-norm identity vectors     dlib_resnet
:func:`embed_at`    one face whose mesh is known → its embedding           dlib_resnet
:func:`attributes`  age and gender chips → estimates                       age, gender
==================  =====================================================  ==========

Faces are immutable: stages return new :class:`Face` records
(:func:`dataclasses.replace`) and never change the ones they are given, so the
server can share them between requests through its cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

from facefuse.config import Settings
from facefuse.faces.align import dlib_chip_transform, warp_chip
from facefuse.faces.attributes import attribute_chip, read_age, read_gender
from facefuse.faces.detector_base import Candidates, Crop, Shrunk
from facefuse.faces.detectors import (
    PURPOSES,
    Detector,
    Purpose,
    detector_for,
    detectors_in_use,
    make_detector,
    turns_to_try,
)
from facefuse.faces.landmarker import FaceMesh
from facefuse.faces.recognizer import Recognizer, normalize
from facefuse.faces.rotation import (
    REORIENT_BELOW,
    REORIENT_TURNS,
    turned_detection,
    unrotate_detection,
)
from facefuse.faces.types import MESH_FIVE_POINTS, Detection, Face
from facefuse.runtime.registry import ModelEntry, ModelRegistry, gpu_requested

T = TypeVar("T")

#: Side of the dlib recognition chip, pixels, and its padding around the face.
CHIP_SIZE = 150
CHIP_PADDING = 0.25


@dataclass(frozen=True)
class ModelCall:
    """One request for model outputs.

    Attributes:
        model: the registry name of the model.
        inputs: one array per item, *without* the batch axis (e.g. (3, 192, 192)).
        then_cuts: the step that follows the answer may cut more model inputs out of
            a large image (the next passes, a turned copy: up to seconds for a
            40-megapixel photo), not only decode the outputs; a driver with an event
            loop runs it where its other heavy work goes.
    """

    model: str
    inputs: tuple[np.ndarray, ...]
    then_cuts: bool = False


#: Per item of a :class:`ModelCall`: that item's model outputs, batch axis removed.
Outputs = list[list[np.ndarray]]
#: A stage: yields model calls, is sent their outputs, returns its result.
Stage = Generator[ModelCall, Outputs, T]


@dataclass(frozen=True)
class Done(Generic[T]):
    """A finished stage's result (see :func:`advance`)."""

    value: T


class ModelRunner(Protocol):
    """Answers a :class:`ModelCall` synchronously."""

    def __call__(self, call: ModelCall) -> Outputs: ...


def advance(stage: Stage[T], outputs: Outputs | None) -> ModelCall | Done[T]:
    """Run ``stage`` up to its next model call (``outputs`` answer the previous one;
    None to start it), or to its end.

    Returns a value instead of raising :class:`StopIteration`, so the step can run
    in a thread pool and come back through a future.
    """
    try:
        return stage.send(outputs)  # type: ignore[arg-type]  # None starts a generator
    except StopIteration as stop:
        return Done(stop.value)


def run_sync(stage: Stage[T], runner: ModelRunner) -> T:
    """Drive ``stage`` to its end, answering every model call with ``runner``; a call
    is let go once answered (its inputs may be a large photo's passes)."""
    step = advance(stage, None)
    while isinstance(step, ModelCall):
        outputs = runner(step)
        del step
        step = advance(stage, outputs)
    return step.value


def split_rows(outputs: Sequence[np.ndarray], n: int) -> Outputs:
    """Batched model outputs (each with leading axis ``n``) → per-item rows."""
    return [[np.array(o[i], copy=True) for o in outputs] for i in range(n)]


def registry_runner(registry: ModelRegistry) -> ModelRunner:
    """A runner that stacks all items of a call into one session run."""

    def run(call: ModelCall) -> Outputs:
        if not call.inputs:
            return []
        batch = np.ascontiguousarray(np.stack(call.inputs), dtype=np.float32)
        return split_rows(registry.get(call.model).run(batch), len(call.inputs))

    return run


# --- the models the stages run over ------------------------------------------------------


def registry_name(model: ModelEntry) -> str:
    """The name a model is asked for in the registry: a precision variant
    (``dlib_resnet.int8``) answers for its base (``dlib_resnet``)."""
    return model.spec.base or model.spec.name


@dataclass(frozen=True)
class FaceModels:
    """The detectors, mesh and recognizer that the stages run over.

    The wrappers hold the models only to read their specs (names, input sizes);
    model runs go through the driver's runner.
    """

    #: The detector of each :data:`~facefuse.faces.detectors.Purpose` (one object
    #: for both when a single detector is forced).
    detectors: Mapping[Purpose, Detector]
    mesh: FaceMesh
    recognizer: Recognizer
    #: Age and gender: loaded on their first run (only attribute requests run them).
    age: ModelEntry | None = None
    gender: ModelEntry | None = None
    #: Quarter turns of the image the detect stage tries, in order, until one has faces.
    turns: tuple[int, ...] = (0,)

    @classmethod
    def from_registry(cls, settings: Settings, registry: ModelRegistry) -> FaceModels:
        """The models ``settings`` choose, loaded (and verified) through ``registry``.
        Every detector in use is loaded now: YuNet's session adds 0.1 MB of RSS when
        loaded after the others (13 MB in a fresh process, BENCHMARKS.md
        "detector_policy"), and its activations come with its first every-face request
        whether it is loaded early or late: a lazy load would save little and cost that
        request the session build. The recogniser, age and gender are only chosen here
        (:meth:`ModelRegistry.entry`) and load on their first run: a fusion runs none of
        them by default (its similarity is off), and their sessions are ~22 MB (the
        FP32 recogniser) and ~16 MB of RSS that a server never asked for embeddings or
        attributes never loads."""
        iris = registry.get("iris") if registry.has("iris") else None
        built = {name: make_detector(settings, registry, name)
                 for name in detectors_in_use(settings)}
        return cls(
            detectors={p: built[detector_for(settings, p)] for p in PURPOSES},
            mesh=FaceMesh(registry.get("facemesh"), iris),
            # (On a GPU it loads now: its first run there may build an engine.)
            recognizer=Recognizer(registry.get("dlib_resnet") if gpu_requested(settings)
                                  else registry.entry("dlib_resnet")),
            age=registry.entry("age") if registry.has("age") else None,
            gender=registry.entry("gender") if registry.has("gender") else None,
            turns=turns_to_try(settings),
        )

    @property
    def detector(self) -> Detector:
        """The largest-face detector (the one a single-face caller runs)."""
        return self.detectors["largest"]

    @property
    def names(self) -> tuple[str, ...]:
        """Registry names of the detectors, mesh, iris and recognizer models."""
        iris = self.mesh.iris
        detectors = [d.model for d in self.detectors.values()]
        return tuple(dict.fromkeys(
            registry_name(m)
            for m in (*detectors, self.mesh.mesh, iris, self.recognizer.model)
            if m is not None
        ))


# --- the stages ------------------------------------------------------------------------


def make_face(det: Detection, landmarks: np.ndarray, presence: float) -> Face:
    """The Face record of one meshed detection: (478, 3) landmarks → five points
    and the dlib chip transform; no embedding yet."""
    return Face(
        bbox=det.bbox.astype(np.float32),
        score=float(det.score),
        keypoints=det.keypoints.astype(np.float32),
        landmarks=landmarks.astype(np.float32),
        landmarks5=landmarks[list(MESH_FIVE_POINTS), :2].astype(np.float32),
        chip_transform=dlib_chip_transform(landmarks, size=CHIP_SIZE, padding=CHIP_PADDING),
        mesh_score=float(presence),
    )


def _stacked(outputs: Outputs) -> list[np.ndarray]:
    """Per-item rows → one array per model output, items along the first axis."""
    return [np.stack([row[k] for row in outputs]) for k in range(len(outputs[0]))]


#: ``coarse_first``: a largest face at least this fraction of the image's long side
#: is taken from the whole-image pass alone; a smaller one (under ~40 px of
#: BlazeFace's 192-px input) has its box refined by the tiles that hold it.
COARSE_ENOUGH = 0.2

#: Images of more pixels than this make the step after every detector call a heavy
#: one (:attr:`ModelCall.then_cuts`): what may follow the last, a turned copy or a
#: set of tiles, takes over ~10 ms there. (Within any image, the step after a call
#: that more chunks follow cuts the next one: heavy too.)
HEAVY_CUT_PIXELS = 4_000_000


def detect(
    detector: Detector, rgb: np.ndarray, turns: Sequence[int] = (0,), *,
    coarse_first: bool = False,
) -> Stage[list[Detection]]:
    """All faces of an RGB uint8 (H, W, 3) image, best score first.

    ``turns``: quarter turns of the image to try in order (see
    :mod:`facefuse.faces.rotation`); the first that finds any face wins, and its
    detections are mapped back to ``rgb``'s pixels.

    ``coarse_first``: for callers that use only the largest face. The whole-image
    pass runs alone first; the tiles of a large image (which exist to find faces
    too small for that pass) run only when it finds no face of at least
    :data:`COARSE_ENOUGH` of the long side, and then only those that hold the
    largest face it found (every tile when it found none), and all passes are
    merged as without ``coarse_first``: for that face the result is in practice the
    one every tile gives (a tile holding it in part drops it as cut). A 1–2 MP portrait
    costs one or two detector passes instead of three; the faces found are then
    those of the passes run only, so the result is cached apart from an every-face
    analysis.
    """
    for k in turns:
        found = yield from _detect_turn(detector, rgb, k, coarse_first)
        if found:
            return found
    return []


def _detect_turn(detector: Detector, rgb: np.ndarray, k: int,
                 coarse_first: bool) -> Stage[list[Detection]]:
    """:func:`detect` for the one quarter turn ``k``, in ``rgb``'s pixels."""
    h, w = rgb.shape[:2]
    # Once, for the whole image's pass and any tile's; only the shrunk copy is turned.
    shrunk = detector.shrunk(rgb, k)
    crops = detector.crops(shrunk.width, shrunk.height)
    if not coarse_first:
        found = detector.detections((yield from _candidates(detector, shrunk, crops)),
                                    shrunk.width, shrunk.height)
        return [unrotate_detection(d, k, w, h) for d in found]
    whole = yield from _candidates(detector, shrunk, crops[:1])
    found = detector.detections(whole, shrunk.width, shrunk.height)
    if not _coarse_enough(found, max(h, w)):
        # Only the tiles that hold the largest face found (all of them when none
        # was found): a 1-2 MP portrait's face at 12-20 % of the long side lies in
        # one of its two tiles.
        largest = max(found, key=lambda d: d.width) if found else None
        tiles = detector.tile_crops(shrunk, around=largest)
        if tiles:
            more = yield from _candidates(detector, shrunk, tiles)
            found = detector.detections(Candidates.concat([whole, more]),
                                        shrunk.width, shrunk.height)
    return [unrotate_detection(d, k, w, h) for d in found]


def _candidates(detector: Detector, shrunk: Shrunk, crops: Sequence[Crop]) -> Stage[Candidates]:
    """The candidates of the passes of ``crops`` of the ``shrunk`` image, one model
    call per :meth:`~facefuse.faces.detector_base.BatchedDetector.chunks` group; each
    group is let go before the next is cut (the drivers let go of the call too), so
    a large photo's passes never all exist at once."""
    found: list[Candidates] = []
    last = (len(crops) - 1) // max(1, detector.pass_chunk)
    large = shrunk.width * shrunk.height > HEAVY_CUT_PIXELS
    for i, items in enumerate(detector.chunks(shrunk, crops)):
        boxes = [box for _, box in items]
        call = ModelCall(registry_name(detector.model), tuple(x for x, _ in items),
                         then_cuts=large or i < last)
        del items
        outputs = yield call
        del call
        regressors, scores = _stacked(outputs)[:2]
        del outputs
        found.append(detector.candidates(regressors, scores, boxes))
    return Candidates.concat(found)


def confirmed(detector: Detector, fm: FaceMesh, rgb: np.ndarray,
              detections: Sequence[Detection], turns: Sequence[int]) -> Stage[list[Face]]:
    """The faces of ``detections`` (what :func:`detect` found with ``detector`` and
    ``turns``) that the mesh confirms (:func:`reported`). When it rejects every one,
    the search goes on past where :func:`detect` stopped (:func:`_past_rejected`)."""
    faces = reported((yield from mesh(fm, rgb, detections)))
    if detections and not faces:
        faces = yield from _past_rejected(detector, fm, rgb, turns)
    return faces


def _past_rejected(detector: Detector, fm: FaceMesh, rgb: np.ndarray,
                   turns: Sequence[int]) -> Stage[list[Face]]:
    """Every turn tried again, tiles included, and the first whose meshed
    detections include a face wins: a false face found upright no longer hides
    the real one of an upside-down photo, nor a large false box the tiles' small
    faces. Rare: only after :func:`reported` dropped everything."""
    for k in turns:
        found = yield from _detect_turn(detector, rgb, k, coarse_first=False)
        if found:
            faces = reported((yield from mesh(fm, rgb, found)))
            if faces:
                return faces
    return []


def _coarse_enough(found: Sequence[Detection], long_side: int) -> bool:
    return any(d.width >= COARSE_ENOUGH * long_side for d in found)


def _dense_mesh(
    fm: FaceMesh, rgb: np.ndarray, detections: Sequence[Detection]
) -> Stage[tuple[list[np.ndarray], list[float]]]:
    """The 468-point mesh and face-presence score of each detection."""
    rois = [fm.roi(rgb, d) for d in detections]
    outputs = yield ModelCall(registry_name(fm.mesh), tuple(x for x, _ in rois))
    meshes = [fm.postprocess(o[0].reshape(-1), M) for o, (_, M) in zip(outputs, rois, strict=True)]
    return meshes, [fm.presence(o[1]) for o in outputs]


def _reoriented(
    fm: FaceMesh, rgb: np.ndarray, detections: Sequence[Detection],
    meshes: list[np.ndarray], presences: list[float],
) -> Stage[None]:
    """Meshes whose presence is below :data:`~facefuse.faces.rotation.REORIENT_BELOW`
    fitted again in the other quarter turns of their ROI; the best turn replaces
    the mesh in place (a detector may report an upside-down face as upright)."""
    weak = [i for i, p in enumerate(presences) if p < REORIENT_BELOW]
    if not weak:
        return
    tries = [turned_detection(detections[i], k) for i in weak for k in REORIENT_TURNS]
    t_meshes, t_presences = yield from _dense_mesh(fm, rgb, tries)
    n = len(REORIENT_TURNS)
    for j, i in enumerate(weak):
        for m, p in zip(t_meshes[j * n:(j + 1) * n], t_presences[j * n:(j + 1) * n], strict=True):
            if p > presences[i]:
                meshes[i], presences[i] = m, p


#: ``carry(i, mesh)``: for detection ``i`` and its (468, 3) mesh in image pixels, the
#: (478, 3) landmarks to use without running the iris model, or None to run it.
EyeCarry = Callable[[int, np.ndarray], np.ndarray | None]


def mesh(fm: FaceMesh, rgb: np.ndarray, detections: Sequence[Detection], *,
         carry: EyeCarry | None = None) -> Stage[list[Face]]:
    """Mesh (+ iris) of each detection, in the same order: Faces without embeddings.

    A mesh with a low face-presence score is fitted again in the other quarter
    turns of its ROI. With no iris model the 10 iris points are estimated from the
    eye contours. ``carry`` lets a caller that can place the eyes itself (a tracker
    carrying them from the previous frame) skip the iris model for some faces;
    without it every face runs it.
    """
    if not detections:
        return []
    meshes, presences = yield from _dense_mesh(fm, rgb, detections)
    yield from _reoriented(fm, rgb, detections, meshes, presences)
    full: list[np.ndarray | None] = [None if carry is None else carry(i, m)
                                     for i, m in enumerate(meshes)]
    todo = [i for i, lm in enumerate(full) if lm is None]
    if fm.iris is None:
        for i in todo:
            full[i] = fm.estimate_iris(meshes[i])
    elif todo:
        eyes = {i: fm.eye_rois(rgb, meshes[i]) for i in todo}
        iris_out = yield ModelCall(registry_name(fm.iris),
                                   tuple(x for i in todo for x, _ in eyes[i]))
        for j, i in enumerate(todo):
            left, right = iris_out[2 * j], iris_out[2 * j + 1]
            contours = np.stack([left[0].reshape(-1), right[0].reshape(-1)])
            irises = np.stack([left[1].reshape(-1), right[1].reshape(-1)])
            full[i] = fm.refine(meshes[i], contours, irises, [M for _, M in eyes[i]])
    faces = []
    for d, lm, p in zip(detections, full, presences, strict=True):
        assert lm is not None
        faces.append(make_face(d, lm, p))
    return faces


def largest_first(faces: Sequence[Face]) -> list[Face]:
    """The order every analysis reports faces in: largest box first."""
    return sorted(faces, key=lambda f: -f.area)


#: A detection whose mesh (in its best quarter turn) gives a face presence below
#: this is not a face. On the detection benchmark's sets (samples, rotated,
#: downscaled, cut by the frame, corners, groups, face-free photos) BlazeFace's
#: false positives (a galaxy field, a mug, boxes beside faces cut by the frame's
#: left edge, one on an upside-down photo; also a wrist on a tilted portrait) mesh
#: at 0.000-0.064 and its 235 true faces at ≥ 0.70; YuNet's 340 true faces at
#: ≥ 0.16 (corner faces cut by 35 %), with no false positive.
MIN_PRESENCE = 0.1


def reported(faces: Sequence[Face]) -> list[Face]:
    """The faces an analysis reports: those the mesh confirms (presence ≥
    :data:`MIN_PRESENCE`), largest box first."""
    return largest_first([f for f in faces if f.mesh_score is None
                          or f.mesh_score >= MIN_PRESENCE])


def chips(rgb: np.ndarray, faces: Sequence[Face]) -> np.ndarray:
    """Aligned 150×150 RGB recognition chips, (N, 150, 150, 3) uint8."""
    out = [warp_chip(rgb, f.chip_transform, CHIP_SIZE) for f in faces
           if f.chip_transform is not None]
    if not out:
        return np.zeros((0, CHIP_SIZE, CHIP_SIZE, 3), np.uint8)
    return np.stack(out)


def embed(recognizer: Recognizer, rgb: np.ndarray, faces: Sequence[Face]) -> Stage[list[Face]]:
    """Copies of ``faces`` with ``embedding_raw`` (dlib's (128,) vector) and the
    unit-norm ``embedding``."""
    if not faces:
        return []
    tensors = recognizer.preprocess(chips(rgb, faces))
    outputs = yield ModelCall(registry_name(recognizer.model), tuple(tensors))
    out = []
    for f, o in zip(faces, outputs, strict=True):
        raw = o[0].reshape(-1).astype(np.float32)
        out.append(dataclasses.replace(f, embedding_raw=raw,
                                       embedding=normalize(raw).astype(np.float32)))
    return out


def attributes(models: FaceModels, rgb: np.ndarray, faces: Sequence[Face]) -> Stage[list[Face]]:
    """Copies of ``faces`` with age and gender (where those models are installed)."""
    out = list(faces)
    meshed = [i for i, f in enumerate(out) if f.landmarks is not None]
    if models.age is not None and meshed:
        spec = models.age.spec
        outputs = yield ModelCall(registry_name(models.age), tuple(
            attribute_chip(rgb, _mesh_of(out[i]), models.age) for i in meshed))
        for i, o in zip(meshed, outputs, strict=True):
            out[i] = dataclasses.replace(out[i], age=read_age(o[0], spec))
    if models.gender is not None and meshed:
        spec = models.gender.spec
        outputs = yield ModelCall(registry_name(models.gender), tuple(
            attribute_chip(rgb, _mesh_of(out[i]), models.gender) for i in meshed))
        for i, o in zip(meshed, outputs, strict=True):
            gender, score = read_gender(o[0], spec)
            out[i] = dataclasses.replace(out[i], gender=gender, gender_score=score)
    return out


def _mesh_of(face: Face) -> np.ndarray:
    assert face.landmarks is not None
    return face.landmarks


def reanalyse(models: FaceModels, rgb: np.ndarray, where: Face) -> Stage[Face]:
    """The face of ``rgb`` at the place of ``where`` (its detection re-used): mesh and
    embedding, e.g. to judge a fused output against its source."""
    det = Detection(bbox=where.bbox, score=where.score, keypoints=where.keypoints)
    faces = yield from mesh(models.mesh, rgb, [det])
    embedded = yield from embed(models.recognizer, rgb, faces)
    return embedded[0]


def embed_at(recognizer: Recognizer, rgb: np.ndarray, where: Face,
             landmarks: np.ndarray) -> Stage[Face]:
    """The face of ``rgb`` whose (478, 3) mesh is already known (e.g. a fused face,
    rendered with that mesh), embedded with one recogniser call: no detection, mesh
    or iris run. ``where`` gives the box and keypoints the record carries."""
    lm = np.asarray(landmarks, np.float32)
    face = dataclasses.replace(
        where, landmarks=lm, landmarks5=lm[list(MESH_FIVE_POINTS), :2],
        chip_transform=dlib_chip_transform(lm, size=CHIP_SIZE, padding=CHIP_PADDING),
        embedding=None, embedding_raw=None)
    embedded = yield from embed(recognizer, rgb, [face])
    return embedded[0]
