"""The fusion pixel stages as ONNX graphs (needs the ``build`` extra: ``onnx``).

The graphs are written once into ``facefuse/imaging/graphs/`` and shipped with
the package, so running them needs only ONNX Runtime; a test rebuilds them and
checks the shipped files are these bytes. ``python -m
facefuse.toolchain.build.pixel_graphs`` rewrites them.

* ``remap.onnx`` — ``cv2.remap`` (bilinear, reflect-101 border) as GridSample:
  image (H, W, C) float32, map_x/map_y (h, w) float32
  absolute pixels → (h, w, C) float32.
* ``multiband_<n>.onnx`` (n = 1..8) — Burt–Adelson blend ``bg + collapse(G(m)·L(fg − bg))``
  with n reductions; pyrDown is a reflect-101 pad and a stride-2 5×5 binomial
  convolution, pyrUp a transposed convolution with 4× that kernel (OpenCV's
  pyramid kernels and borders: equal up to float rounding). fg, bg (H, W, 3)
  float32, mask (H, W) float32 → (H, W, 3) float32.
* ``lighting.onnx`` — the masked-Gaussian lighting transfer: ``[t·w, s·w, w]``
  decimated (antialiased linear resize to ``small``), blurred by a separable
  Gaussian whose taps are an input, divided, upsampled (linear), gain clamped.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
#: Pyramid depths shipped (``auto_levels`` gives at most 8).
MAX_LEVELS = 8
GRAPH_DIR = Path(__file__).resolve().parents[2] / "imaging" / "graphs"

_BINOMIAL = np.array([1.0, 4.0, 6.0, 4.0, 1.0], np.float32)
_KERNEL_DOWN = np.outer(_BINOMIAL, _BINOMIAL) / 256.0
_KERNEL_UP = _KERNEL_DOWN * 4.0

F = TensorProto.FLOAT
I64 = TensorProto.INT64


class _Graph:
    """A small builder: unique names, constants as initializers."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, stem: str) -> str:
        self._n += 1
        return f"{stem}_{self._n}"

    def const(self, value: np.ndarray, stem: str = "c") -> str:
        n = self.name(stem)
        self.inits.append(numpy_helper.from_array(value, n))
        return n

    def op(self, op_type: str, inputs: list[str], stem: str | None = None, **attrs: Any) -> str:
        out = self.name(stem or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def model(self, name: str, inputs: list[onnx.ValueInfoProto],
              outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="facefuse")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model

    # -- helpers ---------------------------------------------------------------------------

    def hwc_to_nchw(self, x: str) -> str:
        return self.op("Unsqueeze", [self.op("Transpose", [x], perm=[2, 0, 1]),
                                     self.const(np.array([0], np.int64))])

    def nchw_to_hwc(self, x: str) -> str:
        squeezed = self.op("Squeeze", [x, self.const(np.array([0], np.int64))])
        return self.op("Transpose", [squeezed], perm=[1, 2, 0])

    def hw(self, x: str) -> str:
        """(2,) int64 (H, W) of an NCHW tensor."""
        return self.op("Slice", [self.op("Shape", [x]), self.const(np.array([2], np.int64)),
                                 self.const(np.array([4], np.int64))])

    def pyr_down(self, x: str, channels: int) -> str:
        pad = self.op("Pad", [x, self.const(np.array([0, 0, 2, 2, 0, 0, 2, 2], np.int64))],
                      mode="reflect")
        w = self.const(np.tile(_KERNEL_DOWN[None, None], (channels, 1, 1, 1)), "kdown")
        return self.op("Conv", [pad, w], group=channels, strides=[2, 2])

    def pyr_up(self, x: str, like: str, channels: int) -> str:
        """OpenCV's pyrUp of NCHW ``x`` to the spatial size of ``like``."""
        # OpenCV reflects at the top/left edge and repeats the last row/column.
        pad = self.op("Pad", [x, self.const(np.array([0, 0, 1, 1, 0, 0, 0, 0], np.int64))],
                      mode="reflect")
        pad = self.op("Pad", [pad, self.const(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64))],
                      mode="edge")
        w = self.const(np.tile(_KERNEL_UP[None, None], (channels, 1, 1, 1)), "kup")
        up = self.op("ConvTranspose", [pad, w], group=channels, strides=[2, 2])
        start = self.const(np.array([4, 4], np.int64))
        end = self.op("Add", [self.hw(like), start])
        return self.op("Slice", [up, start, end, self.const(np.array([2, 3], np.int64))])


