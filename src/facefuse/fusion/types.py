"""Fusion options and results."""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import Field, dataclass, field, fields
from typing import Any, Literal, get_args, get_origin, get_type_hints

import numpy as np

from facefuse.errors import InvalidArgumentError
from facefuse.faces.types import Face

BlendMode = Literal["multiband", "poisson", "alpha"]
TargetMode = Literal["one", "many", "reference"]
#: Whose facial hair is found as regions (``FuseOptions.facial_hair``).
FacialHairMode = Literal["target", "both", "off"]

#: Default smallest usable face: pixels between the outer eye corners.
MIN_EYE_DISTANCE_PX = 40.0
#: The range a caller may set ``min_face_size`` in (pixels between the outer eye corners).
MIN_FACE_SIZE_RANGE = (16.0, 1024.0)


@dataclass(frozen=True)
class OptionSpec:
    """How one option (a :class:`FuseOptions` field, or a clip's
    :class:`~facefuse.video.options.VideoOptions` one) is offered to callers: the single
    declaration the HTTP schemas (``facefuse.serving.routes.schemas``), the CLI flags
    (``facefuse fuse``, ``facefuse video``) and the validation are made from.

    Attributes:
        help: one sentence for people (CLI ``--help`` and the OpenAPI description).
        low, high: inclusive numeric bounds (None: unbounded on that side).
        unit: what the number counts, said in the range error (``"pixels"``).
        http: a field of the HTTP API's options.
        cli: the command-line flag (a ``--no-…`` flag switches a default-on
            option off); None: not on the command line.
        cli_bare: the value of the flag given without one (None: a value is required).
        metavar: the CLI's name for the value.
        legacy: ``(old, new)`` pairs: an old spelling of a value (``True``), still
            taken (library, HTTP) and read as ``new``.
    """

    help: str
    low: float | None = None
    high: float | None = None
    unit: str | None = None
    http: bool = True
    cli: str | None = None
    cli_bare: str | None = None
    metavar: str | None = None
    legacy: tuple[tuple[Any, Any], ...] = ()


def option_field(default: Any, **spec: Any) -> Any:
    """A field of an options dataclass (:class:`FuseOptions`, a clip's
    :class:`~facefuse.video.options.VideoOptions`) with its :class:`OptionSpec`."""
    return field(default=default, metadata={"option": OptionSpec(**spec)})


def _option(default: Any, **spec: Any) -> Any:
    """A :class:`FuseOptions` field with its :class:`OptionSpec`."""
    return option_field(default, **spec)


