"""Build YuNet (libfacedetection's 2023 face detector) as ONNX from its compiled weights.

libfacedetection (Shiqi Yu et al., BSD-3-Clause) compiles its CNN's weights
into the library as 106 named ``float`` arrays (53 convolutions × weight and
bias, ~53k parameters) plus a table ``param_pConvInfo`` describing each
convolution (input channels, filters, depthwise or pointwise) and pointing to
its arrays. :func:`read_yunet` reads both with our ELF reader (the library is
never loaded or run); :func:`build_onnx` writes the network as ONNX with our
own graph code, following ``objectdetect_cnn`` in
``src/facedetectcnn-model.cpp``:

* **Head**: a 3×3, stride-2, pad-1 convolution of the image (16 filters) and
  ReLU. The library feeds it as a 1×1 convolution over an im2col of 32
  channels, channel ``(ky*3 + kx)*3 + c`` for BGR channel ``c`` (the last 5
  are zero); the graph uses an ordinary 3×3 convolution over RGB.
* **DP block**: a 1×1 pointwise convolution (no activation) then a 3×3
  depthwise convolution (pad 1) and, except in the prediction heads, ReLU.
  A *unit* is two DP blocks.
* **Backbone**: DP, max-pool 2×2/2, unit, unit, max-pool, unit (→ C3,
  stride 8), max-pool, unit (→ C4, stride 16), max-pool, unit (→ C5, stride 32);
  64 channels from C3 on.
* **Neck** (top-down): P5 = DP(C5); P4 = DP(C4 + up2(P5)); P3 = DP(C3 + up2(P4)),
  ``up2`` nearest-neighbour ×2.
* **Heads** on P3/P4/P5 (strides 8/16/32): DP blocks without ReLU giving
  ``cls`` (1), ``obj`` (1), ``bbox`` (4: dx, dy, log w, log h in strides) and
  ``kps`` (10: five (dx, dy) in strides).

ONNX model: input ``input`` float32 ``[N, 3, H, W]`` raw RGB 0..255 (no
normalisation), ``H`` and ``W`` multiples of 32 (the library zero-pads the
image to that). Outputs, anchors of stride 8 then 16 then 32, each row-major
over its ``H/s × W/s`` grid:

* ``regressors`` float32 ``[N, A, 14]``: bbox (4) then kps (10) raw;
* ``scores`` float32 ``[N, A, 1]``: ``sqrt(sigmoid(cls) * sigmoid(obj))``.

Decoding against the prior at ``(col * s, row * s)`` and the NMS live in
:mod:`facefuse.faces.yunet`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from facefuse.errors import BuildError
from facefuse.toolchain.build.elf_symbols import ElfFile
from facefuse.toolchain.build.onnx_graph import GraphBuilder, save_checked

OPSET = 17
IR_VERSION = 8
INPUT_NAME = "input"
STRIDES = (8, 16, 32)
#: The five landmarks, in the library's order (the subject's right eye is on the image's left).
LANDMARKS = ("right_eye", "left_eye", "nose_tip", "right_mouth_corner", "left_mouth_corner")
#: Output channels of each head.
HEADS: tuple[tuple[str, int], ...] = (("cls", 1), ("obj", 1), ("bbox", 4), ("kps", 10))
#: The layer table's record: int channels, int num_filters, bool depthwise,
#: bool pointwise, bool with_bn (padded to 8), float* weights, float* biases.
CONV_INFO = struct.Struct("<ii???5xQQ")
CONV_TABLE = "param_pConvInfo"


@dataclass(frozen=True)
class Conv:
    """One convolution of the library: ``weight`` as the library stores it, ``bias`` (out,)."""

    name: str
    channels: int
    filters: int
    depthwise: bool
    weight: np.ndarray
    bias: np.ndarray


def read_yunet(library: Path) -> dict[str, Conv]:
    """Read every convolution of the library's layer table, keyed by its symbol prefix.

    ``backbone__model0_pw_weight`` / ``…_bias`` become ``Conv("backbone__model0_pw")``.
    Raises :class:`BuildError` when the table or an array is missing or its
    size disagrees with the table.
    """
    elf = ElfFile(library)
    table = elf.symbols.get(CONV_TABLE)
    if table is None or table.size % CONV_INFO.size:
        raise BuildError(f"{Path(library).name}: no {CONV_TABLE} table")
    raw = elf.symbol_bytes(CONV_TABLE)
    targets = elf.pointer_targets()
    convs: dict[str, Conv] = {}
    for i in range(table.size // CONV_INFO.size):
        channels, filters, depthwise, pointwise, _bn, _w, _b = CONV_INFO.unpack_from(
            raw, i * CONV_INFO.size)
        slot = table.value + i * CONV_INFO.size
        w_name, b_name = targets.get(slot + 16), targets.get(slot + 24)
        if not w_name or not b_name or not w_name.endswith("_weight") or depthwise == pointwise:
            raise BuildError(f"{CONV_TABLE}[{i}] is not a depthwise or pointwise convolution")
        name = w_name.removesuffix("_weight")
        if b_name != f"{name}_bias":
            raise BuildError(f"{CONV_TABLE}[{i}]: weights {w_name} with bias {b_name}")
        count = 9 * channels if depthwise else filters * channels
        convs[name] = Conv(
            name, channels, filters, bool(depthwise),
            elf.float_array(w_name, count), elf.float_array(b_name, filters),
        )
    return convs


class _Graph(GraphBuilder):
    """The shared builder plus libfacedetection's layer kinds, taking each
    convolution from the library's table exactly once."""

    def __init__(self, convs: dict[str, Conv]) -> None:
        super().__init__()
        self.convs = convs
        self.used: set[str] = set()

    def take(self, name: str, *, depthwise: bool) -> Conv:
        conv = self.convs.get(name)
        if conv is None or conv.depthwise != depthwise:
            kind = "depthwise" if depthwise else "pointwise"
            raise BuildError(f"the library has no {kind} convolution {name!r}")
        self.used.add(name)
        return conv

    def pointwise(self, x: str, name: str) -> str:
        c = self.take(name, depthwise=False)
        w = c.weight.reshape(c.filters, c.channels, 1, 1)
        return self.node("Conv", [x, self.const(f"{name}_w", w), self.const(f"{name}_b", c.bias)],
                         name, kernel_shape=[1, 1])

    def depthwise(self, x: str, name: str, *, relu: bool) -> str:
        c = self.take(name, depthwise=True)
        # Stored as 9 taps × channels (tap = ky*3 + kx); ONNX wants (C, 1, 3, 3).
        w = c.weight.reshape(9, c.channels).T.reshape(c.channels, 1, 3, 3)
        y = self.node("Conv", [x, self.const(f"{name}_w", w), self.const(f"{name}_b", c.bias)],
                      name, kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=c.channels)
        return self.node("Relu", [y], f"{name}_relu") if relu else y

    def dp(self, x: str, prefix: str, *, relu: bool = True) -> str:
        return self.depthwise(self.pointwise(x, f"{prefix}_pw"), f"{prefix}_dw", relu=relu)

    def unit(self, x: str, prefix: str) -> str:
        return self.dp(self.dp(x, f"{prefix}_dp1"), f"{prefix}_dp2")

    def head_conv(self, x: str, name: str) -> str:
        c = self.take(name, depthwise=False)
        if c.channels != 32:
            raise BuildError(f"{name}: expected the 32-channel im2col head, not {c.channels}")
        # Library channel (ky*3 + kx)*3 + bgr → ONNX (out, rgb, ky, kx).
        taps = c.weight.reshape(c.filters, 32)[:, :27].reshape(c.filters, 3, 3, 3)
        w = taps[:, :, :, ::-1].transpose(0, 3, 1, 2)
        y = self.node("Conv", [x, self.const(f"{name}_w", np.ascontiguousarray(w)),
                               self.const(f"{name}_b", c.bias)],
                      name, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
        return self.node("Relu", [y], f"{name}_relu")

    def maxpool(self, x: str) -> str:
        return self.node("MaxPool", [x], "pool", kernel_shape=[2, 2], strides=[2, 2])

    def up2(self, x: str) -> str:
        scales = self.const("up2_scales", np.array([1.0, 1.0, 2.0, 2.0], np.float32))
        return self.node("Resize", [x, "", scales], "up2", mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor")

    def flat(self, x: str, channels: int) -> str:
        """(N, C, h, w) → (N, h*w, C), row-major over the grid."""
        shape = self.const("flat_shape", np.array([0, channels, -1], np.int64))
        return self.node("Transpose", [self.node("Reshape", [x, shape], "flat")], "rows",
                         perm=[0, 2, 1])


def build_onnx(convs: dict[str, Conv]) -> Any:
    """The YuNet ONNX model from the library's convolutions (see the module docstring)."""
    from onnx import TensorProto, helper

    g = _Graph(convs)
    x = g.head_conv(INPUT_NAME, "backbone__model0_pw")
    x = g.maxpool(g.dp(x, "backbone__model0_dp"))
    x = g.unit(g.unit(x, "backbone__model1"), "backbone__model2")
    c3 = g.unit(g.maxpool(x), "backbone__model3")
    c4 = g.unit(g.maxpool(c3), "backbone__model4")
    c5 = g.unit(g.maxpool(c4), "backbone__model5")
    p5 = g.dp(c5, "neck__lateral_convs__2")
    p4 = g.dp(g.node("Add", [g.up2(p5), c4], "add"), "neck__lateral_convs__1")
    p3 = g.dp(g.node("Add", [g.up2(p4), c3], "add"), "neck__lateral_convs__0")

    regs: list[str] = []
    scores: list[str] = []
    for level, feat in enumerate((p3, p4, p5)):
        out = {h: g.dp(feat, f"bbox_head__multi_level_{h}__{level}", relu=False)
               for h, _ in HEADS}
        both = g.node("Concat", [out["bbox"], out["kps"]], "reg", axis=1)
        regs.append(g.flat(both, 14))
        prob = g.node("Mul", [g.node("Sigmoid", [out["cls"]], "cls"),
                              g.node("Sigmoid", [out["obj"]], "obj")], "clsobj")
        scores.append(g.flat(g.node("Sqrt", [prob], "score"), 1))
    unused = sorted(set(convs) - g.used)
    if unused:
        raise BuildError(f"library convolutions not in the network: {unused}")

    g.nodes.append(helper.make_node("Concat", regs, ["regressors"], name="regressors", axis=1))
    g.nodes.append(helper.make_node("Concat", scores, ["scores"], name="scores", axis=1))
    graph = helper.make_graph(
        g.nodes, "yunet_2023",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("regressors", TensorProto.FLOAT, ["N", "A", 14]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", "A", 1])],
        g.inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="facefuse",
        doc_string=(
            "YuNet 2023 face detector from libfacedetection (Copyright (c) 2018-2023 Shiqi Yu, "
            "BSD-3-Clause), weights read from yuface 2023.5.1 and converted by facefuse. "
            "Input: RGB 0..255 NCHW, H and W multiples of 32. Outputs: regressors "
            "[N,A,14] (bbox dx,dy,log w,log h then 5 landmark dx,dy, in strides) and "
            "scores [N,A,1]; anchors of strides 8, 16, 32, row-major."
        ),
    )
    model.ir_version = IR_VERSION
    return model


def convert_yunet(library: Path, onnx_path: Path) -> None:
    """Read libfacedetection's compiled weights and write YuNet as ONNX to ``onnx_path``."""
    save_checked(build_onnx(read_yunet(Path(library))), onnx_path)