def remap_graph() -> onnx.ModelProto:
    """``cv2.remap`` (INTER_LINEAR, BORDER_REFLECT_101) of a float32 HWC image."""
    g = _Graph()
    img = g.hwc_to_nchw("image")
    hw = g.op("Cast", [g.hw(img)], to=F)
    one = g.const(np.array([1.0], np.float32))
    two = g.const(np.array([2.0], np.float32))
    # align_corners=1: -1 and 1 are the centres of the first and last pixels.
    scale = g.op("Div", [two, g.op("Sub", [hw, one])])  # (2/(H-1), 2/(W-1))
    sy = g.op("Gather", [scale, g.const(np.array(0, np.int64))], axis=0)
    sx = g.op("Gather", [scale, g.const(np.array(1, np.int64))], axis=0)
    gx = g.op("Sub", [g.op("Mul", ["map_x", sx]), one])
    gy = g.op("Sub", [g.op("Mul", ["map_y", sy]), one])
    axis = g.const(np.array([-1], np.int64))
    grid = g.op("Concat", [g.op("Unsqueeze", [gx, axis]), g.op("Unsqueeze", [gy, axis])],
                axis=-1)
    grid = g.op("Unsqueeze", [grid, g.const(np.array([0], np.int64))])
    out = g.op("GridSample", [img, grid], mode="bilinear", padding_mode="reflection",
               align_corners=1)
    g.nodes.append(helper.make_node("Identity", [g.nchw_to_hwc(out)], ["out"]))
    return g.model("remap", [
        helper.make_tensor_value_info("image", F, ["H", "W", "C"]),
        helper.make_tensor_value_info("map_x", F, ["h", "w"]),
        helper.make_tensor_value_info("map_y", F, ["h", "w"]),
    ], [helper.make_tensor_value_info("out", F, ["h", "w", "C"])])


def multiband_graph(levels: int) -> onnx.ModelProto:
    """``bg + collapse(G(mask)·L(fg − bg))`` with ``levels`` reductions (3 channels)."""
    g = _Graph()
    diff = g.hwc_to_nchw(g.op("Sub", ["fg", "bg"]))
    m = g.op("Unsqueeze", ["mask", g.const(np.array([0, 1], np.int64))])
    gauss = [g.op("Concat", [diff, m], axis=1)]  # (1, 4, H, W): diff and mask together
    for _ in range(levels):
        gauss.append(g.pyr_down(gauss[-1], 4))
    split = g.const(np.array([3, 1], np.int64))
    parts = []
    for level in gauss:
        d, mk = g.name("d"), g.name("m")
        g.nodes.append(helper.make_node("Split", [level, split], [d, mk], axis=1))
        parts.append((d, mk))
    acc = g.op("Mul", [parts[levels][1], parts[levels][0]])
    for k in range(levels - 1, -1, -1):
        d, mk = parts[k]
        band = g.op("Sub", [d, g.pyr_up(parts[k + 1][0], d, 3)])
        acc = g.op("Add", [g.pyr_up(acc, d, 3), g.op("Mul", [mk, band])])
    g.nodes.append(helper.make_node("Add", ["bg", g.nchw_to_hwc(acc)], ["out"]))
    return g.model(f"multiband_{levels}", [
        helper.make_tensor_value_info("fg", F, ["H", "W", 3]),
        helper.make_tensor_value_info("bg", F, ["H", "W", 3]),
        helper.make_tensor_value_info("mask", F, ["H", "W"]),
    ], [helper.make_tensor_value_info("out", F, ["H", "W", 3])])


