"""Convert dlib's ResNet face-recognition network (``.dat``) to ONNX.

This module reads dlib's own binary serialisation with our own parser (dlib is
not needed at run time or build time) and writes an equivalent ONNX graph.

The network is dlib's ``anet_type`` from ``dnn_face_recognition_ex.cpp``::

    loss_metric<fc_no_bias<128, avg_pool_everything<
        alevel0<alevel1<alevel2<alevel3<alevel4<
        max_pool<3,3,2,2, relu<affine<con<32,7,7,2,2,
        input_rgb_image_sized<150>>>>>>>>>>>>>

with residual blocks ``ares`` (identity shortcut) and ``ares_down`` (stride-2
block, shortcut through a 2×2 average pool). dlib adds two tensors of different
shapes by treating missing entries as zero: the shortcut of a down-sampling
block has fewer channels (and at the 256-channel stages one row/column more)
than the block output, so the graph pads both operands with trailing zeros to
the element-wise maximum shape before ``Add``.

ONNX model: input ``input`` float32 ``[N, 3, 150, 150]`` raw RGB pixel values
0..255; output ``embedding`` float32 ``[N, 128]``, dlib's raw (not unit-norm)
descriptor, whose Euclidean distances dlib thresholds at 0.6. The per-channel
mean subtraction and the ``/256`` scale of ``input_rgb_image_sized`` are the
first two nodes of the graph; dlib's ``affine`` layers (frozen batch norm) are
folded into the preceding convolutions.

The serialisation format (dlib/serialize.h, dlib/dnn/{core,layers,input,
tensor}.h):

* integers: one control byte (low nibble = byte count, bit 7 = negative), then
  the magnitude little-endian;
* floats/doubles: ``mantissa`` (int) and ``exponent`` (int), value
  ``mantissa * 2**exponent``;
* strings: length (int) + bytes; bools: the character ``'0'`` / ``'1'``;
* tensors: version 2, ``n, k, nr, nc`` (ints), then raw little-endian float32;
* a layer is written as ``version, subnetwork, details, state…`` — so the
  innermost layer's details come first, i.e. in forward order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from facefuse.errors import BuildError
from facefuse.toolchain.build.onnx_graph import GraphBuilder, save_checked

OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17; loadable by older runtimes
INPUT_NAME = "input"
OUTPUT_NAME = "embedding"

# ----------------------------------------------------------------------------------------
# Byte-level reader for dlib's serialisation format
# ----------------------------------------------------------------------------------------

_FLOAT_IS_INF, _FLOAT_IS_NINF, _FLOAT_IS_NAN = 32000, 32001, 32002


class _Reader:
    """A cursor over the bytes of a dlib-serialised object."""

    def __init__(self, data: bytes, name: str) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.name = name

    def fail(self, what: str) -> BuildError:
        return BuildError(f"{self.name}: {what} at byte {self.pos}; not dlib's ResNet model?")

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"unexpected end of file reading {n} bytes")
        out = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return out

    def read_int(self) -> int:
        """A (signed or unsigned) integer in dlib's compact encoding."""
        control = self.take(1)[0]
        size = control & 0x0F
        if size > 8 or control & 0x70:
            raise self.fail(f"bad integer control byte {control:#04x}")
        value = int.from_bytes(self.take(size), "little") if size else 0
        return -value if control & 0x80 else value

    def read_float(self) -> float:
        """A float/double stored as ``mantissa * 2**exponent``."""
        mantissa = self.read_int()
        exponent = self.read_int()
        if exponent == _FLOAT_IS_INF:
            return math.inf
        if exponent == _FLOAT_IS_NINF:
            return -math.inf
        if exponent == _FLOAT_IS_NAN:
            return math.nan
        return math.ldexp(float(mantissa), exponent)

    def read_string(self) -> str:
        size = self.read_int()
        if not 0 <= size <= 1 << 16:
            raise self.fail(f"implausible string length {size}")
        return self.take(size).decode("latin-1")

    def read_bool(self) -> bool:
        ch = self.take(1)
        if ch not in (b"0", b"1"):
            raise self.fail(f"bad bool byte {ch!r}")
        return ch == b"1"

    def version(self, accepted: Sequence[int], what: str) -> int:
        v = self.read_int()
        if v not in accepted:
            raise self.fail(f"unsupported {what} version {v}")
        return v

    def tag(self, accepted: Sequence[str], what: str) -> str:
        s = self.read_string()
        if s not in accepted:
            raise self.fail(f"expected {what} ({'/'.join(accepted)}), found {s!r}")
        return s

    def read_tensor(self) -> np.ndarray:
        """A ``resizable_tensor``: float32 array of shape ``(n, k, nr, nc)``."""
        self.version((2,), "tensor")
        shape = tuple(self.read_int() for _ in range(4))
        if any(d < 0 for d in shape):
            raise self.fail(f"negative tensor shape {shape}")
        count = int(np.prod(shape))
        raw = self.take(4 * count)
        return np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(shape)

    def read_alias_tensor(self) -> tuple[int, int, int, int]:
        """An ``alias_tensor`` (a view's shape only): ``(n, k, nr, nc)``."""
        self.version((1,), "alias_tensor")
        n, k, nr, nc = (self.read_int() for _ in range(4))
        return n, k, nr, nc


