"""The neural swapper plug-in, tested with tiny ONNX models built in the tests.

We ship no face-swap model, so every model (``swap_models``) is generated with
``onnx.helper`` with the exact inswapper-style I/O contract (target ``[N, 3, S, S]``,
source ``[N, D]`` → output ``[N, 3, S, S]``) and registered in a temporary model
directory beside the real zoo; the faces are the real sample photos.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError, ModelCorruptError, ModelMissingError
from facefuse.faces.align import ARCFACE_112, ARCFACE_128, similarity_transform
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.recognizer import normalize
from facefuse.faces.types import Face
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.swappers.onnx import runner as onnx_swapper
from facefuse.fusion.swappers.onnx.contract import parse_contract
from facefuse.fusion.swappers.onnx.crop import (
    align_transform,
    arcface_points,
    crop_face,
    paste_back,
    template_points,
)
from facefuse.fusion.swappers.onnx.runner import OnnxSwapper
from facefuse.fusion.types import FuseOptions
from facefuse.runtime.files import sha256_file
from facefuse.runtime.manifest import (
    ModelSpec,
    Preprocessing,
    Source,
    TensorSpec,
)
from facefuse.runtime.onnx_file import last_initializer
from facefuse.runtime.registry import ModelRegistry
from swap_models import (
    CONST,
    OPSET,
    K,
    ModelDir,
    const_model,
    identity_model,
    latent_model,
    make_model,
    swap_spec,
    toy_recognizer,
)

rng = np.random.default_rng(1234)
#: Projections stored with the models (inswapper's ``emap`` analogue), (D_in, D).
P_INIT = rng.normal(size=(128, 64)).astype(np.float32)
P_FILE = rng.normal(size=(128, 32)).astype(np.float32)


def psnr(a: np.ndarray, b: np.ndarray, where: np.ndarray | None = None) -> float:
    d = (np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2
    mse = float(d[where].mean() if where is not None else d.mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


# ----------------------------------------------------------------------------------------
# A temporary model directory: the real zoo plus the test models
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swap_settings(settings: Settings, model_dir: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Settings:
    md = ModelDir(tmp_path_factory.mktemp("swap_models"), model_dir)
    for s in (128, 512):
        md.add_swap(f"identity{s}", identity_model(s), s, 128)
    md.add_swap("identity_dlib", identity_model(150), 150, 128, template="dlib_150")
    md.add_swap("identity_112", identity_model(112), 112, 128, template="arcface_112")
    # Colour order and output range: BGR model, -1..1 output, (pixel - 127.5) / 127.5 input.
    md.add_swap("const", const_model(128), 128, 128)
    md.add_swap("const_bgr", const_model(128), 128, 128, color="BGR", mean=127.5, std=127.5,
                output_range="-1..1")
    md.add_swap("latent_init", latent_model(128, 64, P_INIT), 128, 64,
                projection="initializer:last")
    np.save(md.path / "p_file.npy", P_FILE)
    md.add_swap("latent_file", latent_model(128, 32), 128, 32, latent="embedding",
                projection="file:p_file.npy",
                projection_sha256=sha256_file(md.path / "p_file.npy"))
    md.add_swap("latent_plain", latent_model(128, 128), 128, 128, latent="embedding")
    # Another recognizer from the registry: the toy "embed" model (3 values per face).
    sha, size = md.write(toy_recognizer(), "toy_rec.onnx")
    md.add(ModelSpec(
        name="toy_rec", task="embed", file="toy_rec.onnx", sha256=sha, size=size, opset=OPSET,
        inputs=[TensorSpec("input", ["N", 3, 112, 112])],
        outputs=[TensorSpec("embedding", ["N", 3])],
        preprocessing=Preprocessing(size=(112, 112), mean=(127.5,) * 3, std=(127.5,) * 3),
        source=Source("test-generated", "-", "-", "test only"), licence="test only",
        extra={"template": "arcface_112"}))
    md.add_swap("latent_toy", latent_model(128, 3), 128, 3, recognizer="toy_rec",
                latent="embedding")
    # Contract violations only the graph (or the registry) can reveal.
    md.add_swap("bad_graph_dims", identity_model(128, d=128, d_graph=64), 128, 128)
    md.add_swap("bad_graph_names", identity_model(128, target="image"), 128, 128)
    md.add_swap("bad_projection_shape", latent_model(128, 64, P_INIT[:100]), 128, 64,
                projection="initializer:last")
    md.add_swap("bad_no_projection", latent_model(128, 64), 128, 64)
    md.add_swap("bad_recognizer_missing", identity_model(128), 128, 128,
                recognizer="arcface_w600k")
    md.add_swap("bad_recognizer_task", identity_model(128), 128, 128, recognizer="facemesh")
    md.add_swap("bad_projection_file", latent_model(128, 32), 128, 32,
                projection="file:absent.npy")
    md.add_swap("bad_projection_sha", latent_model(128, 32), 128, 32,
                projection="file:p_file.npy", projection_sha256="0" * 64)
    md.save()
    return settings.replace(models_dir=md.path)


@pytest.fixture(scope="module")
def swap_registry(swap_settings: Settings) -> ModelRegistry:
    return ModelRegistry(swap_settings)


@pytest.fixture(scope="module")
def fuser(swap_settings: Settings, swap_registry: ModelRegistry) -> FaceFuser:
    return FaceFuser(swap_settings, FaceAnalyser(swap_settings, swap_registry))


@pytest.fixture(scope="module")
def faces(analyser: FaceAnalyser, sample_images: dict[str, np.ndarray]) -> dict[str, Face]:
    return {n: analyser.analyse(sample_images[n])[0] for n in ("obama", "biden", "astronaut")}


def render(registry: ModelRegistry, name: str, images: dict[str, np.ndarray],
           faces: dict[str, Face], source: str, target: str, degree: float = 100.0
           ) -> Any:
    sw = OnnxSwapper(registry, name)
    return sw.render(images[source], faces[source], images[target], faces[target],
                     FuseOptions(degree=degree, swapper=name))


# ----------------------------------------------------------------------------------------
# Alignment
# ----------------------------------------------------------------------------------------


def test_arcface_points_follow_the_template_order(faces: dict[str, Face]) -> None:
    """Image-left eye, image-right eye, nose tip, image-left / image-right mouth corner."""
    for face in faces.values():
        assert face.landmarks is not None
        p = arcface_points(face.landmarks)
        assert p[0, 0] < p[1, 0]  # image-left eye first, as in ARCFACE_112
        assert p[3, 0] < p[4, 0]  # image-left mouth corner first
        assert p[2, 1] > p[:2, 1].max()  # nose below the eyes
        assert p[3:, 1].min() > p[2, 1]  # mouth below the nose


@pytest.mark.parametrize(("template", "points", "size"),
                         [("arcface_128", ARCFACE_128, 128), ("arcface_112", ARCFACE_112, 112),
                          ("arcface_128", ARCFACE_128 * 2, 256)])
def test_align_transform_lands_the_face_on_the_template(
    faces: dict[str, Face], template: str, points: np.ndarray, size: int
) -> None:
    np.testing.assert_allclose(template_points(template, size), points)
    for face in faces.values():
        assert face.landmarks is not None
        lm = face.landmarks.astype(np.float64)
        for quarter_turns in range(4):  # a face turned by 90° aligns just as well
            rot = lm.copy()
            for _ in range(quarter_turns):
                rot[:, :2] = np.stack([rot[:, 1], -rot[:, 0]], axis=1)
            M = align_transform(rot, template, size)
            pts = arcface_points(rot) @ M[:, :2].T + M[:, 2]
            err = np.linalg.norm(pts - points, axis=1)
            assert err.max() < 0.08 * size, (quarter_turns, err)
            # The fit is a similarity: same scale on both axes, no reflection.
            assert np.linalg.det(M[:, :2]) > 0


def _similarity(scale: float, angle_deg: float, centre: tuple[float, float],
                size: int) -> np.ndarray:
    """Image → crop affine: rotate/scale about ``centre``, which lands on the crop centre."""
    a = math.radians(angle_deg)
    A = scale * np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    t = np.full(2, (size - 1) / 2.0) - A @ np.asarray(centre)
    return np.hstack([A, t[:, None]])


@pytest.mark.parametrize("scale", [1.7, 0.8, 0.45, 0.3, 0.1])
def test_crop_samples_the_right_place(scale: float) -> None:
    """On a linear ramp every filter is exact, so each crop pixel must hold the ramp's
    value at its preimage — through the area-resize and blur paths too."""
    h, w = 1500, 1400
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    image = np.stack([xs, ys, 0.5 * xs + 0.25 * ys + 7.0], axis=-1)
    size = 96
    M = _similarity(scale, 23.0, (700.3, 745.8), size)
    crop = crop_face(image, M, size)
    q = np.stack(np.meshgrid(np.arange(size), np.arange(size)), -1).reshape(-1, 2)
    pre = (q - M[:, 2]) @ np.linalg.inv(M[:, :2]).T
    want = np.stack([pre[:, 0], pre[:, 1], 0.5 * pre[:, 0] + 0.25 * pre[:, 1] + 7.0], -1)
    err = crop.reshape(-1, 3) - want  # channels 0, 1: position error in image pixels
    # No bias (a half-pixel slip in the area-resize path gives 0.05–2 px here), and
    # only OpenCV's float32 area weights as jitter.
    assert np.abs(err.mean(axis=0)).max() < 0.01
    assert np.abs(err).max() < 0.06


def test_crop_does_not_alias_when_it_shrinks_the_face() -> None:
    """A pixel checkerboard shrunk 3× must come out flat grey, not as moiré."""
    board = ((np.indices((900, 900)).sum(axis=0) % 2) * 255).astype(np.uint8)
    image = np.repeat(board[..., None], 3, axis=-1)
    crop = crop_face(image, _similarity(1 / 3.1, 10.0, (450.0, 450.0), 128), 128)
    assert abs(float(crop.mean()) - 127.5) < 2.0
    assert float(crop.std()) < 4.0


def test_paste_back_inverts_the_crop_and_marks_its_footprint() -> None:
    size = 64
    M = _similarity(0.5, -17.0, (200.0, 150.0), size)
    v, u = np.mgrid[0:size, 0:size].astype(np.float32)
    crop = np.stack([u, v, u + v], axis=-1)
    region = (100, 50, 320, 260)
    face, valid = paste_back(crop, M, region, feather=6.0)
    assert face.shape == (210, 220, 3)
    assert valid.shape == (210, 220)
    ys, xs = np.mgrid[50:260, 100:320].astype(np.float64)
    cu = M[0, 0] * xs + M[0, 1] * ys + M[0, 2]
    cv = M[1, 0] * xs + M[1, 1] * ys + M[1, 2]
    inside = (cu >= 0) & (cv >= 0) & (cu <= size - 1) & (cv <= size - 1)
    np.testing.assert_allclose(face[inside][:, 0], cu[inside], atol=1e-3)
    np.testing.assert_allclose(face[inside][:, 1], cv[inside], atol=1e-3)
    assert valid[~inside].max() == 0.0
    deep = (cu >= 7) & (cv >= 7) & (cu <= size - 8) & (cv <= size - 8)  # > 12 image px in
    assert valid[deep].min() == 1.0
    ramp = inside & ~deep
    assert 0.0 < valid[ramp].mean() < 1.0


# ----------------------------------------------------------------------------------------
# Rendering with the test models
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "min_psnr"),
                         [("identity512", 35.0), ("identity128", 26.0),
                          ("identity_dlib", 28.0), ("identity_112", 26.0)])
def test_identity_model_round_trips_the_crop(
    swap_registry: ModelRegistry, sample_images: dict[str, np.ndarray],
    faces: dict[str, Face], name: str, min_psnr: float
) -> None:
    """Align → crop → model → paste back by the inverse affine gives the target back.

    A half-pixel misplacement of the paste-back costs about 4 dB on these faces
    (33 dB at 512 px), a whole pixel about 10 dB.
    """
    for who in ("obama", "biden"):
        layer = render(swap_registry, name, sample_images, faces, who, who)
        x0, y0, x1, y1 = layer.region
        bg = sample_images[who][y0:y1, x0:x1]
        inside = layer.mask > 0.5
        assert inside.mean() > 0.3
        assert psnr(layer.face, bg, inside) >= min_psnr, who


def test_identity_round_trip_through_the_engine(
    fuser: FaceFuser, sample_images: dict[str, np.ndarray], faces: dict[str, Face]
) -> None:
    """Degree 100 with an identity model: the fused image ≈ the target inside the
    crop, and bit-identical outside the face region."""
    target = sample_images["biden"]
    res = fuser.fuse_faces(sample_images["obama"], faces["obama"], target, [faces["biden"]],
                           [0], FuseOptions(degree=100, swapper="identity512", evaluate=False))
    x0, y0, x1, y1 = res.fused[0].region
    outside = np.ones(target.shape[:2], bool)
    outside[y0:y1, x0:x1] = False
    assert np.array_equal(res.image[outside], target[outside])
    inside = res.fused[0].mask > 0.5
    assert psnr(res.image[y0:y1, x0:x1], target[y0:y1, x0:x1], inside) >= 35.0


@pytest.mark.parametrize(("name", "rgb"), [
    ("const", [255 * c for c in CONST]),
    # BGR model with -1..1 output: channel order reversed, value (v + 1) · 127.5.
    ("const_bgr", [(c + 1) * 127.5 for c in reversed(CONST)]),
])
def test_constant_model_colours_the_face_only(
    swap_registry: ModelRegistry, fuser: FaceFuser, sample_images: dict[str, np.ndarray],
    faces: dict[str, Face], name: str, rgb: list[float]
) -> None:
    want = np.array(rgb, np.float32)
    layer = render(swap_registry, name, sample_images, faces, "biden", "obama")
    core = layer.mask > 0.99
    assert core.sum() > 10_000
    np.testing.assert_allclose(layer.face[core], np.broadcast_to(want, (int(core.sum()), 3)),
                               atol=0.01)
    # At degree 40 the layer is 40% of the way from the target to the colour.
    half = render(swap_registry, name, sample_images, faces, "biden", "obama", degree=40)
    x0, y0, x1, y1 = half.region
    bg = sample_images["obama"][y0:y1, x0:x1].astype(np.float32)
    np.testing.assert_allclose(half.face, bg + 0.4 * (layer.face - bg), atol=0.01)
    # Through the engine: the face takes the colour, nothing outside the region moves.
    # (Straight alpha shows the layer exactly; multi-band lets the surroundings'
    # lowest frequencies into the face, as it should, so it is only near the colour.)
    target = sample_images["obama"]
    inner = cv2.erode(core.astype(np.uint8), np.ones((15, 15), np.uint8)).astype(bool)
    assert np.abs(target[y0:y1, x0:x1][inner].astype(np.float32) - want).mean() > 30
    cases: tuple[tuple[Literal["alpha", "multiband"], float], ...] = (
        ("alpha", 1.0), ("multiband", 8.0))
    for blend, tol in cases:
        res = fuser.fuse_faces(sample_images["biden"], faces["biden"], target, [faces["obama"]],
                               [0], FuseOptions(degree=100, swapper=name, blend=blend,
                                                evaluate=False))
        assert res.fused[0].region == layer.region
        outside = np.ones(target.shape[:2], bool)
        outside[y0:y1, x0:x1] = False
        assert np.array_equal(res.image[outside], target[outside])
        got = res.image[y0:y1, x0:x1][inner].astype(np.float32)
        assert np.abs(np.median(got, axis=0) - want).max() <= tol, blend


def _grey(layer: Any) -> float:
    core = layer.mask > 0.99
    values = layer.face[core]
    assert values.std() < 1e-3  # one grey level over the whole face
    return float(values.mean())


def test_latent_uses_the_projection_from_the_last_initializer(
    swap_registry: ModelRegistry, sample_images: dict[str, np.ndarray], faces: dict[str, Face]
) -> None:
    """latent = normalize(normalize(emb) @ P), P = the model's last initializer."""
    greys = {}
    for who in ("obama", "biden"):
        emb = faces[who].embedding
        assert emb is not None
        latent = normalize(normalize(emb) @ P_INIT)
        sw = OnnxSwapper(swap_registry, "latent_init")
        np.testing.assert_allclose(sw.source_latent(sample_images[who], faces[who])[0], latent,
                                   atol=1e-5)
        greys[who] = _grey(render(swap_registry, "latent_init", sample_images, faces, who,
                                  "astronaut"))
        want = float(np.clip((0.5 + K * latent.mean()) * 255.0, 0, 255))
        assert greys[who] == pytest.approx(want, abs=0.05)
        # Without the projection the model would see another grey.
        assert abs(want - (0.5 + K * normalize(emb)[:64].mean()) * 255.0) > 0.5
    # The source identity drives the output: the two greys differ by ~0.9 (each is
    # rendered to within 0.05 of its expected value); one ignoring the latent: 0.
    assert abs(greys["obama"] - greys["biden"]) > 0.5


