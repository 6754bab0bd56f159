"""The detector policy: under ``detector="auto"`` (the default) BlazeFace runs where
only the largest face is used and YuNet where every face is; ``full|short|yunet``
force one detector everywhere. Real models, a synthetic group photo in which
BlazeFace misses a face that can be fused."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.detectors import PURPOSES, Purpose, detector_for, detectors_in_use
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.mapping import detect_purposes, parse_mapping
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import decode_image
from facefuse.runtime.registry import ModelRegistry
from facefuse.serving.cache.keys import sha256_hex
from facefuse.serving.pipeline import Pipeline, RequestContext
from facefuse.toolchain.detection_sets import Case, fetch_face_free, group_photo, pairs

#: The group whose face 4 (about 70 px wide) BlazeFace full-range misses and YuNet finds.
SEED, MISSED = 0, 4


@pytest.fixture(scope="module")
def auto(settings: Settings) -> Settings:
    return settings.replace(detector="auto")


@pytest.fixture(scope="module")
def group(settings: Settings, sample_images: dict[str, np.ndarray]) -> Case:
    free = {n: decode_image(p) for n, p in
            fetch_face_free(settings.home / "face-free", settings.downloads_dir).items()}
    return group_photo(sample_images, free, seed=SEED)


@pytest.fixture(scope="module")
def auto_fuser(auto: Settings, registry: ModelRegistry) -> FaceFuser:
    return FaceFuser(auto, FaceAnalyser(auto, registry))


def _boxes(faces: list[np.ndarray]) -> np.ndarray:
    return np.array(faces, np.float64).reshape(-1, 4)


@pytest.mark.parametrize(("setting", "largest", "every"), [
    ("auto", "full", "yunet"), ("full", "full", "full"), ("short", "short", "short"),
    ("yunet", "yunet", "yunet")])
def test_each_setting_runs_its_detectors(setting: str, largest: str, every: str) -> None:
    s = Settings(detector=setting)
    assert (detector_for(s, "largest"), detector_for(s, "all")) == (largest, every)
    assert detectors_in_use(s) == tuple(dict.fromkeys((largest, every)))


@pytest.mark.parametrize(("options", "mapping", "expected"), [
    (FuseOptions(), None, ("largest", "largest", "largest")),
    (FuseOptions(target_face_index=0), None, ("largest", "all", "largest")),
    (FuseOptions(mode="many"), None, ("largest", "all", "largest")),
    (FuseOptions(mode="reference"), None, ("largest", "all", "largest")),
    (FuseOptions(), [{"source": 0, "target": 2}], ("largest", "all", "largest")),
    (FuseOptions(), [{"source": 0, "target": 0}, {"source": 1, "source_face": 1, "target": 1}],
     ("all", "all", "largest")),
])
def test_request_purposes(options: FuseOptions, mapping: list[dict[str, int]] | None,
                          expected: tuple[Purpose, Purpose, Purpose]) -> None:
    p = detect_purposes(options, parse_mapping(mapping) if mapping is not None else None)
    assert (p.source, p.target, p.reference) == expected


def test_the_group_premise(auto_fuser: FaceFuser, group: Case) -> None:
    """BlazeFace misses the face, YuNet finds it."""
    an = auto_fuser.analyser
    largest = _boxes([d.bbox for d in an.detect(group.image, "largest")])
    every = _boxes([d.bbox for d in an.detect(group.image, "all")])
    assert MISSED not in {t for _, t in pairs(largest, group.faces)}
    assert MISSED in {t for _, t in pairs(every, group.faces)}


def test_many_mode_fuses_the_face_blazeface_misses(
        auto_fuser: FaceFuser, settings: Settings, registry: ModelRegistry,
        sample_images: dict[str, np.ndarray], group: Case) -> None:
    options = FuseOptions(mode="many", evaluate=False)
    result = auto_fuser.fuse(sample_images["astronaut"], group.image, options)
    fused = {t for _, t in pairs(_boxes([f.target_face.bbox for f in result.fused]),
                                 group.faces)}
    assert MISSED in fused
    forced = FaceFuser(settings.replace(detector="full"),
                       FaceAnalyser(settings.replace(detector="full"), registry))
    before = forced.fuse(sample_images["astronaut"], group.image, options)
    assert MISSED not in {t for _, t in pairs(
        _boxes([f.target_face.bbox for f in before.fused]), group.faces)}
    assert len(result.fused) > len(before.fused)


def test_mode_one_runs_blazeface(auto_fuser: FaceFuser, sample_images: dict[str, np.ndarray],
                                 group: Case) -> None:
    """The target face of mode one is BlazeFace's box (the two detectors' boxes differ)."""
    result = auto_fuser.fuse(sample_images["astronaut"], group.image,
                             FuseOptions(evaluate=False))
    box = result.fused[0].target_face.bbox
    an = auto_fuser.analyser
    assert any(np.array_equal(box, d.bbox) for d in an.detect(group.image, "largest"))
    assert not any(np.array_equal(box, d.bbox) for d in an.detect(group.image, "all"))


@pytest.mark.anyio
async def test_l1_keeps_each_detectors_analysis_apart(
        auto: Settings, registry: ModelRegistry, group: Case) -> None:
    pipeline = Pipeline(auto, registry)
    assert {"blazeface_full", "yunet"} <= set(pipeline.model_names)
    assert {"blazeface_full", "yunet"} <= set(pipeline.batchers)
    pipeline.start()
    try:
        digest = "0" * 64
        counts: dict[Purpose, int] = {}
        for purpose in PURPOSES:
            ctx = RequestContext()
            counts[purpose] = len((await pipeline.analyse(
                group.image, digest, ctx, embed=False, purpose=purpose)).faces)
            assert ctx.l1 == ["miss"], purpose  # the other detector's entry is not reused
        assert counts["all"] > counts["largest"]
        ctx = RequestContext()
        again = await pipeline.analyse(group.image, digest, ctx, embed=False, purpose="all")
        assert ctx.l1 == ["hit"] and len(again.faces) == counts["all"]
    finally:
        await pipeline.drain(10.0)
        pipeline.close()
    forced = Pipeline(auto.replace(detector="yunet"), registry)
    # One detector for both, but the largest-face analysis stops at the whole-image
    # pass when it finds a face: cached apart.
    assert forced._l1_key(digest, "largest") != forced._l1_key(digest, "all")
    assert "blazeface_full" not in forced.model_names
    forced.close()


@pytest.mark.anyio
async def test_a_target_purpose_overrides_the_one_the_mode_implies(
        auto: Settings, registry: ModelRegistry, group: Case,
        sample_paths: dict[str, Path]) -> None:
    # A template whose stored faces are stale is analysed again as it was stored
    # (every face), whatever mode it is fused in.
    ok, png = cv2.imencode(".png", cv2.cvtColor(group.image, cv2.COLOR_RGB2BGR))
    assert ok
    source = sample_paths["obama"].read_bytes()
    pipeline = Pipeline(auto, registry)
    pipeline.start()
    try:
        digest = sha256_hex(png.tobytes())
        for purpose in (None, "all"):
            await pipeline.fuse(source, png.tobytes(), FuseOptions(degree=50),
                                RequestContext(), target_purpose=purpose)
            analysed = {p: pipeline.l1.get(pipeline._l1_key(digest, p)) is not None
                        for p in PURPOSES}
            assert analysed == {"largest": True, "all": purpose == "all"}, purpose
    finally:
        await pipeline.drain(10.0)
        pipeline.close()


@pytest.mark.parametrize("name", ["hubble", "coffee"])
def test_a_detection_the_mesh_rejects_is_not_a_face(auto_fuser: FaceFuser, settings: Settings,
                                                    name: str) -> None:
    """BlazeFace finds a 'face' in these face-free photos; its mesh's face presence
    is near 0, so the analysis (library and service paths alike) reports none."""
    from facefuse.faces import stages

    free = fetch_face_free(settings.home / "face-free", settings.downloads_dir)
    image = decode_image(free[name])
    an = auto_fuser.analyser
    detections = an.detect(image, "largest")
    assert detections, "the premise: BlazeFace fires on this photo"
    meshed = an.run(stages.mesh(an.models.mesh, image, detections))
    assert max(f.mesh_score or 0.0 for f in meshed) < stages.MIN_PRESENCE
    assert an.analyse(image, embed=False) == []
    assert stages.reported(meshed) == []


def test_a_rejected_false_face_does_not_hide_the_real_one(auto_fuser: FaceFuser,
                                                          sample_images: dict[str, np.ndarray],
                                                          ) -> None:
    """obama3 upside down: BlazeFace's upright pass finds a false face (the mesh
    rejects it), which used to stop the search before the 180° turn; the turns and
    tiles are tried again and the real face is found."""
    from facefuse.faces import stages

    an = auto_fuser.analyser
    image = np.ascontiguousarray(np.rot90(sample_images["obama3"], 2))
    first = an.detect(image, "largest")
    meshed = an.run(stages.mesh(an.models.mesh, image, first))
    assert first and not stages.reported(meshed), "the premise: a rejected upright box"
    faces = an.analyse(image, embed=False)
    assert len(faces) == 1 and (faces[0].mesh_score or 0.0) >= 0.5
    upright = an.analyse(sample_images["obama3"], embed=False)[0]
    h, w = image.shape[:2]
    x0, y0, x1, y1 = upright.bbox
    turned = np.array([w - x1, h - y1, w - x0, h - y0])
    assert len(pairs(np.array([faces[0].bbox]), turned[None])) == 1