@dataclass(frozen=True)
class FuseOptions:
    """How to fuse.

    ``degree`` 0..100: 0 returns the target unchanged, 100 the full source
    identity. ``shape`` and ``texture`` (0..100, default = degree) refine it:
    how far the geometry and the skin texture move toward the source.

    The mask parts (classic swapper; all on by default, see docs/fusion.md):
    ``relight`` relights the source face with the target's lighting (spherical
    harmonics on the mesh normals) before the tone transfer;
    ``reject_source_occluders`` fills what covers the source's face (hair,
    glasses, hands, a beard) from the source's own skin before it is warped;
    ``keep_target_occluders`` keeps whatever covers the target's face on top of
    the fused face; ``symmetric_fill`` takes what the source photo hides or
    foreshortens (a turned head's far side) from the mirrored other half of the
    source face where that half shows it markedly better, or the target's own
    pixels where neither half is shown.
    ``glasses`` and ``facial_hair`` find those as regions (docs/fusion.md):
    ``facial_hair="both"`` (default) keeps the target's beard, moustache and
    stubble and never carries the source's, ``"target"`` looks for the target's
    only, ``"off"`` for neither; the old booleans are read as ``True`` →
    ``"both"``, ``False`` → ``"off"``.

    ``swapper`` names the swapper that renders the face (``classic``, or an ONNX
    swap model of the manifest, docs/swappers.md); None: the fuser's default
    (``FACEFUSE_SWAPPER``, else ``classic``). Which names exist is the fuser's to
    say (:meth:`facefuse.fusion.engine.FaceFuser.resolve`: ``unknown_swapper``).

    ``min_face_size`` (pixels between the outer eye corners, 16..1024, default 40):
    smaller faces (source or target) are not used. In ``many`` mode and with a
    mapping such a target face is skipped and reported (:class:`SkippedFace`); in
    ``one`` and ``reference`` mode it is an error.

    Every field carries its :class:`OptionSpec` (:func:`option_specs`). A value out
    of range or of the wrong type raises :class:`InvalidArgumentError` with code
    ``invalid_<field>``; ``target_face_index`` outside mode ``one`` (the other modes
    choose their own faces) raises it with code ``options_conflict``.
    """

    degree: float = _option(100.0, low=0, high=100, cli="--degree", help=(
        "0 returns the target unchanged, 100 the full source identity."))
    shape: float | None = _option(None, low=0, high=100, cli="--shape", help=(
        "How far the geometry moves toward the source, 0..100 (default: degree)."))
    texture: float | None = _option(None, low=0, high=100, cli="--texture", help=(
        "How far the skin texture moves toward the source, 0..100 (default: degree)."))
    mode: TargetMode = _option("one", cli="--mode", help=(
        "one: the face at target_face_index (largest first); many: every face; "
        "reference: the target face most like the reference image's face."))
    target_face_index: int | None = _option(None, low=0, cli="--target-face-index", help=(
        "The face to replace in mode one (0 = largest)."))
    blend: BlendMode = _option("multiband", cli="--blend", help=(
        "How the rendered face is blended in."))
    swapper: str | None = _option(None, cli="--swapper", help=(
        "The swapper that renders the face: classic, or a registered ONNX swap model "
        "(GET /v1/capabilities lists them); default: FACEFUSE_SWAPPER, else classic."))
    evaluate: bool = _option(True, http=False, help=(
        "Re-analyse the output and report the quality figures of every fused face."))
    relight: bool = _option(True, cli="--no-relight", help=(
        "Relight the source face with the target's lighting (spherical harmonics on "
        "the face mesh)."))
    reject_source_occluders: bool = _option(True, cli="--no-source-occluders", help=(
        "Fill what covers the source's face (hair, glasses, a hand, a beard) from the "
        "source's own skin, so none of it is carried."))
    keep_target_occluders: bool = _option(True, cli="--no-target-occluders", help=(
        "Keep whatever covers the target's face (glasses, a hand, hair, a beard) on top."))
    symmetric_fill: bool = _option(True, cli="--no-symmetric-fill", help=(
        "Where the source photo hides or squeezes part of the face the target shows (a "
        "turned head), take it from the mirrored other half of the source face."))
    glasses: bool = _option(True, cli="--no-glasses", help=(
        "Find glasses frames (and their lens reflections) as regions: the target's are "
        "kept bit-exact, the source's never carried."))
    facial_hair: FacialHairMode = _option(
        "both", cli="--facial-hair", cli_bare="both", legacy=((True, "both"), (False, "off")),
        help=("Facial hair (beard, moustache, stubble) found as regions. both: the "
              "target's is laid over the fused face, strand for strand, and the "
              "source's never carried (a stubbled source then loses its stubble's "
              "shading, and some identity); target: only "
              "the target's is looked for (a bearded source's beard is carried like its "
              "skin); off: neither (a dense beard still counts as an occluder). true and "
              "false are read as both and off."))
    min_face_size: float = _option(
        MIN_EYE_DISTANCE_PX, low=MIN_FACE_SIZE_RANGE[0], high=MIN_FACE_SIZE_RANGE[1],
        unit="pixels", cli="--min-face-size", metavar="PX", help=(
            "Smallest face used, source or target (pixels between the outer eye corners). "
            "In mode many and with a mapping, smaller faces (and faces in profile or "
            "without landmarks) are skipped and listed; the fusion fails only when no "
            "face can be fused."))

    def __post_init__(self) -> None:
        hints = _hints()
        for f, spec in option_specs():
            value = getattr(self, f.name)
            for old, new in spec.legacy:
                if value is old:  # identity: True is not 1
                    object.__setattr__(self, f.name, new)
                    value = new
            _check_option(f.name, value, hints[f.name], spec)
        if self.target_face_index is not None and self.mode != "one":
            raise InvalidArgumentError(
                f"target_face_index picks the face in mode 'one'; mode {self.mode!r} "
                "chooses its own faces", code="options_conflict")

    @property
    def shape_weight(self) -> float:
        return (self.degree if self.shape is None else self.shape) / 100.0

    @property
    def texture_weight(self) -> float:
        return (self.degree if self.texture is None else self.texture) / 100.0

    def finds_facial_hair(self, *, source: bool) -> bool:
        """Whether the source's (``source``) or the target's facial hair is found."""
        return self.facial_hair == "both" or (self.facial_hair == "target" and not source)


@functools.cache
def option_specs() -> tuple[tuple[Field[Any], OptionSpec], ...]:
    """Every :class:`FuseOptions` field with its :class:`OptionSpec`, in declaration order."""
    return tuple((f, f.metadata["option"]) for f in fields(FuseOptions))


@functools.cache
def _hints() -> dict[str, Any]:
    return get_type_hints(FuseOptions)


def option_type(name: str) -> Any:
    """The annotation of :class:`FuseOptions` field ``name`` (``float | None``,
    ``Literal[...]``, ...)."""
    return _hints()[name]


