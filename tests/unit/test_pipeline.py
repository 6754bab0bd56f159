"""The server's pipeline in process: the same stages and selection as the library,
driven through micro-batchers and thread pools, give the same bytes.

Each test builds a Pipeline on the test's event loop over the shared registry
(real models, real sample photos), starts its batchers and drains them after.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError, ModelError, NoFaceError
from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.detector_base import PASS_CHUNK
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.mapping import parse_mapping
from facefuse.fusion.quality import identity_similarity
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.encode import encode_image
from facefuse.imaging.output import OutputPolicy
from facefuse.runtime.manifest import Manifest
from facefuse.runtime.registry import ModelRegistry
from facefuse.serving.pipeline import Analysis, Pipeline, RequestContext

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def running(settings: Settings, registry: ModelRegistry) -> AsyncIterator[Pipeline]:
    pipeline = Pipeline(settings, registry)
    pipeline.start()
    try:
        yield pipeline
    finally:
        await pipeline.drain(10.0)
        pipeline.close()


def photo(sample_paths: dict[str, Path], name: str) -> bytes:
    return sample_paths[name].read_bytes()


@pytest.mark.parametrize(
    ("source", "target", "options", "fmt", "batching"),
    [
        ("obama", "biden", FuseOptions(degree=70), "png", True),
        ("astronaut", "obama2", FuseOptions(degree=100, mode="many", blend="poisson"), "jpeg",
         False),
        ("biden", "obama3", FuseOptions(shape=30, texture=90), "webp", True),
    ],
)
async def test_fuse_gives_the_library_bytes_and_similarity(
    settings: Settings, registry: ModelRegistry, fuser: FaceFuser, analyser: FaceAnalyser,
    sample_paths: dict[str, Path], source: str, target: str, options: FuseOptions, fmt: str,
    batching: bool,
) -> None:
    src, tgt = photo(sample_paths, source), photo(sample_paths, target)
    library = fuser.fuse(src, tgt, dataclasses.replace(options, evaluate=True))
    # the library's bytes as the CLI writes them: with the provenance XMP
    expected = OutputPolicy.from_settings(settings).encode(library.image, fmt, 90)
    async with running(settings.replace(batching=batching), registry) as pipeline:
        outcome = await pipeline.fuse(src, tgt, options, RequestContext(), fmt=fmt, quality=90,
                                      similarity=True)
    assert outcome.body == expected
    assert outcome.faces_fused == len(library.fused)
    # the similarity: one recogniser call at the rendered mesh, as the library computes
    # it, and within a few thousandths of a full re-analysis of the output
    first = library.fused[0]
    assert first.landmarks is not None
    at_mesh = analyser.run(stages.embed_at(analyser.models.recognizer, library.image,
                                           first.target_face, first.landmarks))
    assert outcome.similarity == identity_similarity(at_mesh, library.source_face)
    assert outcome.similarity == pytest.approx(first.quality["id_sim_source"], abs=0.01)
    assert list(outcome.notes) == library.notes


async def test_analysis_equals_the_library_and_cached_faces_are_read_only(
    settings: Settings, registry: ModelRegistry, analyser: FaceAnalyser,
    sample_paths: dict[str, Path],
) -> None:
    data = photo(sample_paths, "obama2")
    expected = analyser.analyse(data)
    async with running(settings, registry) as pipeline:
        ctx = RequestContext()
        rgb, digest = await pipeline.decode(data, ctx)
        first = await pipeline.analyse(rgb, digest, ctx, embed=False)
        second = await pipeline.analyse(rgb, digest, ctx, embed=True)
        third = await pipeline.analyse(rgb, digest, ctx, embed=True)
    assert ctx.l1 == ["miss", "miss", "hit"]  # geometry cached, then embeddings added
    assert third is second and first.faces[0].embedding is None
    assert len(second.faces) == len(expected)
    for got, want in zip(second.faces, expected, strict=True):
        for name in ("bbox", "keypoints", "landmarks", "chip_transform", "embedding"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
    face = third.faces[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        face.embedding = None  # type: ignore[misc]  # the point: frozen
    assert face.landmarks is not None
    with pytest.raises(ValueError, match="read-only"):
        face.landmarks[0, 0] = 0.0


async def test_selection_errors_are_the_library_ones(
    settings: Settings, registry: ModelRegistry, fuser: FaceFuser,
    sample_paths: dict[str, Path],
) -> None:
    blank = encode_image(np.full((96, 128, 3), 128, np.uint8), "png")
    src = photo(sample_paths, "obama")
    with pytest.raises(NoFaceError) as lib:
        fuser.fuse(src, blank)
    async with running(settings, registry) as pipeline:
        with pytest.raises(NoFaceError) as srv:
            await pipeline.fuse(src, blank, FuseOptions(), RequestContext())
        with pytest.raises(NoFaceError) as srv_source:
            await pipeline.fuse(blank, src, FuseOptions(), RequestContext())
    assert lib.value.code == srv.value.code == "target_no_face"
    assert srv_source.value.code == "source_no_face"


# --- parity beyond the plain cases: groups, reference, mapping, templates -------------


@pytest.fixture(scope="module")
def group3(make_group: Callable[..., np.ndarray]) -> bytes:
    return encode_image(make_group(["biden", "obama2", "obama3"]), "png")


def _right_face_rect(analyser: FaceAnalyser, group: bytes) -> list[float]:
    """A rectangle around the group's right-hand face, as a client draws it."""
    boxes = [f.bbox for f in analyser.analyse(group, purpose="all", embed=False)]
    x0, y0, x1, y1 = (float(v) for v in max(boxes, key=lambda b: float(b[0])))
    return [x0 - 10, y0 - 10, x1 + 10, y1 + 10]