# ----------------------------------------------------------------------------------------
# Layers, in forward order
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InputLayer:
    """``input_rgb_image_sized``: ``(pixel - mean) / 256`` per RGB channel."""

    mean: tuple[float, float, float]
    size: tuple[int, int]  # rows, cols


@dataclass(frozen=True)
class Conv:
    """``con_``: weight ``(out, in, kh, kw)``, bias ``(out,)``; stride/pad ``(y, x)``."""

    weight: np.ndarray
    bias: np.ndarray
    stride: tuple[int, int]
    pad: tuple[int, int]


@dataclass(frozen=True)
class Affine:
    """``affine_`` in conv mode: ``x * gamma[k] + beta[k]`` (frozen batch norm)."""

    gamma: np.ndarray
    beta: np.ndarray


@dataclass(frozen=True)
class Relu:
    pass


@dataclass(frozen=True)
class Pool:
    """``max_pool_`` / ``avg_pool_``; ``kernel == (0, 0)`` pools the whole map."""

    mode: str  # "max" | "avg"
    kernel: tuple[int, int]
    stride: tuple[int, int]
    pad: tuple[int, int]


@dataclass(frozen=True)
class Tag:
    """``tagN``: remember the current tensor under ``id``."""

    id: int


@dataclass(frozen=True)
class Skip:
    """``skipN``: continue from the tensor remembered under ``id``."""

    id: int


@dataclass(frozen=True)
class AddPrev:
    """``add_prevN``: current + tagged tensor, zero-padding the smaller one."""

    id: int


@dataclass(frozen=True)
class Dense:
    """``fc_``: ``y = x @ weight (+ bias)``; weight ``(inputs, outputs)``."""

    weight: np.ndarray
    bias: np.ndarray | None


Layer = InputLayer | Conv | Affine | Relu | Pool | Tag | Skip | AddPrev | Dense


@dataclass(frozen=True)
class _Spec:
    """One node of the network *type* (dlib's template nesting, outermost first)."""

    kind: str
    sub: _Spec | None = None
    id: int = 0


def _block(sub: _Spec) -> _Spec:
    # block<N,affine,stride,SUB> = affine<con<N,3,3,1,1,relu<affine<con<N,3,3,s,s,SUB>>>>>
    return _Spec("affine", _Spec("con", _Spec("relu", _Spec("affine", _Spec("con", sub)))))


