"""The server's pipeline in process: the same stages and selection as the library,
driven through micro-batchers and thread pools, give the same bytes.

Each test builds a Pipeline on the test's event loop over the shared registry
(real models, real sample photos), starts its batchers and drains them after.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import pytest

from facefuse.config import Settings
from facefuse.errors import NoFaceError
from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.quality import identity_similarity
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.encode import encode_image
from facefuse.imaging.output import OutputPolicy
from facefuse.runtime.registry import ModelRegistry
from facefuse.serving.pipeline import Pipeline, RequestContext

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
