"""facefuse: face analysis and face fusion on ONNX Runtime.

Quick start::

    import facefuse
    faces = facefuse.analyse("photo.jpg")          # list[Face], largest first
    print(faces[0].bbox, faces[0].embedding.shape)  # (4,), (128,)
    result = facefuse.fuse("source.jpg", "target.jpg", degree=80)
    result.image                                    # RGB uint8, the target's size
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from facefuse.config import Settings
from facefuse.errors import FacefuseError
from facefuse.faces.types import Detection, Face

if TYPE_CHECKING:
    from facefuse.faces.analyser import FaceAnalyser
    from facefuse.fusion.engine import FaceFuser
    from facefuse.fusion.types import FusionResult
    from facefuse.imaging.decode import ImageInput

__all__ = [
    "Detection", "Face", "FaceAnalyser", "FaceFuser", "FacefuseError", "Settings", "analyse",
    "fuse",
]
__version__ = "0.1.0"

_lock = threading.Lock()
_default: dict[Settings, FaceAnalyser] = {}
_fusers: dict[Settings, FaceFuser] = {}


def default_analyser(settings: Settings | None = None) -> FaceAnalyser:
    """A process-wide analyser per distinct ``Settings`` (models load once)."""
    from facefuse.faces.analyser import FaceAnalyser

    settings = settings or Settings.from_env()
    with _lock:
        analyser = _default.get(settings)
        if analyser is None:
            analyser = FaceAnalyser(settings)
            _default[settings] = analyser
    return analyser


def analyse(image: ImageInput, settings: Settings | None = None) -> list[Face]:
    """Analyse every face in ``image`` (RGB uint8 (H, W, 3) array, path, or bytes).

    Returns faces largest first, each with bbox, keypoints, 478-point mesh,
    five-point landmarks, chip transform and a unit-norm 128-D embedding. Every
    face is wanted, so under ``detector="auto"`` YuNet finds them.
    """
    return default_analyser(settings).analyse(image, purpose="all")


def fuse(
    source: ImageInput | Sequence[ImageInput], target: ImageInput, *, degree: float = 100.0,
    settings: Settings | None = None, mapping: Sequence[Mapping[str, Any]] | None = None,
    **options: object,
) -> FusionResult:
    """Fuse the source face into ``target`` at ``degree`` (0 = target unchanged,
    100 = full source identity). Other :class:`~facefuse.fusion.types.FuseOptions`
    fields (``mode``, ``shape``, ``texture``, ``blend``, ...) pass as keywords.

    ``mapping`` names which source face replaces which target face, e.g.
    ``fuse([alice, bob], group, mapping=[{"source": 0, "target": 1},
    {"source": 1, "target": [40, 60, 180, 220]}])`` (see :mod:`facefuse.fusion.mapping`).
    """
    from facefuse.fusion.engine import FaceFuser
    from facefuse.fusion.types import FuseOptions

    opts = FuseOptions(degree=degree, **options)  # type: ignore[arg-type]
    settings = settings or Settings.from_env()
    analyser = default_analyser(settings)
    with _lock:
        fuser = _fusers.get(settings)
        if fuser is None:
            fuser = FaceFuser(settings, analyser)
            _fusers[settings] = fuser
    return fuser.fuse(source, target, opts, mapping=mapping)  # type: ignore[arg-type]


def __getattr__(name: str) -> object:
    if name == "FaceAnalyser":
        from facefuse.faces.analyser import FaceAnalyser

        return FaceAnalyser
    if name == "FaceFuser":
        from facefuse.fusion.engine import FaceFuser

        return FaceFuser
    raise AttributeError(name)