def test_latent_from_a_projection_file_and_unprojected(
    swap_registry: ModelRegistry, sample_images: dict[str, np.ndarray], faces: dict[str, Face]
) -> None:
    """latent "embedding" uses dlib's raw vector; a .npy projection re-normalises."""
    for who in ("obama", "biden"):
        raw = faces[who].embedding_raw
        assert raw is not None
        projected = OnnxSwapper(swap_registry, "latent_file").source_latent(
            sample_images[who], faces[who])[0]
        np.testing.assert_allclose(projected, normalize(raw @ P_FILE), atol=1e-5)
        plain = OnnxSwapper(swap_registry, "latent_plain").source_latent(
            sample_images[who], faces[who])[0]
        np.testing.assert_allclose(plain, raw, atol=1e-6)
        grey = _grey(render(swap_registry, "latent_plain", sample_images, faces, who, "obama"))
        assert grey == pytest.approx((0.5 + K * float(raw.mean())) * 255.0, abs=0.05)


def test_latent_from_another_recognizer_in_the_registry(
    swap_registry: ModelRegistry, sample_images: dict[str, np.ndarray], faces: dict[str, Face],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The toy recognizer averages its 112-px ArcFace chip: the latent is the source
    face's mean colour, normalised as its manifest entry says."""
    calls: list[str] = []
    real = onnx_swapper.recognizer_embedding

    def counting(*args: Any) -> np.ndarray:
        calls.append("embed")
        return real(*args)

    monkeypatch.setattr(onnx_swapper, "recognizer_embedding", counting)
    for who in ("obama", "biden"):
        face = faces[who]
        assert face.landmarks is not None
        sw = OnnxSwapper(swap_registry, "latent_toy")
        calls.clear()
        got = sw.source_latent(sample_images[who], face)[0]
        np.testing.assert_array_equal(sw.source_latent(sample_images[who], face)[0], got)
        assert calls == ["embed"]  # computed once per source face
        # Independently: OpenCV's own similarity warp onto ARCFACE_112, no anti-aliasing.
        M = similarity_transform(face.landmarks[[468, 473, 1, 61, 291], :2], ARCFACE_112)
        chip = cv2.warpAffine(sample_images[who], M, (112, 112), flags=cv2.INTER_LINEAR)
        want = (chip.reshape(-1, 3).astype(np.float64).mean(axis=0) - 127.5) / 127.5
        np.testing.assert_allclose(got, want, atol=0.02)
    a = OnnxSwapper(swap_registry, "latent_toy").source_latent(sample_images["obama"],
                                                               faces["obama"])
    b = OnnxSwapper(swap_registry, "latent_toy").source_latent(sample_images["biden"],
                                                               faces["biden"])
    assert np.abs(a - b).max() > 0.02


# ----------------------------------------------------------------------------------------
# The ONNX reader
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "raw"), [
    (TensorProto.FLOAT, True), (TensorProto.FLOAT, False),  # raw_data / float_data
    (TensorProto.FLOAT16, True), (TensorProto.FLOAT16, False),  # raw_data / int32_data
    (TensorProto.DOUBLE, True), (TensorProto.DOUBLE, False),  # raw_data / double_data
])
def test_last_initializer_matches_onnx(tmp_path: Path, dtype: int, raw: bool) -> None:
    np_type = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    last = rng.normal(size=(7, 5)).astype(np_type)
    first = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "first")
    if raw:
        emap = numpy_helper.from_array(last, "emap")
    else:
        emap = oh.make_tensor("emap", dtype, list(last.shape), last.ravel().tolist())
    assert emap.HasField("raw_data") == raw
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    model = make_model([oh.make_node("Add", ["x", "first"], ["y"])], [x], [y], [first, emap])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    got = last_initializer(path)
    assert got.dtype == np.float32
    ref = numpy_helper.to_array(onnx.load(path).graph.initializer[-1])
    np.testing.assert_array_equal(got, ref.astype(np.float32))
    np.testing.assert_array_equal(got, last.astype(np.float32))


