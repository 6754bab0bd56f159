"""The detector registry is the one door: a detector registered in
``faces/detectors.DETECTORS`` is a valid setting, is built, runs in the library and
in the server, and keys the server's analysis cache apart, with no other edit; an
unknown name fails naming the registered ones; nothing outside the registry, the
detectors' own modules and the model toolchain names a detector; and the server's
analysis key follows the one list of what affects an analysis."""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import facefuse
from facefuse.config import ANALYSIS_FIELDS, Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces import detectors
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.blazeface import BlazeFaceDetector
from facefuse.faces.detector_base import Candidates, Letterbox
from facefuse.faces.detectors import DETECTORS, DetectorEntry, analysis_options
from facefuse.faces.stages import FaceModels
from facefuse.runtime.registry import LoadedModel, ModelRegistry
from facefuse.serving.cache.keys import sha256_hex
from facefuse.serving.pipeline import Pipeline, RequestContext


class CountingDetector(BlazeFaceDetector):
    """BlazeFace full-range that counts the tensors it decodes: a detector the
    project has never heard of."""

    decoded = 0

    def decode_tensor(self, regressors: np.ndarray, scores: np.ndarray,
                      transform: Letterbox) -> Candidates:
        type(self).decoded += 1
        return super().decode_tensor(regressors, scores, transform)


def make_counting(model: LoadedModel, settings: Settings) -> CountingDetector:
    return CountingDetector(model, score_threshold=settings.det_score_threshold,
                            nms_iou=settings.det_nms_iou, tile_above=settings.det_tile_above)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> str:
    """``counting`` registered (one line, as a new detector's is), on the full-range model."""
    monkeypatch.setitem(DETECTORS, "counting", DetectorEntry("blazeface_full", make_counting))
    CountingDetector.decoded = 0
    return "counting"


def test_a_registered_detector_is_a_setting_and_runs_in_the_library(
        fake: str, settings: Settings, registry: ModelRegistry,
        sample_images: dict[str, np.ndarray]) -> None:
    s = Settings.from_env({"FACEFUSE_DETECTOR": fake.upper()}, home=settings.home,
                          models_dir=settings.models_dir)
    assert s.detector == fake
    assert detectors.detectors_in_use(s) == (fake,)
    models = FaceModels.from_registry(s, registry)
    assert {type(d) for d in models.detectors.values()} == {CountingDetector}
    faces = FaceAnalyser(s, registry).analyse(sample_images["obama"], embed=False)
    assert len(faces) == 1 and CountingDetector.decoded > 0


def test_an_unknown_detector_fails_naming_the_registered_ones(
        fake: str, settings: Settings, registry: ModelRegistry) -> None:
    s = settings.replace(detector="nonesuch")
    with pytest.raises(InvalidArgumentError, match=r"auto\|full\|short\|yunet\|counting"):
        FaceModels.from_registry(s, registry)
    with pytest.raises(InvalidArgumentError):
        Settings(detector="")


@pytest.mark.anyio
async def test_a_registered_detector_runs_in_the_server_and_keys_its_cache_apart(
        fake: str, settings: Settings, registry: ModelRegistry,
        sample_paths: dict[str, Path]) -> None:
    data = sample_paths["obama"].read_bytes()
    digest = sha256_hex(data)
    pipeline = Pipeline(settings.replace(detector=fake), registry)
    full = Pipeline(settings.replace(detector="full"), registry)
    try:
        assert "blazeface_full" in pipeline.batchers
        # The same model, another detector: never each other's analysis.
        assert pipeline._l1_key(digest, "largest") != full._l1_key(digest, "largest")
        pipeline.start()
        rgb, _ = await pipeline.decode(data, RequestContext())
        analysis = await pipeline.analyse(rgb, digest, RequestContext(), embed=False)
        assert len(analysis.faces) == 1 and CountingDetector.decoded > 0
        ctx = RequestContext()
        await pipeline.analyse(rgb, digest, ctx, embed=False)
        assert ctx.l1 == ["hit"]
    finally:
        await pipeline.drain(10.0)
        pipeline.close()
        full.close()


@pytest.mark.parametrize("name", ANALYSIS_FIELDS)
def test_every_analysis_field_changes_the_analysis_key(name: str, tmp_path: Path) -> None:
    base = Settings(home=tmp_path)
    value = getattr(base, name)
    changed = {bool: lambda v: not v, int: lambda v: v + 1, float: lambda v: v / 2,
               tuple: lambda v: (*v, "cuda"), type(None): lambda v: tmp_path / "x"}
    if isinstance(value, Path):
        other = base.replace(**{name: value / "x"})
    elif isinstance(value, str):
        choices = {"precision": "fp32", "io_binding": "on", "pixel_backend": "onnx",
                   "detector": "yunet"}
        other = base.replace(**{name: choices[name]})
    else:
        other = base.replace(**{name: changed[type(value)](value)})
    for purpose in detectors.PURPOSES:
        assert analysis_options(other, purpose) != analysis_options(base, purpose), purpose


def test_fields_outside_the_list_leave_the_analysis_key(tmp_path: Path) -> None:
    base = Settings(home=tmp_path)
    others = [f.name for f in dataclasses.fields(Settings) if f.name not in ANALYSIS_FIELDS]
    assert {"l1_cache_bytes", "redis_url", "swapper", "label"} <= set(others)
    moved = base.replace(l1_cache_bytes=1, label=True, same_person_distance=0.5,
                         max_inflight=2)
    assert analysis_options(moved, "all") == analysis_options(base, "all")


def test_auto_keys_by_the_detector_that_runs(tmp_path: Path) -> None:
    auto = Settings(home=tmp_path)
    full, yunet = auto.replace(detector="full"), auto.replace(detector="yunet")
    assert analysis_options(auto, "largest")["detector"] == "full"
    assert analysis_options(auto, "all")["detector"] == "yunet"
    assert analysis_options(full, "largest")["detector"] == "full"
    assert analysis_options(yunet, "largest")["detector"] == "yunet"


def _names_outside_docstrings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    docs = {id(n.body[0].value) for n in ast.walk(tree)  # type: ignore[attr-defined]
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and ast.get_docstring(n) is not None}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docs:
            yield node.lineno, node.value


def test_nothing_outside_the_registry_names_a_detector() -> None:
    names = {*DETECTORS, *(e.model for e in DETECTORS.values())}
    package = Path(facefuse.__file__).parent
    allowed = {Path(sys.modules[detectors.__name__].__file__ or "")}
    allowed |= {Path(sys.modules[e.make.__module__].__file__ or "") for e in DETECTORS.values()}
    found = []
    for path in sorted(package.rglob("*.py")):
        # The toolchain builds and quantizes models by their manifest names.
        if path in allowed or package / "toolchain" in path.parents:
            continue
        for line, value in _names_outside_docstrings(ast.parse(path.read_text())):
            if value in names:
                found.append(f"{path.relative_to(package)}:{line}: {value!r}")
    assert not found
