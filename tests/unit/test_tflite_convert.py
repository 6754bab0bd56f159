"""convert_tflite: stable names, a free batch dimension, reproducible bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from mediapipe_ref import TFLiteModel, tflite_file
from onnx import TensorProto, helper, numpy_helper

from facefuse.config import Settings
from facefuse.errors import BuildError
from facefuse.runtime.files import sha256_file
from facefuse.toolchain.build.tflite import (
    _channel_pads_as_concats,
    convert_tflite,
    postprocess_graph,
)

CASES = {
    "blazeface_full": ("input", [("regressors", 2304 * 16), ("scores", 2304)], 192),
    "blazeface_short": ("input", [("regressors", 896 * 16), ("scores", 896)], 128),
    "facemesh": ("input", [("landmarks", 1404), ("presence", 1)], 192),
    "iris": ("input", [("contours", 213), ("iris", 15)], 64),
}


@pytest.fixture(scope="module")
def src_dir(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Path:
    d = tmp_path_factory.mktemp("tflite_src")
    for name in CASES:
        tflite_file(settings, name, d)
    return d


@pytest.mark.parametrize("name", list(CASES))
def test_converted_graph_has_stable_names_and_free_batch(
    name: str, src_dir: Path, settings: Settings, tmp_path: Path,
    sample_images: dict[str, np.ndarray],
) -> None:
    src = tflite_file(settings, name, src_dir)
    dst = tmp_path / f"{name}.onnx"
    convert_tflite(src, dst)
    model = onnx.load(str(dst))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [11]
    inp_name, outputs, size = CASES[name]
    (inp,) = model.graph.input
    assert inp.name == inp_name
    assert [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim] == [
        "N", 3, size, size]
    assert [o.name for o in model.graph.output] == [n for n, _ in outputs]
    for o in model.graph.output:
        assert o.type.tensor_type.shape.dim[0].dim_param == "N"
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ops = {node.op_type for node in model.graph.node}
    assert "PRelu" not in ops
    # Every channel pad of whole layout blocks became a split conv and a concat (the
    # short-range detector's are narrower).
    assert ("Pad" in ops) == (name == "blazeface_short")
    for node in model.graph.node:
        if node.op_type == "Reshape":
            assert inits[node.input[1]][0] != 1  # batch copied (0), not pinned
        if node.op_type == "Resize":
            assert len(node.input) == 3  # scales, not fixed sizes
    # Batch of 8 real crops == 8 single runs, and both == the TFLite interpreter.
    crops = []
    for img in sample_images.values():
        h, w = img.shape[:2]
        crops.append(cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA))
        centre = img[h // 4 : h // 2, w // 4 : w // 2]
        crops.append(cv2.resize(centre, (size, size), interpolation=cv2.INTER_AREA))
    crops = crops[:8]
    batch = np.stack(crops).transpose(0, 3, 1, 2).astype(np.float32) / 255.0
    sess = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    full = sess.run(None, {"input": batch})
    for (oname, n), out in zip(outputs, full, strict=True):
        assert out.reshape(8, -1).shape == (8, n), oname
    for i in range(8):
        single = sess.run(None, {"input": batch[i : i + 1]})
        for a, b in zip(single, full, strict=True):
            np.testing.assert_allclose(a[0], b[i], rtol=1e-5, atol=1e-5)
    ref = TFLiteModel(src).run(batch)
    for a, r in zip(full, ref, strict=True):
        np.testing.assert_allclose(a.reshape(8, -1), r, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("name", ["blazeface_full", "facemesh", "iris"])
def test_converted_graph_stays_in_the_blocked_layout(
    name: str, src_dir: Path, settings: Settings, tmp_path: Path
) -> None:
    """ONNX Runtime's optimised graph re-enters its blocked (NCHWc) layout nowhere: no
    op between two convolutions falls out of it (on a CPU without that layout there
    are no reorders at all)."""
    dst = tmp_path / f"{name}.onnx"
    convert_tflite(tflite_file(settings, name, src_dir), dst)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    ort.InferenceSession(str(dst), options, providers=["CPUExecutionProvider"])
    ops = [node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node]
    assert "ReorderInput" not in ops


def _prelu_model(slope: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("PRelu", ["x", "slope"], ["y"])], "prelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
        [numpy_helper.from_array(slope, "slope")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


@pytest.mark.parametrize(("slopes", "ops"), [
    # Slopes on both sides of 1 (a negative one too): the sign conv is needed.
    ((-0.3, 0.25, 1.0, 1.4), ["Conv", "Relu", "Conv", "Add"]),
    # All at most 1: the sign conv is all ones, there for ONNX Runtime to fuse the Add.
    ((-0.3, 0.25, 0.9, 1.0), ["Conv", "Relu", "Conv", "Add"]),
])
def test_split_prelu_equals_prelu(slopes: tuple[float, ...], ops: list[str]) -> None:
    rng = np.random.default_rng(5)
    slope = np.asarray(slopes, np.float32).reshape(1, 4, 1, 1)
    model = _prelu_model(slope)
    reference = ort.InferenceSession(model.SerializeToString(),
                                     providers=["CPUExecutionProvider"])
    split = postprocess_graph(model, output_names=None, dynamic_batch=False)
    assert [n.op_type for n in split.graph.node] == ops
    session = ort.InferenceSession(split.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.normal(0, 3, (1, 4, 5, 5)).astype(np.float32)
    x[:, :, 0, :3] = (0.0, -0.0, 1e-30)
    (want,) = reference.run(None, {"x": x})
    (got,) = session.run(None, {"input": x})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-30)
    assert np.array_equal(got[x >= 0], x[x >= 0])  # the positive side is x itself
    np.testing.assert_allclose(got, np.where(x > 0, x, x * slope), rtol=1e-6, atol=1e-30)


def _widening_block(pads: list[int], *, conv_first: bool = False, relu: bool = False,
                    returned: tuple[str, ...] = (), h_side: int = 6,
                    taken: str = "") -> onnx.ModelProto:
    """``y = Add(Pad(x, pads), Conv(h))`` (x: 16 channels 6×6, h: 3 channels
    ``h_side``², a 3×3 conv, or 1×1 when ``h_side`` is 1 so that the Add broadcasts;
    y: the padded x's channels), through a Relu with ``relu``. ``returned``: more
    tensors the graph returns (``p`` the pad's, ``c`` the conv's, ``s`` the sum's);
    ``taken``: a tensor of that name is returned too (an identity of ``x``)."""
    rng = np.random.default_rng(8)
    out_c = 16 + pads[1] + pads[5]
    k = 3 if h_side > 1 else 1
    weight = rng.normal(0, 1, (out_c, 3, k, k)).astype(np.float32)
    bias = rng.normal(0, 1, out_c).astype(np.float32)
    add_in = ["c", "p"] if conv_first else ["p", "c"]
    names = ["y", *returned, *([taken] if taken else [])]
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant"),
         helper.make_node("Conv", ["h", "w", "b"], ["c"], kernel_shape=[k, k],
                          pads=[k // 2] * 4),
         helper.make_node("Add", add_in, ["s" if relu else "y"]),
         *([helper.make_node("Relu", ["s"], ["y"])] if relu else []),
         *([helper.make_node("Identity", ["x"], [taken])] if taken else [])], "widen",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 6, 6]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 3, h_side, h_side])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names],
        [numpy_helper.from_array(np.asarray(pads, np.int64), "pads"),
         numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


WIDEN = [0, 0, 0, 0, 0, 16, 0, 0]


@pytest.mark.parametrize(("pads", "options", "ops"), [
    (WIDEN, {}, ["Conv", "Conv", "Add", "Concat"]),
    (WIDEN, {"conv_first": True}, ["Conv", "Conv", "Add", "Concat"]),
    # The Relu after the sum goes into both halves (its output stays the graph's).
    (WIDEN, {"relu": True}, ["Conv", "Conv", "Add", "Relu", "Relu", "Concat"]),
    # ...but not when the sum is read elsewhere too.
    (WIDEN, {"relu": True, "returned": ("s",)}, ["Conv", "Conv", "Add", "Concat", "Relu"]),
    # Not a channel pad, a pad or conv output read elsewhere too, a broadcasting
    # Add, a name the rewrite would give already taken: left as they were.
    ([0, 0, 0, 0, 0, 0, 0, 0], {}, ["Pad", "Conv", "Add"]),
    ([0, 16, 0, 0, 0, 0, 0, 0], {}, ["Pad", "Conv", "Add"]),
    # Channels that do not fill whole blocks of the blocked layout.
    ([0, 0, 0, 0, 0, 4, 0, 0], {}, ["Pad", "Conv", "Add"]),
    (WIDEN, {"relu": True, "returned": ("c",)}, ["Pad", "Conv", "Add", "Relu"]),
    (WIDEN, {"returned": ("p",)}, ["Pad", "Conv", "Add"]),
    (WIDEN, {"h_side": 1}, ["Pad", "Conv", "Add"]),
    (WIDEN, {"taken": "y__lo"}, ["Pad", "Conv", "Add", "Identity"]),
])
def test_channel_pad_becomes_a_split_conv_and_a_concat(
    pads: list[int], options: dict[str, Any], ops: list[str]
) -> None:
    model = _widening_block(pads, **options)
    rng = np.random.default_rng(9)
    side = options.get("h_side", 6)
    feeds = {"x": rng.normal(0, 2, (1, 16, 6, 6)).astype(np.float32),
             "h": rng.normal(0, 2, (1, 3, side, side)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    _channel_pads_as_concats(model)
    assert [n.op_type for n in model.graph.node] == ops
    got = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_per_pixel_prelu_keeps_the_exact_form() -> None:
    slope = np.random.default_rng(6).uniform(-1.5, 1.5, (4, 5, 5)).astype(np.float32)
    model = _prelu_model(slope)
    split = postprocess_graph(model, output_names=None, dynamic_batch=False)
    assert [n.op_type for n in split.graph.node] == ["Relu", "Neg", "Relu", "Mul", "Add"]
    session = ort.InferenceSession(split.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(7).normal(0, 3, (1, 4, 5, 5)).astype(np.float32)
    (got,) = session.run(None, {"input": x})
    assert np.array_equal(got, np.where(x > 0, x, x * slope))


def test_conversion_is_reproducible(src_dir: Path, settings: Settings, tmp_path: Path) -> None:
    src = tflite_file(settings, "facemesh", src_dir)
    convert_tflite(src, tmp_path / "a.onnx")
    convert_tflite(src, tmp_path / "b.onnx")
    assert sha256_file(tmp_path / "a.onnx") == sha256_file(tmp_path / "b.onnx")


def test_bad_inputs_raise_build_error(src_dir: Path, settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(BuildError):
        convert_tflite(tmp_path / "missing.tflite", tmp_path / "x.onnx")
    src = tflite_file(settings, "iris", src_dir)
    with pytest.raises(BuildError):
        convert_tflite(src, tmp_path / "x.onnx", output_names=["only_one"])
    not_tflite = tmp_path / "junk.tflite"
    not_tflite.write_bytes(b"not a flatbuffer" * 10)
    with pytest.raises(BuildError):
        convert_tflite(not_tflite, tmp_path / "y.onnx")
    assert not (tmp_path / "x.onnx").exists()
    assert not (tmp_path / "y.onnx").exists()