def test_last_initializer_errors_are_typed(tmp_path: Path) -> None:
    path = tmp_path / "none.onnx"
    path.write_bytes(identity_model(16).SerializeToString())
    with pytest.raises(ModelCorruptError, match="no initializers"):
        last_initializer(path)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x3a\xff\xff\xff\x0f not protobuf")
    with pytest.raises(ModelCorruptError, match="cannot read"):
        last_initializer(junk)


# ----------------------------------------------------------------------------------------
# Contract violations → typed errors
# ----------------------------------------------------------------------------------------


def _good() -> ModelSpec:
    return swap_spec("m", "m.onnx", "0" * 64, 1, 128, 512)


_BAD_SPECS: list[tuple[Callable[[ModelSpec], ModelSpec], str]] = [
    (lambda s: dataclasses.replace(s, inputs=s.inputs[:1]), "needs 2 inputs"),
    (lambda s: dataclasses.replace(s, outputs=[*s.outputs, s.outputs[0]]), "needs 1 output"),
    (lambda s: dataclasses.replace(s, inputs=[TensorSpec("target", ["N", 3, 128, 112]),
                                              s.inputs[1]]), r"input 'target'.*\[N, 3, 128, 128\]"),
    (lambda s: dataclasses.replace(s, inputs=[s.inputs[0], TensorSpec("source", ["N", "D"])]),
     "fixed D"),
    (lambda s: dataclasses.replace(s, outputs=[TensorSpec("output", ["N", 3, 128, 128],
                                                          "float16")]), "float32"),
    (lambda s: dataclasses.replace(s, preprocessing=Preprocessing((128, 96))), "square"),
    (lambda s: dataclasses.replace(s, preprocessing=Preprocessing((128, 128), layout="NHWC")),
     "layout"),
    (lambda s: dataclasses.replace(s, preprocessing=Preprocessing((128, 128), color="YUV")),
     "color"),
    (lambda s: dataclasses.replace(s, preprocessing=Preprocessing((128, 128), std=(1, 0, 1))),
     "std"),
    (lambda s: dataclasses.replace(s, extra={**s.extra, "template": "ffhq_512"}), "template"),
    (lambda s: dataclasses.replace(s, extra={**s.extra, "latent": "raw"}), "latent"),
    (lambda s: dataclasses.replace(s, extra={k: v for k, v in s.extra.items()
                                             if k != "output_range"}), "output_range"),
    (lambda s: dataclasses.replace(s, extra={**s.extra, "recognizer": ""}), "recognizer"),
    (lambda s: dataclasses.replace(s, extra={**s.extra, "projection": "file:../x.npy"}),
     "projection"),
    (lambda s: dataclasses.replace(s, extra={**s.extra, "projection": "initializer:first"}),
     "projection"),
    (lambda s: dataclasses.replace(s, task="embed"), "task"),
]


