"""facefuse: face analysis and face fusion on ONNX Runtime.

Quick start::

    import facefuse
    faces = facefuse.analyse("photo.jpg")          # list[Face], largest first
    print(faces[0].bbox, faces[0].embedding.shape)  # (4,), (128,)
    result = facefuse.fuse("source.jpg", "target.jpg", degree=80)
    result.image                                    # RGB uint8, the target's size
    facefuse.fuse("me.jpg", "group.jpg", reference="them.jpg")  # replace that person
    facefuse.verify("a.jpg", "b.jpg").same_person   # dlib's rule: distance < 0.6

Importing it sets ``OPENCV_THREAD_POOL_ACTIVE_WAIT_WORKER=0`` in the process's
environment unless a value is there (OpenCV's pool threads then sleep between calls
instead of spinning; subprocesses inherit it): import ``facefuse`` before ``cv2``.
"""

from __future__ import annotations

import os

# OpenCV's pool workers spin after every parallel call (2000 rounds, half of them
# sched_yield system calls) before they sleep: with OpenCV called a few dozen times
# per request, that spin was 13-18 ms of system CPU per ~2 MP fusion request on
# 2 cores, for no gain in latency. Read once, when cv2 is first imported (no
# facefuse module has imported it yet); a value in the environment wins.
os.environ.setdefault("OPENCV_THREAD_POOL_ACTIVE_WAIT_WORKER", "0")

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from facefuse.config import Settings
from facefuse.errors import FacefuseError
from facefuse.faces.types import Detection, Face

if TYPE_CHECKING:
    from facefuse.faces.analyser import FaceAnalyser
    from facefuse.faces.verify import Verification
    from facefuse.fusion.engine import FaceFuser
    from facefuse.fusion.types import FusionResult
    from facefuse.imaging.decode import ImageInput

__all__ = [
    "Detection", "Face", "FaceAnalyser", "FaceFuser", "FacefuseError", "Settings", "analyse",
    "fuse", "verify",
]
__version__ = "0.1.0"

_lock = threading.Lock()
# Keyed by the settings that build sessions and analysis (Settings.analysis_key): a
# Settings that differs in a service-only field (redis_url, ...) shares the models.
_default: dict[tuple[object, ...], FaceAnalyser] = {}
_fusers: dict[tuple[object, ...], FaceFuser] = {}


def default_analyser(settings: Settings | None = None) -> FaceAnalyser:
    """A process-wide analyser per distinct :meth:`Settings.analysis_key` (models
    load once)."""
    from facefuse.faces.analyser import FaceAnalyser

    settings = settings or Settings.from_env()
    key = settings.analysis_key()
    with _lock:
        analyser = _default.get(key)
        if analyser is None:
            analyser = FaceAnalyser(settings)
            _default[key] = analyser
    return analyser


def default_fuser(settings: Settings | None = None) -> FaceFuser:
    """A process-wide fuser over :func:`default_analyser`'s analyser."""
    from facefuse.fusion.engine import FaceFuser

    settings = settings or Settings.from_env()
    analyser = default_analyser(settings)
    key = settings.analysis_key()
    with _lock:
        fuser = _fusers.get(key)
        if fuser is None:
            fuser = FaceFuser(settings, analyser)
            _fusers[key] = fuser
    return fuser


def analyse(image: ImageInput, settings: Settings | None = None) -> list[Face]:
    """Analyse every face in ``image`` (RGB uint8 (H, W, 3) array, path, or bytes).

    Returns faces largest first, each with bbox, keypoints, 478-point mesh,
    five-point landmarks, chip transform and a unit-norm 128-D embedding. Every
    face is wanted, so under ``detector="auto"`` YuNet finds them.
    """
    return default_analyser(settings).analyse(image, purpose="all")


def fuse(
    source: ImageInput | Sequence[ImageInput], target: ImageInput, *,
    reference: ImageInput | None = None, mapping: Sequence[Mapping[str, Any]] | None = None,
    settings: Settings | None = None, **options: Any,
) -> FusionResult:
    """Fuse the source face into ``target``; every
    :class:`~facefuse.fusion.types.FuseOptions` field passes as a keyword
    (``degree=80``: 0 = target unchanged, 100 = full source identity; ``mode``,
    ``shape``, ``texture``, ``blend``, ...).

    ``reference``: an image of the person to replace among the target's faces;
    giving one means ``mode="reference"`` (another mode with it is an error).
    ``mapping`` names which source face replaces which target face, e.g.
    ``fuse([alice, bob], group, mapping=[{"source": 0, "target": 1},
    {"source": 1, "target": [40, 60, 180, 220]}])`` (see :mod:`facefuse.fusion.mapping`).

    Raises :class:`~facefuse.errors.InvalidArgumentError` for an unknown option
    (``unknown_option``), a bad value (``invalid_<option>``) or options that
    contradict each other (``options_conflict``).
    """
    from facefuse.errors import InvalidArgumentError
    from facefuse.fusion.select import check_reference
    from facefuse.fusion.types import FuseOptions, option_specs

    known = {f.name for f, _ in option_specs()}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InvalidArgumentError(f"unknown fusion option(s): {', '.join(unknown)} "
                                   f"(known: {', '.join(sorted(known))})",
                                   code="unknown_option")
    if reference is not None:
        options.setdefault("mode", "reference")
        check_reference(options["mode"], True, mapping is not None)
    return default_fuser(settings).fuse(source, target, FuseOptions(**options),
                                        reference=reference, mapping=mapping)


def verify(a: ImageInput, b: ImageInput, settings: Settings | None = None) -> Verification:
    """Are the largest faces of photos ``a`` and ``b`` the same person?

    Returns a :class:`~facefuse.faces.verify.Verification`: ``same_person`` (dlib's
    rule: raw-descriptor distance below ``settings.same_person_distance``, 0.6),
    ``distance``, ``similarity`` (cosine, -1..1) and the two faces. Raises
    :class:`~facefuse.errors.NoFaceError` (``a_no_face`` / ``b_no_face``).
    """
    from facefuse.faces.verify import largest_face, verify_faces

    settings = settings or Settings.from_env()
    analyser = default_analyser(settings)
    fa, fb = (largest_face(analyser.analyse(img, embed=True), name)
              for img, name in ((a, "a"), (b, "b")))
    return verify_faces(fa, fb, settings.same_person_distance)


def __getattr__(name: str) -> object:
    if name == "FaceAnalyser":
        from facefuse.faces.analyser import FaceAnalyser

        return FaceAnalyser
    if name == "FaceFuser":
        from facefuse.fusion.engine import FaceFuser

        return FaceFuser
    raise AttributeError(name)