def lighting_graph() -> onnx.ModelProto:
    """The lighting transfer (see the module docstring); ``taps`` (K,) odd, sums to 1."""
    g = _Graph()
    w = g.op("Unsqueeze", ["weight", g.const(np.array([-1], np.int64))])
    stack = g.op("Concat", [g.op("Mul", ["target", w]), g.op("Mul", ["source", w]), w],
                 axis=-1)  # (H, W, 7)
    x = g.hwc_to_nchw(stack)
    hw = g.hw(x)
    head = g.const(np.array([1, 7], np.int64))
    small = g.op("Resize", [x, "", "", g.op("Concat", [head, "small"], axis=0)],
                 mode="linear", antialias=1, coordinate_transformation_mode="half_pixel")
    k = g.op("Shape", ["taps"])
    half = g.op("Div", [k, g.const(np.array([2], np.int64))])
    zero = g.const(np.array([0], np.int64))
    pad_w = g.op("Concat", [zero, zero, zero, half, zero, zero, zero, half], axis=0)
    pad_h = g.op("Concat", [zero, zero, half, zero, zero, zero, half, zero], axis=0)
    taps_w = g.op("Reshape", ["taps", g.const(np.array([1, 1, 1, -1], np.int64))])
    taps_h = g.op("Reshape", ["taps", g.const(np.array([1, 1, -1, 1], np.int64))])
    seven = g.const(np.array([7, 1, 1, 1], np.int64))
    blur = g.op("Conv", [g.op("Pad", [small, pad_w], mode="reflect"),
                         g.op("Tile", [taps_w, seven])], group=7)
    blur = g.op("Conv", [g.op("Pad", [blur, pad_h], mode="reflect"),
                         g.op("Tile", [taps_h, seven])], group=7)
    num, den = g.name("num"), g.name("den")
    g.nodes.append(helper.make_node("Split", [blur, g.const(np.array([6, 1], np.int64))],
                                    [num, den], axis=1))
    mu = g.op("Div", [num, g.op("Max", [den, g.const(np.array(1e-4, np.float32))])])
    full = g.op("Concat", [g.const(np.array([1, 6], np.int64)), hw], axis=0)
    mu = g.op("Resize", [mu, "", "", full], mode="linear",
              coordinate_transformation_mode="half_pixel")
    mu = g.nchw_to_hwc(mu)  # (H, W, 6): target means, then source means
    mu_t, mu_s = g.name("mu_t"), g.name("mu_s")
    g.nodes.append(helper.make_node("Split", [mu, g.const(np.array([3, 3], np.int64))],
                                    [mu_t, mu_s], axis=-1))
    one = g.const(np.array(1.0, np.float32))
    gain = g.op("Div", [g.op("Add", [mu_t, one]), g.op("Add", [mu_s, one])])
    gain = g.op("Min", [g.op("Max", [gain, g.op("Reciprocal", ["max_gain"])]), "max_gain"])
    out = g.op("Mul", ["source", gain])
    g.nodes.append(helper.make_node("Clip", [out, g.const(np.array(0.0, np.float32)),
                                             g.const(np.array(255.0, np.float32))], ["out"]))
    return g.model("lighting", [
        helper.make_tensor_value_info("source", F, ["H", "W", 3]),
        helper.make_tensor_value_info("target", F, ["H", "W", 3]),
        helper.make_tensor_value_info("weight", F, ["H", "W"]),
        helper.make_tensor_value_info("taps", F, ["K"]),
        helper.make_tensor_value_info("small", I64, [2]),
        helper.make_tensor_value_info("max_gain", F, []),
    ], [helper.make_tensor_value_info("out", F, ["H", "W", 3])])


def all_graphs() -> dict[str, bytes]:
    """File name → serialized model, for every shipped graph."""
    graphs = {"remap.onnx": remap_graph(), "lighting.onnx": lighting_graph()}
    for n in range(1, MAX_LEVELS + 1):
        graphs[f"multiband_{n}.onnx"] = multiband_graph(n)
    return {name: m.SerializeToString(deterministic=True) for name, m in graphs.items()}


def write_graphs(directory: Path = GRAPH_DIR) -> list[Path]:
    """Write every graph into ``directory``; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in all_graphs().items():
        path = directory / name
        path.write_bytes(data)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write_graphs(Path(sys.argv[1]) if len(sys.argv) > 1 else GRAPH_DIR):
        print(p)