@pytest.mark.parametrize(("mutate", "what"), _BAD_SPECS)
def test_bad_manifest_entry_is_a_typed_error(
    mutate: Callable[[ModelSpec], ModelSpec], what: str
) -> None:
    assert parse_contract(_good()).latent_dims == 512
    with pytest.raises(ModelCorruptError, match=what) as info:
        parse_contract(mutate(_good()))
    assert info.value.code == "swap_contract"
    assert "'m'" in info.value.message  # names the model


@pytest.mark.parametrize(("name", "error", "what"), [
    ("bad_graph_dims", ModelCorruptError, r"graph input 'source' has shape \['N', 64\]"),
    ("bad_graph_names", ModelCorruptError, r"graph's inputs are \['image', 'source'\]"),
    ("bad_projection_shape", ModelCorruptError, "projection is 100×64.*gives 128"),
    ("bad_no_projection", ModelCorruptError, "takes 64 values.*gives 128"),
    ("bad_recognizer_missing", ModelMissingError, "arcface_w600k"),
    ("bad_recognizer_task", ModelCorruptError, "'mesh' model"),
    ("bad_projection_file", ModelMissingError, "absent.npy"),
    ("bad_projection_sha", ModelCorruptError, "projection_sha256"),
])
def test_model_that_breaks_the_contract_is_a_typed_error(
    swap_registry: ModelRegistry, fuser: FaceFuser, sample_images: dict[str, np.ndarray],
    faces: dict[str, Face], name: str, error: type[Exception], what: str
) -> None:
    with pytest.raises(error, match=what):
        OnnxSwapper(swap_registry, name).load()
    # Through the engine too: the error surfaces when the swapper is chosen, not before.
    assert name in fuser.swappers
    with pytest.raises(error, match=what):
        fuser.fuse_faces(sample_images["obama"], faces["obama"], sample_images["biden"],
                         [faces["biden"]], [0], FuseOptions(swapper=name, evaluate=False))