@functools.cache
def declared(cls: Any) -> tuple[tuple[Field[Any], OptionSpec, Any], ...]:
    """Every field of the options dataclass ``cls`` that carries an :class:`OptionSpec`:
    (field, spec, annotation), in declaration order. What the HTTP schemas and the CLI
    flags are made from."""
    hints = get_type_hints(cls)
    return tuple((f, f.metadata["option"], hints[f.name]) for f in fields(cls)
                 if "option" in f.metadata)


def check_declared(options: Any) -> None:
    """Raise ``invalid_<name>`` for a declared field of ``options`` whose value does
    not fit its type and range."""
    kind: Any = type(options)
    for f, spec, hint in declared(kind):
        _check_option(f.name, getattr(options, f.name), hint, spec)


def _check_option(name: str, value: Any, hint: Any, spec: OptionSpec) -> None:
    """Raise ``invalid_<name>`` unless ``value`` fits the field's type and range."""
    args = [a for a in get_args(hint) if a is not type(None)]
    if value is None and type(None) in get_args(hint):
        return
    base = args[0] if args else hint
    code = f"invalid_{name}"
    if get_origin(hint) is Literal:
        if value not in get_args(hint):
            choices = "|".join(str(a) for a in get_args(hint))
            raise InvalidArgumentError(f"{name} must be {choices}, not {value!r}", code=code)
    elif base is bool:
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"{name} must be true or false", code=code)
    elif base in (int, float):
        kind = "an integer" if base is int else "a number"
        ok_type = isinstance(value, numbers.Integral if base is int else numbers.Real) and (
            not isinstance(value, bool))
        lo = -math.inf if spec.low is None else spec.low
        hi = math.inf if spec.high is None else spec.high
        if not ok_type or not lo <= value <= hi:
            unit = f" of {spec.unit}" if spec.unit else ""
            span = (f">= {lo:g}" if spec.high is None else f"in {lo:g}..{hi:g}")
            raise InvalidArgumentError(f"{name} must be {kind}{unit} {span}, not {value!r}",
                                       code=code)
    elif not isinstance(value, base):
        raise InvalidArgumentError(f"{name} must be a {base.__name__}, not {value!r}",
                                   code=code)


@dataclass(frozen=True)
class SkippedFace:
    """A target face that was chosen (``many`` mode, a mapping) but not fused.

    Attributes:
        target_index: the face's index in the target (0 = largest).
        box: its box ``(x0, y0, x1, y1)`` in target pixels.
        reason: the stable code of the error it would have raised
            (``target_face_too_small``, ``target_face_profile``, ...).
        message: the same, for people.
    """

    target_index: int
    box: tuple[float, float, float, float]
    reason: str
    message: str

    def to_dict(self, *, message: bool = True) -> dict[str, object]:
        """``{"index", "box" (whole pixels), "reason"[, "message"]}``."""
        d: dict[str, object] = {"index": self.target_index,
                                "box": [round(v) for v in self.box], "reason": self.reason}
        if message:
            d["message"] = self.message
        return d


@dataclass
class FusedFace:
    """One target face that was fused: where, with which mask, and its quality."""

    target_index: int
    target_face: Face
    region: tuple[int, int, int, int]
    mask: np.ndarray  # (h, w) float32 blend mask over region
    quality: dict[str, float] = field(default_factory=dict)
    #: Which source image the fused identity came from (face mapping).
    source_index: int = 0
    #: (N, 3) the mesh the face was rendered with, target-image pixels (None when
    #: nothing was rendered): the output's face geometry without re-analysing it.
    landmarks: np.ndarray | None = None
    #: Share (0..1) of the face's pixels whose colour came from beyond the source's
    #: face outline (measured when evaluating; the swapper may not report it).
    outside_source: float | None = None


@dataclass
class FusionResult:
    """The fused image (RGB uint8, the target's size) and how it was made."""

    image: np.ndarray
    source_face: Face
    fused: list[FusedFace]
    timings_ms: dict[str, float]
    notes: list[str] = field(default_factory=list)
    #: Chosen target faces that could not be fused, and why.
    skipped: list[SkippedFace] = field(default_factory=list)

    @property
    def quality(self) -> dict[str, float]:
        """Quality of the first fused face (see :func:`facefuse.fusion.plan.quality`)."""
        return self.fused[0].quality if self.fused else {}

    def report(self) -> dict[str, object]:
        """A JSON-ready summary: fused faces, skipped faces, timings, quality, notes."""
        return {
            "source_face": self.source_face.to_dict(),
            "fused_faces": [
                {"target_index": f.target_index, "source_index": f.source_index,
                 "target_face": f.target_face.to_dict(),
                 "region": list(f.region),
                 "quality": {k: round(float(v), 4) for k, v in f.quality.items()}}
                for f in self.fused
            ],
            "skipped_faces": [s.to_dict() for s in self.skipped],
            "timings_ms": {k: round(v, 2) for k, v in self.timings_ms.items()},
            "notes": self.notes,
        }
