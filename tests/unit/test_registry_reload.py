"""ModelRegistry.reload: all-or-nothing swap of verified sessions from the manifest on disk."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from facefuse.config import Settings
from facefuse.errors import ModelCorruptError, ModelMissingError
from facefuse.runtime.manifest import MANIFEST_NAME, Manifest
from facefuse.runtime.registry import ModelRegistry

NAME = "blazeface_short"


@pytest.fixture
def models(model_dir: Path, tmp_path: Path) -> Path:
    out = tmp_path / "models"
    out.mkdir()
    for f in model_dir.glob("*.onnx"):
        (out / f.name).symlink_to(f)
    shutil.copy(model_dir / MANIFEST_NAME, out / MANIFEST_NAME)
    return out


def publish(models: Path, data: bytes, filename: str, sha256: str | None = None) -> str:
    (models / filename).write_bytes(data)
    manifest = Manifest.load(models)
    spec = manifest.models[NAME]
    digest = sha256 or hashlib.sha256(data).hexdigest()
    manifest.models[NAME] = type(spec)(**{**spec.__dict__, "file": filename, "sha256": digest,
                                          "size": len(data)})
    manifest.save(models)
    return digest


def test_reload_swaps_changed_models_and_keeps_unchanged_sessions(models: Path) -> None:
    registry = ModelRegistry(Settings.from_env(threads=1, models_dir=models, precision="fp32"))
    old = registry.get(NAME)
    mesh = registry.get("facemesh")
    assert registry.reload() == []
    assert registry.get(NAME) is old and registry.get("facemesh") is mesh

    proto = onnx.load(str(models / f"{NAME}.onnx"))
    proto.doc_string = "republished"
    digest = publish(models, proto.SerializeToString(), f"{NAME}.v2.onnx")
    assert registry.reload() == [NAME]
    new = registry.get(NAME)
    assert new is not old and new.spec.sha256 == digest
    assert registry.get("facemesh") is mesh
    x = np.random.default_rng(0).random((2, 3, 128, 128), dtype=np.float32)
    for a, b in zip(old.run(x), new.run(x), strict=True):  # the old session still works
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("problem", ["not_onnx", "sha_mismatch", "missing_file"])
def test_a_bad_model_is_refused_and_the_old_one_keeps_serving(
    models: Path, problem: str
) -> None:
    registry = ModelRegistry(Settings.from_env(threads=1, models_dir=models, precision="fp32"))
    old = registry.get(NAME)
    if problem == "not_onnx":
        publish(models, b"not a model" * 50, f"{NAME}.bad.onnx")
        expected: type[Exception] = ModelCorruptError
    elif problem == "sha_mismatch":
        publish(models, (models / f"{NAME}.onnx").read_bytes(), f"{NAME}.v3.onnx", "0" * 64)
        expected = ModelCorruptError
    else:
        publish(models, b"x", f"{NAME}.gone.onnx")
        (models / f"{NAME}.gone.onnx").unlink()
        expected = ModelMissingError
    with pytest.raises(expected):
        registry.reload()
    assert registry.get(NAME) is old
    assert registry.manifest.models[NAME].sha256 == old.spec.sha256
