"""The swap-model contract: what a manifest ``task: "swap"`` entry must declare, and
the check of a loaded session against it (see docs/swappers.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from facefuse.errors import ModelCorruptError
from facefuse.faces.align import ARCFACE_112, ARCFACE_128
from facefuse.runtime.manifest import ModelSpec
from facefuse.runtime.registry import LoadedModel

#: The manifest task of swap models.
SWAP_TASK = "swap"
#: The manifest task of recognizers (identity embedders).
EMBED_TASK = "embed"
#: The recognizer whose embedding the analyser already puts on every Face.
ANALYSER_RECOGNIZER = "dlib_resnet"

#: Template name → (points in a ``native``-px chip, native size). ArcFace points are
#: image-left eye centre, image-right eye centre, nose tip, image-left mouth corner,
#: image-right mouth corner (the subject's right eye is on the image's left). For a
#: chip of ``S`` px the points scale by ``S / native`` (insightface's ``estimate_norm``
#: for sizes that are multiples of 112 resp. 128).
ARCFACE_TEMPLATES: dict[str, tuple[np.ndarray, int]] = {
    "arcface_112": (ARCFACE_112, 112),
    "arcface_128": (ARCFACE_128, 128),
}
#: dlib's 5-point chip (the recognition chip's geometry), fitted from the mesh.
DLIB_TEMPLATE = "dlib_150"
TEMPLATES = (*ARCFACE_TEMPLATES, DLIB_TEMPLATE)
LATENTS = ("embedding", "normalized")
#: Output range → (offset, scale) with ``pixel = (out + offset) * scale``.
OUTPUT_RANGES: dict[str, tuple[float, float]] = {"0..1": (0.0, 255.0), "-1..1": (1.0, 127.5)}



@dataclass(frozen=True)
class SwapContract:
    """A validated ``task: "swap"`` manifest entry.

    Attributes:
        name: the manifest name (also the ``--swapper`` name).
        size: crop side ``S`` in pixels.
        template: one of :data:`TEMPLATES`.
        padding: dlib chip padding (``extra.chip_padding``, default 0.25; dlib_150 only).
        recognizer: registry name of the model that embeds the source face.
        latent: ``embedding`` (raw vector) or ``normalized`` (unit length).
        latent_dims: ``D``, the width of the model's source input.
        projection: ``initializer:last``, ``file:<name>`` or None.
        output_range: a key of :data:`OUTPUT_RANGES`.
        mean, std: (3,) float32 per-channel normalisation, in model colour order.
        bgr: whether the model's channels are BGR (else RGB).
    """

    name: str
    size: int
    template: str
    padding: float
    recognizer: str
    latent: str
    latent_dims: int
    projection: str | None
    output_range: str
    mean: np.ndarray
    std: np.ndarray
    bgr: bool


def breach(name: str, what: str) -> ModelCorruptError:
    """The error for swap model ``name`` breaking the contract by ``what``."""
    return ModelCorruptError(
        f"swap model {name!r} does not follow the swap contract: {what} (see docs/swappers.md)",
        code="swap_contract",
    )


def static_dim(dim: int | str) -> int | None:
    """A manifest dimension when it is a fixed size; None for a symbolic one."""
    return dim if isinstance(dim, int) and not isinstance(dim, bool) else None


def parse_contract(spec: ModelSpec) -> SwapContract:
    """Check a manifest entry against the swap contract.

    Raises:
        ModelCorruptError: naming the first field that is wrong.
    """
    if spec.task != SWAP_TASK:
        raise breach(spec.name, f"task is {spec.task!r}, not {SWAP_TASK!r}")
    s, mean, std = _check_preprocessing(spec)
    d = _check_io(spec, s)
    e = _check_extra(spec)
    return SwapContract(
        name=spec.name, size=s, template=e.template, padding=e.padding,
        recognizer=e.recognizer, latent=e.latent, latent_dims=d,
        projection=e.projection, output_range=e.output_range,
        mean=mean, std=std, bgr=spec.preprocessing.color == "BGR",
    )


def _check_preprocessing(spec: ModelSpec) -> tuple[int, np.ndarray, np.ndarray]:
    """(crop size S, mean (3,), std (3,)) of a valid ``preprocessing`` block."""
    n, pre = spec.name, spec.preprocessing
    size = tuple(pre.size)
    if len(size) != 2 or size[0] != size[1] or static_dim(size[0]) is None or int(size[0]) < 8:
        raise breach(n, f"preprocessing.size must be a square [S, S] with S >= 8, got {list(size)}")
    if pre.layout != "NCHW":
        raise breach(n, f"preprocessing.layout must be NCHW, got {pre.layout!r}")
    if pre.color not in ("RGB", "BGR"):
        raise breach(n, f"preprocessing.color must be RGB or BGR, got {pre.color!r}")
    mean = np.asarray(pre.mean, np.float32)
    std = np.asarray(pre.std, np.float32)
    if mean.shape != (3,) or std.shape != (3,) or not np.all(np.isfinite(mean)):
        raise breach(n, "preprocessing.mean and .std must be 3 numbers each")
    if not np.all(np.isfinite(std)) or np.any(std == 0):
        raise breach(n, f"preprocessing.std must be finite and non-zero, got {list(pre.std)}")
    return int(size[0]), mean, std


def _check_io(spec: ModelSpec, s: int) -> int:
    """The latent size D of valid inputs ``target`` [N, 3, S, S], ``source`` [N, D] and
    output [N, 3, S, S]."""
    n = spec.name
    if len(spec.inputs) != 2:
        raise breach(n, f"needs 2 inputs [target, source], the manifest lists {len(spec.inputs)}")
    if len(spec.outputs) != 1:
        raise breach(n, f"needs 1 output, the manifest lists {len(spec.outputs)}")
    tgt, src = spec.inputs
    out = spec.outputs[0]
    for role, t in (("input 'target'", tgt), ("input 'source'", src), ("output", out)):
        if t.dtype != "float32":
            raise breach(n, f"{role} {t.name!r} must be float32, got {t.dtype}")
    for role, t in (("input 'target'", tgt), ("output", out)):
        if len(t.shape) != 4 or [static_dim(d) for d in t.shape[1:]] != [3, s, s]:
            raise breach(n, f"{role} {t.name!r} must be [N, 3, {s}, {s}], got {t.shape}")
    d = static_dim(src.shape[-1]) if len(src.shape) == 2 else None
    if d is None or d < 1:
        raise breach(n, f"input 'source' {src.name!r} must be [N, D] with a fixed D, "
                        f"got {src.shape}")
    return d


@dataclass(frozen=True)
class _Extra:
    template: str
    recognizer: str
    latent: str
    projection: str | None
    output_range: str
    padding: float


def _check_extra(spec: ModelSpec) -> _Extra:
    """The swap-specific fields of ``extra``, checked."""
    n, extra = spec.name, spec.extra
    template = extra.get("template")
    if template not in TEMPLATES:
        raise breach(n, f"extra.template must be one of {', '.join(TEMPLATES)}, got {template!r}")
    recognizer = extra.get("recognizer")
    if not isinstance(recognizer, str) or not recognizer:
        raise breach(n, f"extra.recognizer must name a registry model, got {recognizer!r}")
    latent = extra.get("latent")
    if latent not in LATENTS:
        raise breach(n, f"extra.latent must be one of {', '.join(LATENTS)}, got {latent!r}")
    projection = extra.get("projection")
    if projection is not None and not (
        projection == "initializer:last"
        or (isinstance(projection, str) and projection.startswith("file:")
            and projection.endswith(".npy") and _is_plain_name(projection[5:]))
    ):
        raise breach(n, "extra.projection must be 'initializer:last', 'file:<name>.npy' (a file "
                      f"in the model directory) or absent, got {projection!r}")
    output_range = extra.get("output_range")
    if output_range not in OUTPUT_RANGES:
        raise breach(n, f"extra.output_range must be one of {', '.join(OUTPUT_RANGES)}, "
                      f"got {output_range!r}")
    padding = extra.get("chip_padding", 0.25)
    if not isinstance(padding, int | float) or not 0.0 <= float(padding) < 2.0:
        raise breach(n, f"extra.chip_padding must be a number in [0, 2), got {padding!r}")
    return _Extra(str(template), recognizer, str(latent), projection, str(output_range),
                  float(padding))


def _is_plain_name(name: str) -> bool:
    """A file name with no directory part (so it stays inside the model directory)."""
    return bool(name) and Path(name).name == name and name not in (".", "..")


def check_session(contract: SwapContract, spec: ModelSpec, model: LoadedModel) -> None:
    """Check the loaded graph's inputs/outputs against the manifest entry.

    Raises:
        ModelCorruptError: when names, ranks, fixed dimensions or types disagree.
    """
    n = contract.name
    sess_in = {i.name: i for i in model.session.get_inputs()}
    sess_out = model.session.get_outputs()
    want_in = [t.name for t in spec.inputs]
    if sorted(sess_in) != sorted(want_in):
        raise breach(n, f"the graph's inputs are {sorted(sess_in)}, the manifest says {want_in}")
    if len(sess_out) != 1:
        raise breach(n, f"the graph has {len(sess_out)} outputs, the contract needs 1")
    s, d = contract.size, contract.latent_dims
    checks: list[tuple[str, Any, list[int | None]]] = [
        (f"input {spec.inputs[0].name!r}", sess_in[spec.inputs[0].name], [None, 3, s, s]),
        (f"input {spec.inputs[1].name!r}", sess_in[spec.inputs[1].name], [None, d]),
        (f"output {sess_out[0].name!r}", sess_out[0], [None, 3, s, s]),
    ]
    for role, node, want in checks:
        if node.type != "tensor(float)":
            raise breach(n, f"graph {role} is {node.type}, the contract needs tensor(float)")
        shape = list(node.shape)
        fixed_ok = all(w is None or not isinstance(g, int) or g == w
                       for g, w in zip(shape, want, strict=False))
        if len(shape) != len(want) or not fixed_ok:
            dims = ", ".join("N" if w is None else str(w) for w in want)
            raise breach(n, f"graph {role} has shape {shape}, the contract needs [{dims}]")