def _ares(sub: _Spec) -> _Spec:
    # relu<add_prev1<block<tag1<SUB>>>>
    return _Spec("relu", _Spec("add_prev", _block(_Spec("tag", sub, 1)), 1))


def _ares_down(sub: _Spec) -> _Spec:
    # relu<add_prev2<avg_pool<2,2,2,2,skip1<tag2<block<tag1<SUB>>>>>>>
    inner = _Spec("tag", _block(_Spec("tag", sub, 1)), 2)
    return _Spec("relu", _Spec("add_prev", _Spec("avg_pool", _Spec("skip", inner, 1)), 2))


def anet_spec() -> _Spec:
    """dlib's ``anet_type`` (dnn_face_recognition_ex.cpp) as a nesting of layer kinds."""
    net = _Spec("input")
    net = _Spec("con", net)
    net = _Spec("affine", net)
    net = _Spec("relu", net)
    net = _Spec("max_pool", net)
    for _ in range(3):  # alevel4: ares<32> x3
        net = _ares(net)
    for n_plain in (3, 2, 2, 0):  # alevel3 (64), alevel2 (128), alevel1 (256), alevel0 (256)
        net = _ares_down(net)
        for _ in range(n_plain):
            net = _ares(net)
    net = _Spec("avg_pool", net)  # avg_pool_everything
    net = _Spec("fc", net)
    return _Spec("loss", net)


# ----------------------------------------------------------------------------------------
# Parsing
# ----------------------------------------------------------------------------------------


def _read_input_layer(r: _Reader) -> InputLayer:
    r.tag(("input_rgb_image_sized",), "input layer")
    mean = (r.read_float(), r.read_float(), r.read_float())
    rows, cols = r.read_int(), r.read_int()
    return InputLayer(mean=mean, size=(rows, cols))


def _read_con(r: _Reader) -> Conv:
    r.tag(("con_4",), "convolution")
    params = r.read_tensor().reshape(-1)
    num_filters, nr, nc = r.read_int(), r.read_int(), r.read_int()
    stride = (r.read_int(), r.read_int())
    pad = (r.read_int(), r.read_int())
    fshape = r.read_alias_tensor()
    bshape = r.read_alias_tensor()
    for _ in range(4):  # learning-rate / weight-decay multipliers
        r.read_float()
    nweights = int(np.prod(fshape))
    if fshape[0] != num_filters or fshape[2:] != (nr, nc) or bshape[1] != num_filters:
        raise r.fail(f"inconsistent convolution shapes {fshape} / {bshape}")
    if params.size != nweights + num_filters:
        raise r.fail("convolution parameter count mismatch")
    weight = params[:nweights].reshape(fshape).copy()
    bias = params[nweights:].copy()
    return Conv(weight=weight, bias=bias, stride=stride, pad=pad)


def _read_affine(r: _Reader) -> Affine:
    version = r.tag(("affine_", "affine_2"), "affine layer")
    params = r.read_tensor().reshape(-1)
    gshape = r.read_alias_tensor()
    r.read_alias_tensor()
    mode = r.read_int()
    if version == "affine_2" and r.read_bool():
        raise r.fail("disabled affine layers are not supported")
    if mode != 0:  # CONV_MODE == 0: one gamma/beta per channel
        raise r.fail(f"affine mode {mode} (expected conv mode)")
    k = int(np.prod(gshape))
    if params.size != 2 * k:
        raise r.fail("affine parameter count mismatch")
    return Affine(gamma=params[:k].copy(), beta=params[k:].copy())


def _read_pool(r: _Reader, mode: str) -> Pool:
    r.tag((f"{mode}_pool_2",), f"{mode} pool")
    kernel = (r.read_int(), r.read_int())
    stride = (r.read_int(), r.read_int())
    pad = (r.read_int(), r.read_int())
    return Pool(mode=mode, kernel=kernel, stride=stride, pad=pad)