def test_unknown_swapper_is_an_invalid_argument(
    fuser: FaceFuser, sample_images: dict[str, np.ndarray], faces: dict[str, Face]
) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown swapper 'inswapper_128'") as info:
        fuser.fuse_faces(sample_images["obama"], faces["obama"], sample_images["biden"],
                         [faces["biden"]], [0], FuseOptions(swapper="inswapper_128"))
    assert info.value.code == "unknown_swapper"


# ----------------------------------------------------------------------------------------
# End to end: FaceFuser.fuse with the model registered in the model directory
# ----------------------------------------------------------------------------------------


def test_fuse_end_to_end_with_a_registered_swapper(
    fuser: FaceFuser, sample_paths: dict[str, Path], sample_images: dict[str, np.ndarray]
) -> None:
    swap_names = {n for n, s in fuser.analyser.registry.manifest.models.items()
                  if s.task == "swap"}
    assert swap_names <= set(fuser.swappers)
    assert "toy_rec" not in fuser.swappers
    assert "classic" in fuser.swappers
    target = sample_images["obama"]
    res = fuser.fuse(sample_paths["biden"], sample_paths["obama"], degree=100,
                     swapper="latent_init", blend="alpha")
    assert res.image.shape == target.shape
    assert res.image.dtype == np.uint8
    (ff,) = res.fused
    x0, y0, x1, y1 = ff.region
    outside = np.ones(target.shape[:2], bool)
    outside[y0:y1, x0:x1] = False
    assert np.array_equal(res.image[outside], target[outside])
    src_emb = res.source_face.embedding
    assert src_emb is not None
    want = (0.5 + K * normalize(normalize(src_emb) @ P_INIT).mean()) * 255.0
    inner = cv2.erode((ff.mask > 0.99).astype(np.uint8), np.ones((15, 15), np.uint8)) > 0
    got = res.image[y0:y1, x0:x1][inner].astype(np.float32)
    assert np.abs(np.median(got, axis=0) - want).max() <= 1.0
    assert {"id_sim_source", "id_sim_target", "seam_ratio"} <= set(ff.quality)
    # The identity model keeps the target's identity: the report says so.
    same = fuser.fuse(sample_paths["biden"], sample_paths["obama"], degree=100,
                      swapper="identity512")
    q = same.quality
    assert q["id_sim_target"] > 0.95
    assert q["id_sim_target"] > q["id_sim_source"] + 0.1


