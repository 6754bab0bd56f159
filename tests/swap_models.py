"""Tiny ONNX face-swap models with the swap contract, and a model directory to
register them in (the real zoo plus these), for the tests of the swapper plug-in
and of choosing a swapper over HTTP, in jobs and from the CLI.

We ship no face-swap model, so every model here is generated with ``onnx.helper``
with the exact inswapper-style I/O contract of docs/swappers.md (target
``[N, 3, S, S]``, source ``[N, D]`` → output ``[N, 3, S, S]``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from facefuse.runtime.manifest import Manifest, ModelSpec, Preprocessing, Source, TensorSpec

OPSET = 17
#: The constant colour of the "const" model, per output channel (model order), 0..1.
CONST = (0.15, 0.55, 0.9)
#: Brightness gain of the latent-dependent model: pixel = (0.5 + K · mean(latent)) · 255.
K = 2.0


# ----------------------------------------------------------------------------------------
# Tiny ONNX models with the swap contract
# ----------------------------------------------------------------------------------------


def _io(s: int, d: int, *, target: str = "target", source: str = "source",
        d_graph: int | None = None) -> tuple[list[Any], list[Any]]:
    inputs = [oh.make_tensor_value_info(target, TensorProto.FLOAT, ["N", 3, s, s]),
              oh.make_tensor_value_info(source, TensorProto.FLOAT, ["N", d_graph or d])]
    outputs = [oh.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3, s, s])]
    return inputs, outputs


def make_model(nodes: list[Any], inputs: list[Any], outputs: list[Any],
           inits: list[Any] | None = None) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "swap", inputs, outputs, initializer=inits or [])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", OPSET)])
    onnx.checker.check_model(model)
    return model


def identity_model(s: int, d: int = 128, **kw: Any) -> onnx.ModelProto:
    """Returns its input crop: the output is the target crop itself."""
    target = kw.get("target", "target")
    return make_model([oh.make_node("Identity", [target], ["output"])], *_io(s, d, **kw))


def const_model(s: int, d: int = 128) -> onnx.ModelProto:
    """Returns the constant colour :data:`CONST` everywhere: ``0 · target + c``."""
    c = numpy_helper.from_array(np.array(CONST, np.float32).reshape(1, 3, 1, 1), "c")
    zero = numpy_helper.from_array(np.zeros((1,), np.float32), "zero")
    nodes = [oh.make_node("Mul", ["target", "zero"], ["t0"]),
             oh.make_node("Add", ["t0", "c"], ["output"])]
    return make_model(nodes, *_io(s, d), inits=[c, zero])


def latent_model(s: int, d: int, projection: np.ndarray | None = None) -> onnx.ModelProto:
    """Grey level from the source latent: ``0 · target + 0.5 + K · mean(latent)``.

    ``projection`` is stored as the graph's LAST initializer (unused by the graph,
    as inswapper stores its ``emap``); other initializers come before it.
    """
    inits = [numpy_helper.from_array(np.array([K], np.float32), "k"),
             numpy_helper.from_array(np.array([0.5], np.float32), "half"),
             numpy_helper.from_array(np.zeros((1,), np.float32), "zero"),
             numpy_helper.from_array(np.array([-1, 1, 1, 1], np.int64), "shape4")]
    if projection is not None:
        inits.append(numpy_helper.from_array(projection, "emap"))
    nodes = [
        oh.make_node("ReduceMean", ["source"], ["m"], axes=[1], keepdims=1),  # [N, 1]
        oh.make_node("Reshape", ["m", "shape4"], ["m4"]),  # [N, 1, 1, 1]
        oh.make_node("Mul", ["m4", "k"], ["km"]),
        oh.make_node("Add", ["km", "half"], ["g"]),
        oh.make_node("Mul", ["target", "zero"], ["t0"]),
        oh.make_node("Add", ["t0", "g"], ["output"]),  # broadcast to [N, 3, S, S]
    ]
    return make_model(nodes, *_io(s, d), inits=inits)


def toy_recognizer(size: int = 112) -> onnx.ModelProto:
    """An "embed" model: the chip's mean per channel, ``[N, 3, S, S] → [N, 3]``."""
    x = oh.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])
    y = oh.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", 3])
    nodes = [oh.make_node("ReduceMean", ["input"], ["embedding"], axes=[2, 3], keepdims=0)]
    return make_model(nodes, [x], [y])