def _read_fc(r: _Reader) -> Dense:
    r.tag(("fc_2",), "fully connected layer")
    num_outputs, num_inputs = r.read_int(), r.read_int()
    params = r.read_tensor().reshape(-1)
    r.read_alias_tensor()  # weights view
    r.read_alias_tensor()  # biases view
    bias_mode = r.read_int()  # FC_HAS_BIAS = 0, FC_NO_BIAS = 1
    for _ in range(4):
        r.read_float()
    rows = num_inputs + (1 if bias_mode == 0 else 0)
    if params.size != rows * num_outputs:
        raise r.fail("fc parameter count mismatch")
    mat = params.reshape(rows, num_outputs)
    if bias_mode == 0:
        return Dense(weight=mat[:num_inputs].copy(), bias=mat[num_inputs].copy())
    return Dense(weight=mat.copy(), bias=None)


def _read_details(r: _Reader, spec: _Spec) -> Layer:
    """The ``details`` object of an ``add_layer`` (the layer's own parameters)."""
    kind = spec.kind
    if kind == "con":
        return _read_con(r)
    if kind == "affine":
        return _read_affine(r)
    if kind == "relu":
        r.tag(("relu_",), "relu")
        return Relu()
    if kind == "max_pool":
        return _read_pool(r, "max")
    if kind == "avg_pool":
        return _read_pool(r, "avg")
    if kind == "fc":
        return _read_fc(r)
    if kind == "add_prev":
        r.tag(("add_prev_",), "add_prev")
        return AddPrev(spec.id)
    raise r.fail(f"no reader for layer kind {kind!r}")


def _skip_layer_state(r: _Reader, version: int, *, input_layer: bool) -> None:
    """The bookkeeping an ``add_layer`` writes after its details (flags + caches)."""
    for _ in range(3):  # setup_called, gradient_input_is_stale, output_getters_disabled
        r.read_bool()
    r.read_tensor()  # x_grad
    r.read_tensor()  # cached_output
    if input_layer:
        r.read_tensor()  # grad_final
        if version >= 3:
            r.read_int()  # _sample_expansion_factor
    else:
        r.read_tensor()  # params_grad (add_layer version 2)


def _parse(r: _Reader, spec: _Spec) -> list[Layer]:
    """Read the layer described by ``spec``; return its layers in forward order."""
    kind, sub = spec.kind, spec.sub
    if kind == "loss":
        assert sub is not None
        r.version((1,), "add_loss_layer")
        loss = r.tag(("loss_metric_", "loss_metric_2"), "loss_metric")
        if loss == "loss_metric_2":
            r.read_float()  # margin
            r.read_float()  # distance threshold
        return _parse(r, sub)
    if kind in ("tag", "skip"):
        assert sub is not None
        r.version((1,), f"add_{kind}_layer")
        tagged = _parse(r, sub)
        tagged.append(Tag(spec.id) if kind == "tag" else Skip(spec.id))
        return tagged
    assert sub is not None
    if sub.kind == "input":
        version = r.version((2, 3), "add_layer (input)")
        head: list[Layer] = [_read_input_layer(r), _read_details(r, spec)]
        _skip_layer_state(r, version, input_layer=True)
        return head
    version = r.version((2,), "add_layer")
    layers = _parse(r, sub)
    layers.append(_read_details(r, spec))
    _skip_layer_state(r, version, input_layer=False)
    return layers


def read_dlib_resnet(dat_path: Path) -> list[Layer]:
    """Parse dlib's ``dlib_face_recognition_resnet_model_v1.dat`` into layers (forward order).

    Raises :class:`~facefuse.errors.BuildError` if the file is not that network.
    """
    r = _Reader(Path(dat_path).read_bytes(), str(dat_path))
    layers = _parse(r, anet_spec())
    if r.pos != len(r.data):
        raise r.fail(f"{len(r.data) - r.pos} trailing bytes")
    return layers


# ----------------------------------------------------------------------------------------
# ONNX graph
# ----------------------------------------------------------------------------------------


