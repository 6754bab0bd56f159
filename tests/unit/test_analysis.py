"""The public analysis API, the model zoo's integrity checks and the CLI's error codes."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import facefuse
from facefuse.cli import main as cli_main
from facefuse.config import Settings
from facefuse.errors import ModelCorruptError, ModelMissingError
from facefuse.faces.analyser import FaceAnalyser
from facefuse.runtime.manifest import Manifest
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.build.zoo import ZOO
from facefuse.toolchain.samples import SAMPLES, identity_of


def test_analyse_accepts_array_path_and_bytes(analyser: FaceAnalyser, sample_paths: dict[str, Path]) -> None:
    path = sample_paths["obama"]
    from_path = analyser.analyse(path)
    from_bytes = analyser.analyse(path.read_bytes())
    from_array = analyser.analyse(analyser.decode(path))
    for faces in (from_path, from_bytes, from_array):
        assert len(faces) == 1
        f = faces[0]
        assert f.landmarks is not None and f.landmarks.shape == (478, 3)
        assert f.landmarks5 is not None and f.landmarks5.shape == (5, 2)
        assert f.embedding is not None and f.embedding.shape == (128,)
        assert abs(float(np.linalg.norm(f.embedding)) - 1.0) < 1e-5
        assert f.chip_transform is not None and f.chip_transform.shape == (2, 3)
    a, b = from_path[0].embedding, from_bytes[0].embedding
    assert a is not None and b is not None and np.allclose(a, b)


def test_identity_distances_separate_people(analyser: FaceAnalyser, sample_images: dict[str, np.ndarray], settings: Settings) -> None:
    raw: dict[str, np.ndarray] = {}
    for n, img in sample_images.items():
        vector = analyser.analyse(img)[0].embedding_raw
        assert vector is not None
        raw[n] = vector
    same: list[float] = []
    different: list[float] = []
    for a, b in itertools.combinations(SAMPLES, 2):
        d = float(np.linalg.norm(raw[a] - raw[b]))
        (same if identity_of(a) == identity_of(b) else different).append(d)
    assert max(same) < min(different)
    assert max(same) < settings.same_person_distance < min(different)


def test_attributes_are_plausible(analyser: FaceAnalyser, sample_images: dict[str, np.ndarray]) -> None:
    faces = {n: analyser.analyse(img, attributes=True)[0] for n, img in sample_images.items()}
    assert faces["astronaut"].gender == "female"
    assert faces["obama"].gender == "male" and faces["biden"].gender == "male"
    for f in faces.values():
        assert f.age is not None and 20 < f.age < 90


def test_age_and_gender_load_on_the_first_attributes_request(
        settings: Settings, sample_images: dict[str, np.ndarray]) -> None:
    registry = ModelRegistry(settings)
    analyser = FaceAnalyser(settings, registry)
    chosen = {n: registry.entry(n).spec for n in ("age", "gender")}
    analyser.analyse(sample_images["obama"], attributes=False)
    assert not {"age", "gender"} & set(registry.loaded())
    face = analyser.analyse(sample_images["obama"], attributes=True)[0]
    assert face.age is not None and face.gender == "male"
    loaded = registry.loaded()
    assert {n: loaded[n].spec for n in chosen} == chosen  # the variant chosen is the one run


def test_manifest_records_file_hash_io_source_and_licence(model_dir: Path) -> None:
    manifest = Manifest.load(model_dir)
    assert {e.name for e in ZOO} <= set(manifest.models)
    for spec in manifest.models.values():
        assert len(spec.sha256) == 64 and spec.size > 0 and spec.opset > 0
        assert spec.inputs and spec.outputs and spec.licence
        assert "==" in spec.source.package and len(spec.source.sha256) == 64


@pytest.fixture
def zoo_copy(model_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "models"
    shutil.copytree(model_dir, dst)
    return dst


def test_corrupt_model_is_a_typed_error_naming_the_fix(settings: Settings, zoo_copy: Path) -> None:
    path = zoo_copy / "dlib_resnet.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    registry = ModelRegistry(settings.replace(models_dir=zoo_copy, precision="fp32"))
    with pytest.raises(ModelCorruptError) as exc:
        registry.get("dlib_resnet")
    assert "facefuse models build" in exc.value.message
    assert cli_main(["models", "verify", "--models-dir", str(zoo_copy)]) == 5


def test_missing_model_and_manifest_are_typed_errors(settings: Settings, zoo_copy: Path,
                                                     tmp_path: Path) -> None:
    (zoo_copy / "facemesh.onnx").unlink()
    with pytest.raises(ModelMissingError):
        ModelRegistry(settings.replace(models_dir=zoo_copy, precision="fp32")).get("facemesh")
    with pytest.raises(ModelMissingError) as exc:
        ModelRegistry(settings.replace(models_dir=tmp_path / "empty")).get("facemesh")
    assert exc.value.code == "model_missing"


def test_cli_analyse_prints_json(sample_paths: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["analyse", str(sample_paths["biden"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["faces"]) == 1 and len(out["faces"][0]["bbox"]) == 4


@pytest.mark.parametrize(("content", "code"), [
    (b"", "empty_image"),
    (b"this is not a picture\n" * 10, "unsupported_format"),
])
def test_cli_bad_image_exits_with_the_input_code(tmp_path: Path, content: bytes, code: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "photo.jpg"
    bad.write_bytes(content)
    assert cli_main(["analyse", str(bad)]) == 3
    err = capsys.readouterr().err
    assert f"error[{code}]" in err and "Traceback" not in err


def test_public_analyse_function(sample_paths: dict[str, Path]) -> None:
    faces = facefuse.analyse(sample_paths["astronaut"])
    assert len(faces) == 1
