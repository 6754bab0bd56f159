"""The face detectors' one registry: :data:`DETECTORS` (``Settings.detector`` name →
the manifest model it runs and how it is made), which one runs for a
:data:`Purpose`, what an analysis depends on, and which quarter turns the detect
stage (:func:`facefuse.faces.stages.detect`) tries when none is upright.

``full`` / ``short``: BlazeFace (MediaPipe) full- or short-range;
``yunet``: libfacedetection's YuNet. Every detector has the same shape
(:class:`Detector`), so the analyser and the server's micro-batchers drive
them alike.

``auto`` (the default) picks one per :data:`Purpose` (:func:`detector_for`):
BlazeFace full-range where only the largest face of an image is used (fusion
sources, the target in ``one`` mode, a reference photo, ``/v1/verify``), YuNet
where every face is (the target in ``many`` mode, with a mapping or a face index,
face listings). YuNet finds the faces BlazeFace misses in groups, at the frame's
edge and filling the frame, at about 2.4x BlazeFace's detect time
(BENCHMARKS.md, "detect" and "groups"); the one-face path keeps BlazeFace's speed.
Both the library (:class:`~facefuse.faces.analyser.FaceAnalyser`) and the server
(:class:`~facefuse.serving.pipeline.Pipeline`) ask :func:`detector_for`, and the
server's analysis cache is keyed by :func:`analysis_options`.

Adding a detector is its module (a :class:`Detector` subclass and a
:data:`MakeDetector` that reads its thresholds from ``Settings``), one line in
:data:`DETECTORS`, and its converter (the model's ``ZOO`` entry and converter in
:mod:`facefuse.toolchain.build.zoo`). Nothing else names a detector: the setting
is checked here (:func:`check_detector`), and the models, the batchers and the
cache keys follow from this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from facefuse.config import ANALYSIS_FIELDS, Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces import blazeface, yunet
from facefuse.faces.detector_base import BatchedDetector
from facefuse.faces.rotation import RETRY_TURNS
from facefuse.runtime.batch_policy import batch_policy
from facefuse.runtime.providers import device_of
from facefuse.runtime.registry import LoadedModel, ModelRegistry

#: What every detector is (preprocess → batched run → postprocess).
Detector = BatchedDetector

#: A detector over its loaded model, with its thresholds read from ``Settings``.
MakeDetector = Callable[[LoadedModel, Settings], Detector]


@dataclass(frozen=True)
class DetectorEntry:
    """One detector of :data:`DETECTORS`."""

    #: The manifest model it runs (its base name: a precision variant answers for it).
    model: str
    #: Makes it over that model (its thresholds from ``Settings``).
    make: MakeDetector


#: Every detector, by its ``Settings.detector`` name (``FACEFUSE_DETECTOR``).
DETECTORS: Final[dict[str, DetectorEntry]] = {
    "full": DetectorEntry("blazeface_full", blazeface.full_range),
    "short": DetectorEntry("blazeface_short", blazeface.short_range),
    "yunet": DetectorEntry("yunet", yunet.from_settings),
}

#: Which faces of an image the caller uses: ``largest`` (only the largest face) or
#: ``all`` (every face: listings, ``many`` mode, mappings, a chosen face index).
Purpose = Literal["largest", "all"]
PURPOSES: tuple[Purpose, ...] = ("largest", "all")

#: ``Settings.detector = "auto"``: the detector each purpose runs.
AUTO_DETECTORS: Final[dict[Purpose, str]] = {"largest": "full", "all": "yunet"}


def check_detector(settings: Settings) -> None:
    """Raise :class:`InvalidArgumentError` unless ``settings.detector`` is ``auto``
    or a name in :data:`DETECTORS`."""
    if settings.detector != "auto" and settings.detector not in DETECTORS:
        raise InvalidArgumentError(
            f"settings: detector must be {'|'.join(('auto', *DETECTORS))}, "
            f"not {settings.detector!r}")


def detector_for(settings: Settings, purpose: Purpose) -> str:
    """The :data:`DETECTORS` name that runs for ``purpose``: the one
    ``settings.detector`` forces, or under ``auto`` :data:`AUTO_DETECTORS`'s."""
    check_detector(settings)
    if settings.detector == "auto":
        return AUTO_DETECTORS[purpose]
    return settings.detector


def detectors_in_use(settings: Settings) -> tuple[str, ...]:
    """Every detector some purpose runs under ``settings``, in :data:`PURPOSES` order."""
    return tuple(dict.fromkeys(detector_for(settings, p) for p in PURPOSES))


def make_detector(settings: Settings, registry: ModelRegistry, name: str) -> Detector:
    """The detector ``name`` (a :data:`DETECTORS` key) over the registry's model, with
    ``settings``' thresholds; its passes run in chunks of the batch policy's largest
    batch where the model runs (8 on the CPU by default)."""
    model = registry.get(DETECTORS[name].model)
    detector = DETECTORS[name].make(model, settings)
    gpu = device_of(model.provider) != "cpu"
    detector.pass_chunk = batch_policy(settings, gpu=gpu).max_batch_size
    return detector


def detector_of_model(model: LoadedModel, settings: Settings) -> Detector:
    """The detector that runs ``model`` (any precision variant of a :data:`DETECTORS`
    model), with ``settings``' thresholds: for tools that hold a model, not a name."""
    base = model.spec.base or model.spec.name
    for entry in DETECTORS.values():
        if entry.model == base:
            return entry.make(model, settings)
    raise InvalidArgumentError(f"{model.spec.name!r} is no detector's model")


def analysis_options(settings: Settings, purpose: Purpose) -> dict[str, object]:
    """Everything besides the image and the model versions that an analysis for
    ``purpose`` depends on, JSON-ready: the detector that actually runs (not the
    setting), the purpose (a largest-face analysis stops at the whole-image pass when
    it finds a face, see :func:`~facefuse.faces.stages.detect`) and every
    :data:`~facefuse.config.ANALYSIS_FIELDS` value. Two analyses with equal options,
    image and models are the same (the server's L1 key)."""
    values = dict(zip(ANALYSIS_FIELDS, settings.analysis_key(), strict=True))
    return {"detector": detector_for(settings, purpose), "purpose": purpose,
            "settings": {k: _json_ready(v) for k, v in values.items()}}


def _json_ready(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_json_ready(v) for v in value]
    return value


def turns_to_try(settings: Settings) -> tuple[int, ...]:
    """Quarter turns to try in order, stopping at the first that finds a face."""
    return RETRY_TURNS if settings.det_rotations else (0,)