def _fold(layers: list[Layer]) -> list[Layer]:
    """Fold every ``affine`` that directly follows a ``con`` into that convolution."""
    out: list[Layer] = []
    for layer in layers:
        prev = out[-1] if out else None
        if isinstance(layer, Affine) and isinstance(prev, Conv):
            g = layer.gamma.astype(np.float64)
            w = prev.weight.astype(np.float64) * g[:, None, None, None]
            b = prev.bias.astype(np.float64) * g + layer.beta.astype(np.float64)
            out[-1] = Conv(w.astype(np.float32), b.astype(np.float32), prev.stride, prev.pad)
        else:
            out.append(layer)
    return out


#: A feature map's (channels, rows, cols); the batch dim stays symbolic.
Shape = tuple[int, int, int]


class _Graph(GraphBuilder):
    """The shared builder plus dlib's zero-padding of residual operands."""

    def pad_to(self, name: str, shape: Shape, target: Shape) -> str:
        """Zero-pad ``name`` (shape ``(C, H, W)``) at the end of each dim up to ``target``."""
        if shape == target:
            return name
        ends = [t - s for s, t in zip(shape, target, strict=True)]
        pads = self.const("pads", np.array([0, 0, 0, 0, 0, *ends], np.int64))
        return self.node("Pad", [name, pads], "padded", mode="constant")


def _out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


@dataclass
class _Emitter:
    """Emits the ONNX nodes of the parsed layers one at a time, tracking the current
    tensor, its (C, H, W) shape (the batch dim stays symbolic) and the tagged ones."""

    g: _Graph
    cur: str
    shape: Shape
    tags: dict[int, tuple[str, Shape]] = field(default_factory=dict)
    flat: bool = False

    def emit(self, layer: Layer) -> None:
        handlers: dict[type, Any] = {
            Conv: self.conv, Affine: self.affine, Relu: self.relu, Pool: self.pool,
            Tag: self.tag, Skip: self.skip, AddPrev: self.add_prev, Dense: self.dense,
        }
        handler = handlers.get(type(layer))
        if handler is None:
            raise BuildError(f"unsupported layer {layer!r}")
        handler(layer)

    def conv(self, layer: Conv) -> None:
        o, i, kh, kw = layer.weight.shape
        if i != self.shape[0]:
            raise BuildError(f"conv expects {i} channels, got {self.shape[0]}")
        (sy, sx), (py, px) = layer.stride, layer.pad
        g = self.g
        self.cur = g.node(
            "Conv", [self.cur, g.const("w", layer.weight), g.const("b", layer.bias)], "conv",
            kernel_shape=[kh, kw], strides=[sy, sx], pads=[py, px, py, px],
        )
        self.shape = (o, _out_size(self.shape[1], kh, sy, py),
                      _out_size(self.shape[2], kw, sx, px))

    def affine(self, layer: Affine) -> None:  # not after a conv: kept as Mul + Add
        g = self.g
        self.cur = g.node("Mul", [self.cur, g.const("gamma", layer.gamma.reshape(1, -1, 1, 1))],
                          "mul")
        self.cur = g.node("Add", [self.cur, g.const("beta", layer.beta.reshape(1, -1, 1, 1))],
                          "add")

    def relu(self, layer: Relu) -> None:
        self.cur = self.g.node("Relu", [self.cur], "relu")

    def pool(self, layer: Pool) -> None:
        if layer.kernel == (0, 0):
            if layer.mode != "avg":
                raise BuildError("only average pooling over everything is supported")
            self.cur = self.g.node("GlobalAveragePool", [self.cur], "gap")
            self.cur = self.g.node("Flatten", [self.cur], "flat", axis=1)
            self.shape, self.flat = (self.shape[0], 1, 1), True
            return
        (kh, kw), (sy, sx), (py, px) = layer.kernel, layer.stride, layer.pad
        attrs: dict[str, Any] = {
            "kernel_shape": [kh, kw], "strides": [sy, sx], "pads": [py, px, py, px],
        }
        if layer.mode == "avg":
            attrs["count_include_pad"] = 0
        op = "MaxPool" if layer.mode == "max" else "AveragePool"
        self.cur = self.g.node(op, [self.cur], f"{layer.mode}pool", **attrs)
        self.shape = (self.shape[0], _out_size(self.shape[1], kh, sy, py),
                      _out_size(self.shape[2], kw, sx, px))

    def tag(self, layer: Tag) -> None:
        self.tags[layer.id] = (self.cur, self.shape)

    def skip(self, layer: Skip) -> None:
        self.cur, self.shape = self.tags[layer.id]

    def add_prev(self, layer: AddPrev) -> None:
        other, other_shape = self.tags[layer.id]
        target: Shape = (
            max(self.shape[0], other_shape[0]),
            max(self.shape[1], other_shape[1]),
            max(self.shape[2], other_shape[2]),
        )
        a = self.g.pad_to(self.cur, self.shape, target)
        b = self.g.pad_to(other, other_shape, target)
        self.cur, self.shape = self.g.node("Add", [a, b], "residual"), target

    def dense(self, layer: Dense) -> None:
        if not self.flat or layer.weight.shape[0] != self.shape[0]:
            raise BuildError("fc layer must follow avg_pool_everything")
        w = self.g.const("fc_w", layer.weight)
        if layer.bias is None:
            self.cur = self.g.node("MatMul", [self.cur, w], "fc")
        else:
            self.cur = self.g.node("Gemm", [self.cur, w, self.g.const("fc_b", layer.bias)], "fc")
        self.shape = (layer.weight.shape[1], 1, 1)