@pytest.mark.parametrize("case", ["many", "reference", "mapping", "index"])
async def test_group_requests_give_the_library_bytes(
    settings: Settings, registry: ModelRegistry, fuser: FaceFuser, analyser: FaceAnalyser,
    sample_paths: dict[str, Path], group3: bytes, case: str,
) -> None:
    src = [photo(sample_paths, "astronaut")]
    options = FuseOptions(evaluate=False)
    kwargs: dict[str, Any] = {}
    if case == "many":
        options = FuseOptions(mode="many", evaluate=False)
    elif case == "reference":
        options = FuseOptions(mode="reference", evaluate=False)
        kwargs["reference"] = photo(sample_paths, "obama")
    elif case == "mapping":
        src.append(photo(sample_paths, "obama"))
        kwargs["mapping"] = parse_mapping([{"source": 0, "target": 0},
                                           {"source": 1, "target": _right_face_rect(analyser, group3)}])
    else:
        options = FuseOptions(target_face_index=2, evaluate=False)
    library = fuser.fuse(src, group3, options, **kwargs)
    expected = OutputPolicy.from_settings(settings).encode(library.image, "png", 90)
    async with running(settings, registry) as pipeline:
        outcome = await pipeline.fuse(src, group3, options, RequestContext(), fmt="png",
                                      quality=90, **kwargs)
    assert outcome.body == expected
    assert outcome.faces_fused == len(library.fused) == {"many": 3, "mapping": 2}.get(case, 1)
    assert list(outcome.notes) == library.notes
    assert list(outcome.skipped) == library.skipped


async def test_a_template_fuses_as_the_library_does_with_every_face(
    settings: Settings, registry: ModelRegistry, fuser: FaceFuser,
    sample_paths: dict[str, Path], group3: bytes,
) -> None:
    # A stored template's faces are an every-face analysis: the library's many mode and
    # face-index requests analyse the target the same way, so the bytes agree.
    src = photo(sample_paths, "astronaut")
    policy = OutputPolicy.from_settings(settings)
    async with running(settings, registry) as pipeline:
        ctx = RequestContext()
        rgb, digest = await pipeline.decode(group3, ctx)
        stored = await pipeline.analyse(rgb, digest, ctx, embed=True, purpose="all")
        for options in (FuseOptions(mode="many", evaluate=False),
                        FuseOptions(target_face_index=1, evaluate=False)):
            library = fuser.fuse(src, group3, options)
            ctx = RequestContext()
            outcome = await pipeline.fuse(src, group3, options, ctx, fmt="png", quality=90,
                                          target_analysis=stored, target_purpose="all")
            assert outcome.body == policy.encode(library.image, "png", 90), options
            assert len(ctx.l1) == 1  # the source only: the target's faces were given
        small = Analysis(stored.faces, True, stored.width - 1, stored.height)
        with pytest.raises(InvalidArgumentError) as exc:
            await pipeline.fuse(src, group3, FuseOptions(), RequestContext(),
                                target_analysis=small)
    assert exc.value.code == "template_mismatch"