# ----------------------------------------------------------------------------------------
# A model directory: the real zoo plus the test models
# ----------------------------------------------------------------------------------------


def swap_spec(name: str, file: str, sha: str, size: int, s: int, d: int, *,
              color: str = "RGB", mean: float = 0.0, std: float = 255.0,
              **extra: Any) -> ModelSpec:
    ex: dict[str, Any] = {"template": "arcface_128", "recognizer": "dlib_resnet",
                          "latent": "normalized", "output_range": "0..1"}
    ex.update({k: v for k, v in extra.items() if v is not None})
    for k in [k for k, v in extra.items() if v is None]:
        ex.pop(k, None)
    return ModelSpec(
        name=name, task="swap", file=file, sha256=sha, size=size, opset=OPSET,
        inputs=[TensorSpec("target", ["N", 3, s, s]), TensorSpec("source", ["N", d])],
        outputs=[TensorSpec("output", ["N", 3, s, s])],
        preprocessing=Preprocessing(size=(s, s), mean=(mean,) * 3, std=(std,) * 3,
                                    color=color, layout="NCHW"),
        source=Source("test-generated", "-", "-", "test only"), licence="test only", extra=ex)


class ModelDir:
    """Writes models into ``path`` and keeps the manifest (the zoo's plus ours)."""

    def __init__(self, path: Path, zoo: Path) -> None:
        self.path = path
        self.manifest = Manifest.load(zoo)
        for spec in self.manifest.models.values():
            dst = path / spec.file
            try:
                os.symlink(zoo / spec.file, dst)
            except OSError:
                shutil.copyfile(zoo / spec.file, dst)

    def write(self, model: onnx.ModelProto, file: str) -> tuple[str, int]:
        body = model.SerializeToString()
        (self.path / file).write_bytes(body)
        return hashlib.sha256(body).hexdigest(), len(body)

    def add_swap(self, name: str, model: onnx.ModelProto, s: int, d: int,
                 **kw: Any) -> ModelSpec:
        sha, size = self.write(model, f"{name}.onnx")
        spec = swap_spec(name, f"{name}.onnx", sha, size, s, d, **kw)
        self.manifest.models[name] = spec
        return spec

    def add(self, spec: ModelSpec) -> None:
        self.manifest.models[spec.name] = spec

    def save(self) -> None:
        self.manifest.save(self.path)


#: The swapper :func:`tiny_swap_dir` registers: paints the face :data:`CONST`.
TINY = "tiny_const"


def tiny_swap_dir(path: Path, zoo: Path) -> Path:
    """``path`` made a model directory: the zoo of ``zoo`` and one swap model,
    :data:`TINY` (the constant colour :data:`CONST` over the face), registered in
    its ``manifest.json`` as docs/swappers.md says; returns ``path``."""
    md = ModelDir(path, zoo)
    md.add_swap(TINY, const_model(128), 128, 128)
    md.save()
    return path


def middle_third(bbox: Any) -> tuple[int, int, int, int]:
    """The middle third of a face box ``(x0, y0, x1, y1)``, whole pixels: inside the
    face's oval wherever the face sits in it."""
    x0, y0, x1, y1 = (float(v) for v in bbox)
    w, h = x1 - x0, y1 - y0
    return int(x0 + w / 3), int(y0 + h / 3), int(x1 - w / 3), int(y1 - h / 3)


def painted(image: np.ndarray, box: tuple[int, int, int, int], tol: float = 6.0) -> bool:
    """Whether :data:`TINY` painted the face whose :func:`middle_third` is ``box``:
    the median RGB there within ``tol`` of :data:`CONST` (a classic fusion keeps skin
    there, far from that blue)."""
    x0, y0, x1, y1 = box
    med = np.median(image[y0:y1, x0:x1].reshape(-1, 3).astype(np.float64), axis=0)
    return bool(np.abs(med - np.asarray(CONST, np.float64) * 255.0).max() <= tol)