def build_onnx(layers: list[Layer]) -> Any:
    """Build the ONNX ``ModelProto`` for parsed layers (see the module docstring)."""
    from onnx import TensorProto, helper

    if not layers or not isinstance(layers[0], InputLayer):
        raise BuildError("network does not start with an input layer")
    g = _Graph()
    first = layers[0]
    rows, cols = first.size
    mean = np.asarray(first.mean, np.float32).reshape(1, 3, 1, 1)
    cur = g.node("Sub", [INPUT_NAME, g.const("mean", mean)], "centred")
    cur = g.node("Mul", [cur, g.const("scale", np.full((1,), 1 / 256, np.float32))], "scaled")
    out = _Emitter(g, cur, (3, rows, cols))
    for layer in _fold(layers[1:]):
        out.emit(layer)
    if not out.flat:
        raise BuildError("network does not end in a vector")
    g.nodes.append(helper.make_node("Identity", [out.cur], [OUTPUT_NAME]))
    graph = helper.make_graph(
        g.nodes,
        "dlib_face_recognition_resnet_model_v1",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", 3, rows, cols])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["N", out.shape[0]])],
        g.inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="facefuse",
        doc_string=(
            "dlib face recognition ResNet (dlib_face_recognition_resnet_model_v1, CC0) converted "
            "by facefuse. Input: RGB 0..255 NCHW 150x150 chips aligned like dlib.get_face_chip; "
            "output: dlib's raw 128-D descriptor (same person below 0.6 Euclidean)."
        ),
    )
    model.ir_version = IR_VERSION
    return model


def convert_dlib_resnet(dat_path: Path, onnx_path: Path) -> None:
    """Parse dlib's ResNet ``.dat`` and write the equivalent ONNX model to ``onnx_path``.

    Input ``input`` float32 [N,3,150,150] RGB 0..255; output ``embedding`` float32
    [N,128] (dlib's raw descriptor). Raises :class:`~facefuse.errors.BuildError`
    for a file that is not this network.
    """
    save_checked(build_onnx(read_dlib_resnet(Path(dat_path))), onnx_path)