async def test_the_recogniser_loads_on_its_first_embedding(
    settings: Settings, sample_paths: dict[str, Path],
) -> None:
    """A fresh server's pipeline loads the detector, mesh and iris, not the recogniser
    (a fusion never runs it by default): its cache-key version is known from the
    manifest all the same, and the first embedding loads it through the batcher."""
    registry = ModelRegistry(settings)
    async with running(settings, registry) as pipeline:
        assert "dlib_resnet" in pipeline.model_names
        assert "dlib_resnet" not in pipeline.startup_models
        assert "dlib_resnet" not in registry.loaded()
        pipeline.warmup()
        outcome = await pipeline.fuse(photo(sample_paths, "obama"), photo(sample_paths, "biden"),
                                      FuseOptions(degree=60), RequestContext(), fmt="jpeg",
                                      quality=90)
        assert outcome.faces_fused == 1
        assert "dlib_resnet" not in registry.loaded()
        assert pipeline.model_versions["dlib_resnet"] == (
            registry.entry("dlib_resnet").spec.sha256[:16])
        ctx = RequestContext()
        rgb, digest = await pipeline.decode(photo(sample_paths, "obama2"), ctx)
        faces = (await pipeline.analyse(rgb, digest, ctx, embed=True)).faces
        assert faces[0].embedding is not None
        assert "dlib_resnet" in registry.loaded()


async def test_a_reload_checks_the_recogniser_it_has_not_loaded(
    settings: Settings, model_dir: Path, private_models: Path,
) -> None:
    """A reload resolves and verifies the recogniser's file too though it is not loaded:
    a corrupt one refuses the whole reload (the old models and cache keys stay), a
    new one is reported changed and keys the caches, still without loading it."""
    models = private_models
    own = settings.replace(models_dir=models)
    registry = ModelRegistry(own)
    async with running(own, registry) as pipeline:
        before = dict(pipeline.model_versions)
        spec = registry.entry("dlib_resnet").spec
        (models / spec.file).unlink()
        (models / spec.file).write_bytes(b"not a model")
        with pytest.raises(ModelError):
            await pipeline.reload()
        assert pipeline.model_versions == before
        assert registry.entry("dlib_resnet").spec == spec
        data = (model_dir / spec.file).read_bytes() + b"\0"  # a new version of it
        (models / "dlib_resnet_v2.onnx").write_bytes(data)
        manifest = Manifest.load(models)
        manifest.models["dlib_resnet"] = dataclasses.replace(
            spec, file="dlib_resnet_v2.onnx", sha256=hashlib.sha256(data).hexdigest(),
            size=len(data))
        manifest.save(models)
        assert await pipeline.reload() == ["dlib_resnet"]
        assert pipeline.model_versions["dlib_resnet"] == hashlib.sha256(data).hexdigest()[:16]
        assert "dlib_resnet" not in registry.loaded()


async def test_a_step_that_cuts_more_inputs_runs_off_the_event_loop(
    settings: Settings, registry: ModelRegistry, analyser: FaceAnalyser,
) -> None:
    """The step after a call marked ``then_cuts`` (a large photo's next detector passes)
    runs in the CPU pool; the step after any other call, on the event loop."""
    import threading

    detector = analyser.models.detectors["largest"]
    tensor = np.zeros((3, detector.size, detector.size), np.float32)

    def stage(then_cuts: bool) -> stages.Stage[str]:
        yield stages.ModelCall(stages.registry_name(detector.model), (tensor,),
                               then_cuts=then_cuts)
        return threading.current_thread().name

    loop_thread = threading.current_thread().name
    async with running(settings, registry) as pipeline:
        assert await pipeline.run(stage(False), RequestContext()) == loop_thread
        assert await pipeline.run(stage(True), RequestContext()) != loop_thread


def test_a_large_photos_detector_calls_each_say_the_next_step_cuts(
    analyser: FaceAnalyser, sample_images: dict[str, np.ndarray],
) -> None:
    """Every detector call of a photo over HEAVY_CUT_PIXELS, and every one but the last
    of a smaller photo, says the step after it may cut more inputs."""
    import cv2

    detector = analyser.models.detectors["all"]
    assert detector.pass_chunk == PASS_CHUNK  # the CPU batch policy's largest batch
    runner = stages.registry_runner(analyser.registry)

    def flags(image: np.ndarray) -> list[bool]:
        seen: list[bool] = []

        def run(call: stages.ModelCall) -> stages.Outputs:
            seen.append(call.then_cuts)
            return runner(call)

        stages.run_sync(stages.detect(detector, image), run)
        return seen

    small = sample_images["obama"]
    assert small.shape[0] * small.shape[1] <= stages.HEAVY_CUT_PIXELS
    assert flags(small) == [False]
    large = cv2.resize(small, (4000, 3000))
    passes = len(detector.crops(4000, 3000))
    assert flags(large) == [True] * -(-passes // PASS_CHUNK)
    # Under HEAVY_CUT_PIXELS with more passes than a chunk: all but the last call.
    wide = cv2.resize(small, (3200, 1200))
    assert wide.shape[0] * wide.shape[1] <= stages.HEAVY_CUT_PIXELS
    detector = copy.copy(detector)
    detector.pass_chunk = 2
    calls = -(-len(detector.crops(3200, 1200)) // 2)
    assert calls > 1
    assert flags(wide) == [True] * (calls - 1) + [False]