def test_the_source_is_embedded_for_a_swapper_that_reads_its_embedding(
    fuser: FaceFuser, sample_paths: dict[str, Path]
) -> None:
    # No quality figures asked for: only the swapper's own declaration makes the
    # source photo's analysis carry the embedding its latent is made from.
    assert fuser.swappers["latent_init"].needs_source_embedding
    assert not fuser.swappers["classic"].needs_source_embedding
    neural = fuser.fuse(sample_paths["biden"], sample_paths["obama"], swapper="latent_init",
                        evaluate=False)
    assert neural.source_face.embedding is not None and len(neural.fused) == 1
    classic = fuser.fuse(sample_paths["biden"], sample_paths["obama"], evaluate=False)
    assert classic.source_face.embedding is None


def test_layer_is_the_target_where_the_crop_does_not_reach(
    swap_registry: ModelRegistry, sample_images: dict[str, np.ndarray], faces: dict[str, Face]
) -> None:
    """No invented (border-repeated) crop content in the layer: outside the crop's
    footprint the layer is the target's own pixels, and the mask is zero there."""
    for who in ("obama", "biden"):
        face = faces[who]
        assert face.landmarks is not None
        layer = render(swap_registry, "const", sample_images, faces, "obama", who)
        x0, y0, x1, y1 = layer.region
        ys, xs = np.mgrid[y0:y1, x0:x1]
        M = align_transform(face.landmarks.astype(np.float64), "arcface_128", 128)
        u = M[0, 0] * xs + M[0, 1] * ys + M[0, 2]
        v = M[1, 0] * xs + M[1, 1] * ys + M[1, 2]
        off = (u < -1) | (v < -1) | (u > 128) | (v > 128)
        assert off.sum() > 1000, who  # the region does reach past the crop
        bg = sample_images[who][y0:y1, x0:x1].astype(np.float32)
        np.testing.assert_array_equal(layer.face[off], bg[off])
        assert layer.mask[off].max() == 0.0


def test_face_cut_by_the_image_border(
    swap_registry: ModelRegistry, sample_images: dict[str, np.ndarray], faces: dict[str, Face]
) -> None:
    """The same face with its image-left third cut off: the crop repeats the border,
    the layer stays inside the image and the visible part round-trips."""
    face = faces["obama"]
    assert face.landmarks is not None
    cut = int(face.landmarks[468, 0])  # through the image-left eye
    image = np.ascontiguousarray(sample_images["obama"][:, cut:])
    lm = face.landmarks.copy()
    lm[:, 0] -= cut
    shifted = dataclasses.replace(face, landmarks=lm)
    layer = OnnxSwapper(swap_registry, "identity512").render(
        sample_images["biden"], faces["biden"], image, shifted, FuseOptions())
    x0, y0, x1, y1 = layer.region
    assert x0 == 0
    assert x1 <= image.shape[1]
    assert layer.face.shape[:2] == layer.mask.shape == (y1 - y0, x1 - x0)
    # Full weight up to the border (the border is not a seam) where the face is.
    assert layer.mask[:, 0].max() > 0.99
    assert psnr(layer.face, image[y0:y1, x0:x1], layer.mask > 0.5) >= 35.0
