"""Our ONNX graphs on PyTorch devices, for bench/gpu_check.py (bench only: needs torch).

Two routes, because the GPU machine has PyTorch but only the CPU build of ONNX
Runtime:

* the analysis models through ``onnx2torch`` (a pure-Python wheel; its
  converters import ``torchvision`` for NMS/RoIAlign, which our models do not
  use: when torchvision is absent a placeholder module stands in and those two
  converters raise if ever reached). BlazeFace's ``auto_pad=SAME_UPPER`` is
  rewritten to explicit pads first (onnx2torch lacks it).
* the fusion pixel graphs (``facefuse/imaging/graphs``: GridSample, Resize with
  antialias, opset 18 Pad — none of which onnx2torch converts) through
  :class:`TorchGraph`, a small interpreter of exactly the ops those graphs
  use, node by node on torch tensors. Same graph bytes as the product runs.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper, shape_inference
from torch.nn import functional as tf

from facefuse.runtime.manifest import ModelSpec


def import_onnx2torch() -> Any:
    """``onnx2torch``, with a placeholder ``torchvision`` when it is not installed."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        def missing(*_: Any, **__: Any) -> Any:
            raise RuntimeError("torchvision is not installed (NMS/RoIAlign unavailable)")

        tv = types.ModuleType("torchvision")
        ops = types.ModuleType("torchvision.ops")
        ops.roi_align = missing  # type: ignore[attr-defined]
        ops.nms = missing  # type: ignore[attr-defined]
        ops.box_convert = missing  # type: ignore[attr-defined]
        tv.ops = ops  # type: ignore[attr-defined]
        sys.modules["torchvision"] = tv
        sys.modules["torchvision.ops"] = ops
    import onnx2torch

    return onnx2torch


def explicit_pads(model: onnx.ModelProto) -> onnx.ModelProto:
    """Replace ``auto_pad=SAME_UPPER/SAME_LOWER`` on Conv/pooling by explicit pads
    (from inferred spatial sizes at batch 1)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for inp in m.graph.input:
        dims = inp.type.tensor_type.shape.dim
        if dims and not dims[0].dim_value:
            dims[0].dim_value = 1
    inferred = shape_inference.infer_shapes(m)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.input]}
    for node in model.graph.node:
        attrs = {a.name: a for a in node.attribute}
        mode = attrs.get("auto_pad")
        if mode is None or mode.s not in (b"SAME_UPPER", b"SAME_LOWER"):
            continue
        size = shapes[node.input[0]][2:]
        if node.op_type == "Conv":
            w = next(i for i in model.graph.initializer if i.name == node.input[1])
            kernel = list(w.dims[2:])
        else:
            kernel = list(helper.get_attribute_value(attrs["kernel_shape"]))
        strides = list(helper.get_attribute_value(attrs["strides"])) if "strides" in attrs \
            else [1] * len(kernel)
        dil = list(helper.get_attribute_value(attrs["dilations"])) if "dilations" in attrs \
            else [1] * len(kernel)
        begin, end = [], []
        for n, k, s, d in zip(size, kernel, strides, dil, strict=True):
            total = max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
            small = total // 2
            big = total - small
            begin.append(small if mode.s == b"SAME_UPPER" else big)
            end.append(big if mode.s == b"SAME_UPPER" else small)
        node.attribute.remove(mode)
        node.attribute.append(helper.make_attribute("pads", begin + end))
    return model


def channel_prelu(model: onnx.ModelProto) -> onnx.ModelProto:
    """Reshape PRelu slopes of shape (1, C, 1, 1) to (C, 1, 1) (same broadcast), so
    onnx2torch converts them to ``torch.nn.functional.prelu`` (what ``nn.PReLU(C)``
    runs) instead of its generic clone-multiply-mask path (~20× slower on the CPU)."""
    slopes = {n.input[1] for n in model.graph.node if n.op_type == "PRelu"}
    for init in model.graph.initializer:
        dims = list(init.dims)
        if init.name in slopes and len(dims) == 4 and dims[0] == 1 and dims[2:] == [1, 1]:
            init.CopyFrom(numpy_helper.from_array(
                numpy_helper.to_array(init).reshape(dims[1], 1, 1), init.name))
    return model


def torch_model(path: Path, device: str) -> torch.nn.Module:
    """An ONNX analysis model as a torch module on ``device`` (FP32, eval mode)."""
    model = channel_prelu(explicit_pads(onnx.load(str(path))))
    module: torch.nn.Module = import_onnx2torch().convert(model)
    return module.eval().to(device)


class TorchRunner:
    """A converted model with ``LoadedModel``'s ``spec`` and ``run`` (numpy in and out)."""

    def __init__(self, spec: ModelSpec, module: torch.nn.Module, device: str,
                 dtype: torch.dtype) -> None:
        self.spec, self.module, self.device, self.dtype = spec, module, device, dtype

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        with torch.inference_mode():
            xs = [torch.from_numpy(np.ascontiguousarray(x)).to(self.device, self.dtype)
                  for x in inputs]
            out = self.module(*xs)
            outs = out if isinstance(out, list | tuple) else [out]
            return [o.float().cpu().numpy() for o in outs]


