"""The neural swapper plug-in: inswapper-style ONNX face-swap models from the manifest.

A user drops a face-swap model into the model directory and declares it in
``manifest.json`` with ``task: "swap"``; :class:`~facefuse.fusion.engine.FaceFuser`
registers every such entry as an :class:`OnnxSwapper` under the entry's name
(``facefuse fuse --swapper NAME``). The contract (see ``docs/swappers.md``):

* inputs, in manifest order: ``target`` ``[N, 3, S, S]`` float32 — the target
  face aligned to ``extra.template`` and normalised by ``preprocessing``
  (``(pixel - mean) / std`` per channel, in ``color`` order, NCHW) — and
  ``source`` ``[N, D]`` float32 — the source identity latent;
* output ``[N, 3, S, S]`` float32, the swapped crop in the same colour order,
  in ``extra.output_range`` (``0..1`` or ``-1..1``);
* ``extra.recognizer`` names the registry model whose embedding of the source
  face makes the latent (``extra.latent``: ``embedding`` = its raw vector,
  ``normalized`` = unit length), optionally projected by a (D_in, D) matrix
  ``P`` and re-normalised (``latent = v @ P / |v @ P|``, as inswapper does with
  its ``emap``). ``extra.projection`` is ``initializer:last`` (the model's last
  graph initializer) or ``file:<name>.npy`` (a file in the model directory).

Rendering: the target face is cropped with a similarity to the template, run
through the model, and the output crop is warped back by the inverse affine into
the face region, masked by the same feathered face oval as the classic swapper
times a feathered crop-validity mask; ``degree`` mixes it with the target:
``face = target + texture_weight × (swapped − target)``. The swap model keeps the
target's geometry, so the ``shape`` weight has no effect here.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from facefuse.errors import InvalidArgumentError, ModelCorruptError, ModelMissingError
from facefuse.faces.align import (
    ARCFACE_112,
    ARCFACE_128,
    dlib_chip_transform,
    invert_affine,
    similarity_transform,
    transform_points,
)
from facefuse.faces.recognizer import normalize
from facefuse.faces.types import Face
from facefuse.fusion import mask as masks
from facefuse.fusion.swappers.base import FaceLayer
from facefuse.fusion.types import FuseOptions
from facefuse.runtime.files import sha256_file
from facefuse.runtime.manifest import ModelSpec
from facefuse.runtime.registry import LoadedModel, ModelRegistry

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
#: Mesh points for the ArcFace order: image-left iris centre, image-right iris centre,
#: nose tip, image-left mouth corner, image-right mouth corner. The refined mesh
#: appends the image-left eye's iris first (468–472), then the image-right one.
MESH_ARCFACE_POINTS: tuple[int, int, int, int, int] = (468, 473, 1, 61, 291)
#: Mesh points to fall back on for the eye centres when there is no iris (468 points):
#: the midpoints of the eye corners (image-left 33/133, image-right 263/362).
_EYE_CORNERS = ((33, 133), (263, 362))


# ----------------------------------------------------------------------------------------
# The manifest contract
# ----------------------------------------------------------------------------------------


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


def _bad(name: str, what: str) -> ModelCorruptError:
    return ModelCorruptError(
        f"swap model {name!r} does not follow the swap contract: {what} (see docs/swappers.md)",
        code="swap_contract",
    )


def _static(dim: int | str) -> int | None:
    return dim if isinstance(dim, int) and not isinstance(dim, bool) else None


def parse_contract(spec: ModelSpec) -> SwapContract:
    """Check a manifest entry against the swap contract.

    Raises:
        ModelCorruptError: naming the first field that is wrong.
    """
    n = spec.name
    if spec.task != SWAP_TASK:
        raise _bad(n, f"task is {spec.task!r}, not {SWAP_TASK!r}")
    pre = spec.preprocessing
    size = tuple(pre.size)
    if len(size) != 2 or size[0] != size[1] or _static(size[0]) is None or int(size[0]) < 8:
        raise _bad(n, f"preprocessing.size must be a square [S, S] with S >= 8, got {list(size)}")
    s = int(size[0])
    if pre.layout != "NCHW":
        raise _bad(n, f"preprocessing.layout must be NCHW, got {pre.layout!r}")
    if pre.color not in ("RGB", "BGR"):
        raise _bad(n, f"preprocessing.color must be RGB or BGR, got {pre.color!r}")
    mean = np.asarray(pre.mean, np.float32)
    std = np.asarray(pre.std, np.float32)
    if mean.shape != (3,) or std.shape != (3,) or not np.all(np.isfinite(mean)):
        raise _bad(n, "preprocessing.mean and .std must be 3 numbers each")
    if not np.all(np.isfinite(std)) or np.any(std == 0):
        raise _bad(n, f"preprocessing.std must be finite and non-zero, got {list(pre.std)}")
    if len(spec.inputs) != 2:
        raise _bad(n, f"needs 2 inputs [target, source], the manifest lists {len(spec.inputs)}")
    if len(spec.outputs) != 1:
        raise _bad(n, f"needs 1 output, the manifest lists {len(spec.outputs)}")
    tgt, src = spec.inputs
    out = spec.outputs[0]
    for role, t in (("input 'target'", tgt), ("input 'source'", src), ("output", out)):
        if t.dtype != "float32":
            raise _bad(n, f"{role} {t.name!r} must be float32, got {t.dtype}")
    for role, t in (("input 'target'", tgt), ("output", out)):
        if len(t.shape) != 4 or [_static(d) for d in t.shape[1:]] != [3, s, s]:
            raise _bad(n, f"{role} {t.name!r} must be [N, 3, {s}, {s}], got {t.shape}")
    d = _static(src.shape[-1]) if len(src.shape) == 2 else None
    if d is None or d < 1:
        raise _bad(n, f"input 'source' {src.name!r} must be [N, D] with a fixed D, got {src.shape}")
    extra = spec.extra
    template = extra.get("template")
    if template not in TEMPLATES:
        raise _bad(n, f"extra.template must be one of {', '.join(TEMPLATES)}, got {template!r}")
    recognizer = extra.get("recognizer")
    if not isinstance(recognizer, str) or not recognizer:
        raise _bad(n, f"extra.recognizer must name a registry model, got {recognizer!r}")
    latent = extra.get("latent")
    if latent not in LATENTS:
        raise _bad(n, f"extra.latent must be one of {', '.join(LATENTS)}, got {latent!r}")
    projection = extra.get("projection")
    if projection is not None and not (
        projection == "initializer:last"
        or (isinstance(projection, str) and projection.startswith("file:")
            and projection.endswith(".npy") and _is_plain_name(projection[5:]))
    ):
        raise _bad(n, "extra.projection must be 'initializer:last', 'file:<name>.npy' (a file "
                      f"in the model directory) or absent, got {projection!r}")
    output_range = extra.get("output_range")
    if output_range not in OUTPUT_RANGES:
        raise _bad(n, f"extra.output_range must be one of {', '.join(OUTPUT_RANGES)}, "
                      f"got {output_range!r}")
    padding = extra.get("chip_padding", 0.25)
    if not isinstance(padding, int | float) or not 0.0 <= float(padding) < 2.0:
        raise _bad(n, f"extra.chip_padding must be a number in [0, 2), got {padding!r}")
    return SwapContract(
        name=n, size=s, template=str(template), padding=float(padding),
        recognizer=recognizer, latent=str(latent), latent_dims=d,
        projection=projection, output_range=str(output_range),
        mean=mean, std=std, bgr=pre.color == "BGR",
    )


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
        raise _bad(n, f"the graph's inputs are {sorted(sess_in)}, the manifest says {want_in}")
    if len(sess_out) != 1:
        raise _bad(n, f"the graph has {len(sess_out)} outputs, the contract needs 1")
    s, d = contract.size, contract.latent_dims
    checks: list[tuple[str, Any, list[int | None]]] = [
        (f"input {spec.inputs[0].name!r}", sess_in[spec.inputs[0].name], [None, 3, s, s]),
        (f"input {spec.inputs[1].name!r}", sess_in[spec.inputs[1].name], [None, d]),
        (f"output {sess_out[0].name!r}", sess_out[0], [None, 3, s, s]),
    ]
    for role, node, want in checks:
        if node.type != "tensor(float)":
            raise _bad(n, f"graph {role} is {node.type}, the contract needs tensor(float)")
        shape = list(node.shape)
        fixed_ok = all(w is None or not isinstance(g, int) or g == w
                       for g, w in zip(shape, want, strict=False))
        if len(shape) != len(want) or not fixed_ok:
            dims = ", ".join("N" if w is None else str(w) for w in want)
            raise _bad(n, f"graph {role} has shape {shape}, the contract needs [{dims}]")


# ----------------------------------------------------------------------------------------
# Alignment, crop and paste-back (pure functions)
# ----------------------------------------------------------------------------------------


def template_points(template: str, size: int) -> np.ndarray:
    """The ArcFace ``template`` in an ``size``-px chip: (5, 2) float64 pixels."""
    if template not in ARCFACE_TEMPLATES:
        raise InvalidArgumentError(f"not an ArcFace template: {template!r}")
    points, native = ARCFACE_TEMPLATES[template]
    return points * (float(size) / native)


def arcface_points(landmarks: np.ndarray) -> np.ndarray:
    """The five ArcFace points of a face from its mesh, (5, 2) float64 pixels.

    Image-left eye centre, image-right eye centre, nose tip (1), image-left mouth
    corner (61), image-right mouth corner (291). Eye centres are the iris centres
    468/473 of a 478-point mesh, the eye-corner midpoints of a 468-point one.
    """
    lm = np.asarray(landmarks, np.float64)
    if lm.ndim != 2 or lm.shape[0] < 468 or lm.shape[1] < 2:
        raise InvalidArgumentError(f"expected (468|478, 2|3) mesh landmarks, got {lm.shape}")
    if lm.shape[0] >= 478:
        return lm[list(MESH_ARCFACE_POINTS), :2].copy()
    eyes = [lm[list(pair), :2].mean(axis=0) for pair in _EYE_CORNERS]
    return np.vstack([*eyes, lm[[1, 61, 291], :2]])


def align_transform(
    landmarks: np.ndarray, template: str, size: int, padding: float = 0.25
) -> np.ndarray:
    """Image → crop affine (2, 3) float64 for a ``size``-px crop of the face.

    ArcFace templates: least-squares similarity (Umeyama) of :func:`arcface_points`
    onto :func:`template_points`. ``dlib_150``: dlib's chip geometry from the mesh
    (:func:`~facefuse.faces.align.dlib_chip_transform`) at ``size`` and ``padding``.
    """
    if template == DLIB_TEMPLATE:
        return dlib_chip_transform(landmarks, size=size, padding=padding)
    return similarity_transform(arcface_points(landmarks), template_points(template, size))


def crop_face(image: np.ndarray, M: np.ndarray, size: int) -> np.ndarray:
    """Cut a ``size``×``size`` crop with the image → crop affine ``M``.

    Reads only the crop's preimage in ``image`` (plus a small margin); when the
    crop is smaller than the face it is low-pass filtered first (Gaussian,
    sigma = (1/scale − 1)/2) so it does not alias. Beyond the image border the
    edge pixels are repeated. Returns (size, size, C) float32, 0..255.
    """
    img = np.asarray(image)
    h, w = img.shape[:2]
    A = np.asarray(M, np.float64)
    scale = math.sqrt(abs(float(np.linalg.det(A[:, :2]))))
    sigma = max(0.0, (1.0 / scale - 1.0) / 2.0) if scale > 0 else 0.0
    corners = transform_points(invert_affine(A), np.array(
        [[0.0, 0.0], [size - 1.0, 0.0], [0.0, size - 1.0], [size - 1.0, size - 1.0]]))
    margin = 3.0 * sigma + 2.0
    x0 = int(np.clip(np.floor(corners[:, 0].min() - margin), 0, w - 1))
    y0 = int(np.clip(np.floor(corners[:, 1].min() - margin), 0, h - 1))
    x1 = int(np.clip(np.ceil(corners[:, 0].max() + margin) + 1, x0 + 1, w))
    y1 = int(np.clip(np.ceil(corners[:, 1].max() + margin) + 1, y0 + 1, h))
    sub: np.ndarray = img[y0:y1, x0:x1].astype(np.float32)
    local = A.copy()
    local[:, 2] += A[:, :2] @ np.array([x0, y0], np.float64)
    if scale < 0.5:
        # Area-average down to twice the crop's resolution first (cheap on big faces);
        # a resized pixel centre x' sits at image pixel (x' + 0.5) / f - 0.5.
        f = 2.0 * scale
        sw, sh = max(1, round(sub.shape[1] * f)), max(1, round(sub.shape[0] * f))
        fx, fy = sw / sub.shape[1], sh / sub.shape[0]
        sub = cv2.resize(sub, (sw, sh), interpolation=cv2.INTER_AREA)
        to_sub = np.array([[1.0 / fx, 0.0, 0.5 / fx - 0.5], [0.0, 1.0 / fy, 0.5 / fy - 0.5]])
        local = local[:, :2] @ to_sub + np.hstack([np.zeros((2, 2)), local[:, 2:]])
        sigma = max(0.0, (1.0 / (scale / min(fx, fy)) - 1.0) / 2.0)
    if sigma > 0.3:
        sub = cv2.GaussianBlur(sub, (0, 0), sigmaX=sigma, sigmaY=sigma,
                               borderType=cv2.BORDER_REPLICATE)
    out: np.ndarray = cv2.warpAffine(sub, local, (size, size), flags=cv2.INTER_LINEAR,
                                     borderMode=cv2.BORDER_REPLICATE)
    return out.reshape(size, size, -1).astype(np.float32, copy=False)


def to_tensor(crop: np.ndarray, mean: np.ndarray, std: np.ndarray, bgr: bool) -> np.ndarray:
    """(S, S, 3) RGB 0..255 → (1, 3, S, S) float32 ``(pixel - mean) / std`` in model order."""
    c = np.asarray(crop, np.float32)
    if bgr:
        c = c[..., ::-1]
    x = (c - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


def from_tensor(output: np.ndarray, output_range: str, bgr: bool) -> np.ndarray:
    """(1, 3, S, S) or (3, S, S) model output → (S, S, 3) float32 RGB pixels, clipped to 0..255."""
    offset, scale = OUTPUT_RANGES[output_range]
    o = np.asarray(output, np.float32)
    if o.ndim == 4:
        o = o[0]
    img = (o.transpose(1, 2, 0) + offset) * scale
    if bgr:
        img = img[..., ::-1]
    out: np.ndarray = np.clip(img, 0.0, 255.0).astype(np.float32)
    return out


def paste_back(
    crop: np.ndarray, M: np.ndarray, region: masks.Region, feather: float
) -> tuple[np.ndarray, np.ndarray]:
    """Warp a crop back into ``region`` of the image by the inverse of ``M``.

    Args:
        crop: (S, S, 3) float32 pixels.
        M: (2, 3) image → crop affine the crop was cut with.
        region: ``(x0, y0, x1, y1)`` image pixels.
        feather: width (pixels) of the ramp inside the crop's edge.

    Returns:
        ``(face, valid)``: (h, w, 3) float32 pixels over the region and (h, w)
        float32 crop-validity in [0, 1] — 0 where the region is not covered by
        the crop, rising smoothly to 1 over ``feather`` pixels inside its edge.
    """
    x0, y0, x1, y1 = region
    size = crop.shape[0]
    local = np.asarray(M, np.float64).copy()  # region pixel → crop pixel
    local[:, 2] += local[:, :2] @ np.array([x0, y0], np.float64)
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    face = cv2.warpAffine(np.asarray(crop, np.float32), local, (x1 - x0, y1 - y0), flags=flags,
                          borderMode=cv2.BORDER_REPLICATE)
    cover = cv2.warpAffine(np.ones((size, size), np.float32), local, (x1 - x0, y1 - y0),
                           flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
    inside = (cover > 0.999).astype(np.uint8)
    dist = cv2.distanceTransform(inside, cv2.DIST_L2, 5)
    ramp = np.clip(dist / max(float(feather), 1.0), 0.0, 1.0)
    valid = (ramp * ramp * (3.0 - 2.0 * ramp)).astype(np.float32)  # smoothstep
    return face.reshape(y1 - y0, x1 - x0, -1).astype(np.float32, copy=False), valid


def project_latent(vector: np.ndarray, projection: np.ndarray | None) -> np.ndarray:
    """The source latent: ``vector`` (D_in,) as is, or ``v @ P / |v @ P|`` with P (D_in, D).

    Returns (D,) float32.
    """
    v = np.asarray(vector, np.float64).reshape(-1)
    if projection is None:
        return v.astype(np.float32)
    return normalize((v @ np.asarray(projection, np.float64)).astype(np.float32))


# ----------------------------------------------------------------------------------------
# The last initializer of an ONNX file, without the onnx package
# ----------------------------------------------------------------------------------------

_ONNX_DTYPES: dict[int, np.dtype[Any]] = {
    1: np.dtype("<f4"), 10: np.dtype("<f2"), 11: np.dtype("<f8")}


def _varint(buf: Any, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("bad varint")


def _fields(buf: Any, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """Protobuf fields in ``buf[start:end]`` as ``(number, wire_type, value_or_start, end)``:
    varints and fixed-width values give ``(value, -1)``, length-delimited ``(start, end)``."""
    out: list[tuple[int, int, int, int]] = []
    i = start
    while i < end:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            out.append((number, wire, value, -1))
        elif wire == 2:
            length, i = _varint(buf, i)
            if i + length > end:
                raise ValueError("truncated field")
            out.append((number, wire, i, i + length))
            i += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            out.append((number, wire, int.from_bytes(bytes(buf[i:i + width]), "little"), -1))
            i += width
        else:
            raise ValueError(f"unsupported wire type {wire}")
    if i != end:
        raise ValueError("truncated message")
    return out


def _tensor(blob: bytes) -> np.ndarray:
    """Decode a serialized ``onnx.TensorProto`` (dims, data_type, float/double/raw data)."""
    dims: list[int] = []
    dtype_code = 0
    raw: bytes | None = None
    floats: list[float] = []
    doubles: list[float] = []
    int32s: list[int] = []  # float16 values as uint16 bit patterns
    for number, wire, a, b in _fields(blob, 0, len(blob)):
        if number == 1:  # dims: packed or not
            if wire == 2:
                j = a
                while j < b:
                    v, j = _varint(blob, j)
                    dims.append(v)
            else:
                dims.append(a)
        elif number == 2:
            dtype_code = a
        elif number == 4 and wire == 2:  # float_data, packed
            floats.extend(np.frombuffer(blob[a:b], "<f4").tolist())
        elif number == 4 and wire == 5:
            floats.append(float(np.frombuffer(a.to_bytes(4, "little"), "<f4")[0]))
        elif number == 5 and wire == 2:  # int32_data, packed
            j = a
            while j < b:
                v, j = _varint(blob, j)
                int32s.append(v)
        elif number == 5 and wire == 0:
            int32s.append(a)
        elif number == 10 and wire == 2:  # double_data, packed
            doubles.extend(np.frombuffer(blob[a:b], "<f8").tolist())
        elif number == 9:
            raw = blob[a:b]
        elif number == 14 and a == 1:
            raise ValueError("the tensor's data is stored outside the model file")
    if dtype_code not in _ONNX_DTYPES:
        raise ValueError(f"unsupported initializer data type {dtype_code}")
    dtype = _ONNX_DTYPES[dtype_code]
    if raw is not None:
        arr = np.frombuffer(raw, dtype).astype(np.float32)
    elif dtype_code == 11:
        arr = np.asarray(doubles, np.float32)
    elif dtype_code == 10:
        arr = np.asarray(int32s, np.uint16).view(np.float16).astype(np.float32)
    else:
        arr = np.asarray(floats, np.float32)
    count = int(np.prod(dims)) if dims else 1
    if arr.size != count:
        raise ValueError(f"initializer has {arr.size} values for dims {dims}")
    out: np.ndarray = arr.reshape(dims)
    return out


def last_initializer(path: Path) -> np.ndarray:
    """The last graph initializer of an ONNX file as float32 (e.g. inswapper's ``emap``).

    A minimal protobuf reader (ModelProto.graph = 7, GraphProto.initializer = 5),
    so the ``onnx`` package is not needed at run time; the file is memory-mapped
    and only the graph's field headers and the one tensor are read.

    Raises:
        ModelCorruptError: the file cannot be parsed or has no such initializer.
    """
    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            last: tuple[int, int] | None = None
            for number, wire, a, b in _fields(mm, 0, len(mm)):
                if number == 7 and wire == 2:  # graph
                    for gnum, gwire, ga, gb in _fields(mm, a, b):
                        if gnum == 5 and gwire == 2:
                            last = (ga, gb)
            if last is None:
                raise ValueError("the graph has no initializers")
            blob = mm[last[0]:last[1]]
        return _tensor(blob)
    except (ValueError, IndexError, OSError) as exc:
        raise ModelCorruptError(f"cannot read the last initializer of {path}: {exc}",
                                code="swap_contract") from exc


# ----------------------------------------------------------------------------------------
# The swapper
# ----------------------------------------------------------------------------------------


#: Source embeddings an ONNX swapper keeps (faces are immutable and shared, so
#: the cache lives here, keyed by the face's mesh and image size).
EMBEDDING_CACHE_SIZE = 8


def _face_digest(rgb: np.ndarray, face: Face) -> str:
    h = hashlib.blake2b(str(rgb.shape).encode(), digest_size=16)
    h.update(np.ascontiguousarray(face.landmarks if face.landmarks is not None
                                  else face.bbox).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class _Loaded:
    contract: SwapContract
    model: LoadedModel
    projection: np.ndarray | None
    #: The recognizer model when it is not the analyser's (None: use Face.embedding).
    recognizer: LoadedModel | None


class OnnxSwapper:
    """A manifest ``task: "swap"`` model as a :class:`~facefuse.fusion.swappers.base.Swapper`.

    Nothing is loaded until the first :meth:`render`: the entry is then checked
    against the contract, the model file verified (sha256) and its session built
    through the registry. Thread-safe.
    """

    def __init__(self, registry: ModelRegistry, name: str) -> None:
        self.registry = registry
        self.name = name
        self._lock = threading.Lock()
        self._loaded: _Loaded | None = None
        self._generation = -1
        self._embeddings: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()

    def load(self) -> _Loaded:
        """Check and load the model (once per registry generation); raises typed errors."""
        loaded = self._loaded
        if loaded is not None and self._generation == self.registry.generation:
            return loaded
        with self._lock:
            if self._loaded is None or self._generation != self.registry.generation:
                generation = self.registry.generation
                self._loaded = self._load()
                self._generation = generation
            return self._loaded

    def _load(self) -> _Loaded:
        spec = self.registry.manifest.get(self.name)
        contract = parse_contract(spec)
        rec_name = contract.recognizer
        if not self.registry.has(rec_name):
            raise ModelMissingError(
                f"swap model {self.name!r} needs the recognizer {rec_name!r}, which is not in "
                "the model manifest", code="swap_recognizer_missing")
        rec_spec = self.registry.manifest.get(rec_name)
        if rec_spec.task != EMBED_TASK:
            raise _bad(self.name, f"extra.recognizer {rec_name!r} is a {rec_spec.task!r} "
                                  f"model, not {EMBED_TASK!r}")
        rec_dims = _static(rec_spec.outputs[0].shape[-1]) if rec_spec.outputs else None
        model = self.registry.get(self.name)
        check_session(contract, spec, model)
        projection = self._projection(contract, model)
        d_in = rec_dims if projection is None else int(projection.shape[0])
        if projection is not None and rec_dims is not None and projection.shape[0] != rec_dims:
            raise _bad(self.name, f"the projection is {projection.shape[0]}×{projection.shape[1]}"
                                  f" but the recognizer {rec_name!r} gives {rec_dims} values")
        d_out = contract.latent_dims if projection is None else int(projection.shape[1])
        if projection is None and d_in is not None and d_in != contract.latent_dims:
            raise _bad(self.name, f"the source input takes {contract.latent_dims} values but "
                                  f"the recognizer {rec_name!r} gives {d_in} (and there is no "
                                  "projection)")
        if d_out != contract.latent_dims:
            raise _bad(self.name, f"the projection gives {d_out} values but the source input "
                                  f"takes {contract.latent_dims}")
        recognizer = None if rec_name == ANALYSER_RECOGNIZER else self.registry.get(rec_name)
        return _Loaded(contract, model, projection, recognizer)

    def _projection(self, contract: SwapContract, model: LoadedModel) -> np.ndarray | None:
        p = contract.projection
        if p is None:
            return None
        if p == "initializer:last":
            mat = last_initializer(model.path)
            where = "the model's last initializer"
        else:
            path = self.registry.models_dir / p[len("file:"):]
            if not path.is_file():
                raise ModelMissingError(f"projection file {path} of swap model {self.name!r} is "
                                        "missing", code="swap_projection_missing")
            want = self.registry.manifest.get(self.name).extra.get("projection_sha256")
            if want is not None and sha256_file(path) != want:
                raise ModelCorruptError(f"projection file {path} of swap model {self.name!r} "
                                        "does not match extra.projection_sha256",
                                        code="swap_projection_corrupt")
            try:
                mat = np.load(path, allow_pickle=False)
            except (ValueError, OSError) as exc:
                raise _bad(self.name, f"cannot read projection {path.name}: {exc}") from exc
            where = path.name
        if mat.ndim != 2 or not np.issubdtype(mat.dtype, np.floating) or mat.size == 0:
            raise _bad(self.name, f"projection ({where}) must be a 2-D float matrix "
                                  f"(D_in, D), got {mat.dtype} {mat.shape}")
        if not np.all(np.isfinite(mat)):
            raise _bad(self.name, f"projection ({where}) has non-finite values")
        return np.asarray(mat, np.float32)

    # ---- the source latent ------------------------------------------------------------

    def source_latent(self, source_rgb: np.ndarray, source_face: Face) -> np.ndarray:
        """The model's source input for this face: (1, D) float32."""
        loaded = self.load()
        c = loaded.contract
        raw = self._embedding(loaded, source_rgb, source_face)
        v = raw if c.latent == "embedding" else normalize(raw)
        return project_latent(v, loaded.projection)[None]

    def _embedding(self, loaded: _Loaded, rgb: np.ndarray, face: Face) -> np.ndarray:
        """The recognizer's raw vector for ``face`` (the last few cached: one source
        face is rendered into every chosen target face)."""
        if loaded.recognizer is None:
            raw = face.embedding_raw if face.embedding_raw is not None else face.embedding
            if raw is None:
                raise InvalidArgumentError("the source face has no embedding",
                                           code="source_no_embedding")
            return np.asarray(raw, np.float32)
        key = (loaded.contract.recognizer, _face_digest(rgb, face))
        with self._lock:
            cached = self._embeddings.get(key)
        if cached is not None:
            return cached
        vec = recognizer_embedding(loaded.recognizer, rgb, face)
        with self._lock:
            self._embeddings[key] = vec
            while len(self._embeddings) > EMBEDDING_CACHE_SIZE:
                self._embeddings.popitem(last=False)
        return vec

    # ---- rendering --------------------------------------------------------------------

    def render(
        self,
        source_rgb: np.ndarray,
        source_face: Face,
        target_rgb: np.ndarray,
        target_face: Face,
        options: FuseOptions,
    ) -> FaceLayer:
        """The swapped face over the target face's region (see the module docstring)."""
        assert target_face.landmarks is not None
        loaded = self.load()
        c = loaded.contract
        latent = self.source_latent(source_rgb, source_face)
        tgt_lm = target_face.landmarks.astype(np.float64)
        M = align_transform(tgt_lm, c.template, c.size, c.padding)
        crop = crop_face(target_rgb, M, c.size)
        out = loaded.model.run(to_tensor(crop, c.mean, c.std, c.bgr), latent)[0]
        swapped_crop = from_tensor(out, c.output_range, c.bgr)
        feather = masks.feather_px(tgt_lm)
        region = masks.face_region(tgt_lm, target_rgb.shape, 2 * feather)
        x0, y0, x1, y1 = region
        bg = target_rgb[y0:y1, x0:x1].astype(np.float32)
        swapped, valid = paste_back(swapped_crop, M, region, feather)
        # Where the crop does not reach, the layer is the target itself, so no blend
        # level ever sees the border-repeated crop edge.
        swapped = bg + valid[..., None] * (swapped - bg)
        mask = masks.oval_mask(tgt_lm, region, feather) * valid
        face = bg + np.float32(options.texture_weight) * (swapped - bg)
        return FaceLayer(region, face.astype(np.float32), mask.astype(np.float32), tgt_lm)


def recognizer_embedding(model: LoadedModel, rgb: np.ndarray, face: Face) -> np.ndarray:
    """Raw embedding (D,) float32 of ``face`` by a registry recognizer other than dlib's.

    The chip follows the recognizer's manifest entry: ``preprocessing`` (size,
    mean, std, colour) and ``extra.template`` (default ``arcface_112`` for 112-px
    multiples, ``arcface_128`` for 128-px multiples, else ``dlib_150`` with
    ``extra.chip_padding``).
    """
    assert face.landmarks is not None
    spec = model.spec
    pre = spec.preprocessing
    size = int(pre.size[0])
    template = spec.extra.get("template")
    if template not in TEMPLATES:
        template = ("arcface_112" if size % 112 == 0 else
                    "arcface_128" if size % 128 == 0 else DLIB_TEMPLATE)
    padding = float(spec.extra.get("chip_padding", 0.25))
    M = align_transform(face.landmarks, str(template), size, padding)
    chip = crop_face(rgb, M, size)
    x = to_tensor(chip, np.asarray(pre.mean, np.float32), np.asarray(pre.std, np.float32),
                  pre.color == "BGR")
    return np.asarray(model.run(x)[0], np.float32).reshape(-1)