# -- the pixel-graph interpreter -------------------------------------------------------------

Op = Callable[[list[Any], dict[str, Any]], list[Any]]


def _pad(x: torch.Tensor, pads: torch.Tensor, mode: str) -> torch.Tensor:
    p = [int(v) for v in pads.tolist()]
    n = len(p) // 2
    begin, end = p[:n], p[n:]
    first = min([a for a in range(n) if begin[a] or end[a]] + [n - 2])
    if first < n - 2:
        raise NotImplementedError("padding of batch/channel axes")
    torch_pads: list[int] = []
    for axis in range(n - 1, first - 1, -1):  # torch wants the last axis first
        torch_pads += [begin[axis], end[axis]]
    mode = {"reflect": "reflect", "edge": "replicate", "constant": "constant"}[mode]
    return tf.pad(x, torch_pads, mode=mode)


def _resize(x: torch.Tensor, sizes: torch.Tensor, attrs: dict[str, Any]) -> torch.Tensor:
    size = [int(v) for v in sizes.tolist()[2:]]
    return tf.interpolate(x, size=size, mode="bilinear", align_corners=False,
                         antialias=bool(attrs.get("antialias", 0)))


def _split(x: torch.Tensor, sizes: torch.Tensor, attrs: dict[str, Any]) -> list[torch.Tensor]:
    return list(torch.split(x, [int(v) for v in sizes.tolist()], dim=attrs.get("axis", 0)))


def _slice(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
           axes: torch.Tensor | None = None) -> torch.Tensor:
    index: list[slice] = [slice(None)] * x.dim()
    ax = axes.tolist() if axes is not None else list(range(len(starts)))
    for a, s, e in zip(ax, starts.tolist(), ends.tolist(), strict=True):
        index[a] = slice(s, min(e, x.shape[a]))
    return x[tuple(index)]


_DTYPES = {onnx.TensorProto.FLOAT: torch.float32, onnx.TensorProto.INT64: torch.int64}

OPS: dict[str, Op] = {
    "Identity": lambda i, a: [i[0]],
    "Add": lambda i, a: [i[0] + i[1]],
    "Sub": lambda i, a: [i[0] - i[1]],
    "Mul": lambda i, a: [i[0] * i[1]],
    "Div": lambda i, a: [torch.div(i[0], i[1], rounding_mode="floor")
                         if not i[0].is_floating_point() else i[0] / i[1]],
    "Max": lambda i, a: [torch.maximum(i[0], i[1].to(i[0].dtype))],
    "Min": lambda i, a: [torch.minimum(i[0], i[1].to(i[0].dtype))],
    "Reciprocal": lambda i, a: [1.0 / i[0]],
    "Clip": lambda i, a: [torch.clamp(i[0], float(i[1]), float(i[2]))],
    "Cast": lambda i, a: [_cast(i[0], _DTYPES[a["to"]])],
    "Shape": lambda i, a: [torch.tensor(list(i[0].shape), dtype=torch.int64)],
    "Gather": lambda i, a: [torch.index_select(i[0], a.get("axis", 0),
                                               i[1].reshape(-1).to(i[0].device)
                                               ).reshape(i[1].shape)],
    "Unsqueeze": lambda i, a: [i[0].reshape(_unsqueezed(i[0].shape, i[1].tolist()))],
    "Squeeze": lambda i, a: [i[0].squeeze(int(i[1][0]))],
    "Transpose": lambda i, a: [i[0].permute(*a["perm"])],
    "Reshape": lambda i, a: [i[0].reshape([int(v) for v in i[1].tolist()])],
    "Concat": lambda i, a: [torch.cat([t.to(i[0].device) for t in i], dim=a["axis"])],
    "Tile": lambda i, a: [i[0].repeat(*[int(v) for v in i[1].tolist()])],
    "Slice": lambda i, a: [_slice(*i)],
    "Split": lambda i, a: _split(i[0], i[1], a),
    "Pad": lambda i, a: [_pad(i[0], i[1], a.get("mode", "constant"))],
    "Resize": lambda i, a: [_resize(i[0], i[3], a)],
    "Conv": lambda i, a: [tf.conv2d(i[0], i[1], stride=a.get("strides", [1, 1]),
                                   groups=a.get("group", 1))],
    "ConvTranspose": lambda i, a: [tf.conv_transpose2d(i[0], i[1],
                                                      stride=a.get("strides", [1, 1]),
                                                      groups=a.get("group", 1))],
    "GridSample": lambda i, a: [tf.grid_sample(i[0], i[1], mode="bilinear",
                                              padding_mode="reflection",
                                              align_corners=bool(a.get("align_corners", 0)))],
}


#: Where float tensors live while a graph runs (set by :class:`TorchGraph`).
_FLOAT_HOME: dict[str, Any] = {"device": "cpu", "dtype": torch.float32}


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return x.to(_FLOAT_HOME["device"], _FLOAT_HOME["dtype"])
    return x.to("cpu", dtype)


def _unsqueezed(shape: torch.Size, axes: list[int]) -> list[int]:
    out = list(shape)
    rank = len(out) + len(axes)
    for ax in sorted(a % rank for a in axes):
        out.insert(ax, 1)
    return out


class TorchGraph:
    """Runs one of the shipped pixel graphs on torch tensors, node by node.

    Integer tensors (shapes, sizes, axes) stay on the CPU; every float tensor
    (images, maps, kernels, scalars) lives on ``device`` in ``dtype``. Not
    thread-safe (one graph run at a time per process).
    """

    def __init__(self, data: bytes, device: str, dtype: torch.dtype = torch.float32) -> None:
        self.model = onnx.load_from_string(data)
        self.device, self.dtype = device, dtype
        self.consts: dict[str, torch.Tensor] = {}
        for init in self.model.graph.initializer:
            arr = numpy_helper.to_array(init)
            self.consts[init.name] = self.to_device(np.array(arr))
        unknown = {n.op_type for n in self.model.graph.node} - set(OPS)
        if unknown:
            raise NotImplementedError(f"ops not interpreted: {sorted(unknown)}")
        self.input_names = [i.name for i in self.model.graph.input]

    def to_device(self, x: np.ndarray) -> torch.Tensor:
        """A host array as this graph keeps it (floats on the device, ints on the host)."""
        t = torch.from_numpy(np.ascontiguousarray(x))
        return t.to(self.device, self.dtype) if t.is_floating_point() else t

    def __call__(self, **feeds: torch.Tensor) -> torch.Tensor:
        _FLOAT_HOME.update(device=self.device, dtype=self.dtype)
        env: dict[str, Any] = {**self.consts, **feeds, "": None}
        for node in self.model.graph.node:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if "mode" in attrs and isinstance(attrs["mode"], bytes):
                attrs["mode"] = attrs["mode"].decode()
            outs = OPS[node.op_type]([env[n] for n in node.input], attrs)
            env.update(zip(node.output, outs, strict=True))
        out: torch.Tensor = env[self.model.graph.output[0].name]
        return out
