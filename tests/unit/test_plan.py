"""The fusion plan's first decision, without models: which images are analysed,
with embeddings or not, by which detector purpose."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from facefuse.errors import InvalidArgumentError
from facefuse.fusion.mapping import parse_mapping
from facefuse.fusion.plan import Analyse, FuseRequest, ImageJob, fuse_plan
from facefuse.fusion.select import check_reference
from facefuse.fusion.types import FuseOptions


def first_step(req: FuseRequest) -> tuple[ImageJob, ...]:
    images = [np.zeros((8, 8, 3), np.uint8)] * req.image_count
    step = next(fuse_plan(req, models=None, images=images))  # type: ignore[arg-type]  # unused before scoring
    assert isinstance(step, Analyse)
    return step.jobs


def jobs(**kw: Any) -> list[tuple[str, int, bool, str]]:
    options = kw.pop("options", FuseOptions())
    return [(j.role, j.image, j.embed, j.purpose)
            for j in first_step(FuseRequest(options, **kw))]


def test_one_mode_embeds_only_to_evaluate() -> None:
    assert jobs(options=FuseOptions(evaluate=False)) == [
        ("source", 0, False, "largest"), ("target", 1, False, "largest")]
    assert jobs() == [("source", 0, True, "largest"), ("target", 1, True, "largest")]
    # the similarity figure needs the source's identity, not the target's
    assert jobs(options=FuseOptions(evaluate=False), similarity=True) == [
        ("source", 0, True, "largest"), ("target", 1, False, "largest")]


def test_the_source_is_embedded_when_the_swapper_renders_from_its_embedding() -> None:
    # what the swapper declares (Swapper.needs_source_embedding) decides, not its name
    options = FuseOptions(evaluate=False, swapper="any_name")
    assert jobs(options=options) == [
        ("source", 0, False, "largest"), ("target", 1, False, "largest")]
    assert jobs(options=FuseOptions(evaluate=False), source_embedding=True) == [
        ("source", 0, True, "largest"), ("target", 1, False, "largest")]


def test_a_face_index_or_many_mode_analyses_every_target_face() -> None:
    for options in (FuseOptions(mode="many", evaluate=False),
                    FuseOptions(target_face_index=2, evaluate=False)):
        assert jobs(options=options, sources=2) == [
            ("source", 0, False, "largest"), ("source", 1, False, "largest"),
            ("target", 2, False, "all")]


def test_reference_mode_embeds_the_target_and_the_reference() -> None:
    options = FuseOptions(mode="reference", evaluate=False)
    assert jobs(options=options, reference=True) == [
        ("source", 0, False, "largest"), ("target", 1, True, "all"),
        ("reference", 2, True, "largest")]


@pytest.mark.parametrize(("mode", "reference", "mapping", "code"), [
    ("one", True, False, "options_conflict"),
    ("many", True, False, "options_conflict"),
    ("reference", True, True, "options_conflict"),
    ("reference", False, False, "reference_required"),
])
def test_a_reference_goes_only_with_mode_reference_and_no_mapping(
        mode: str, reference: bool, mapping: bool, code: str) -> None:
    pairs = parse_mapping([{"source": 0, "target": 0}]) if mapping else None
    with pytest.raises(InvalidArgumentError) as info:
        FuseRequest(FuseOptions(mode=mode, evaluate=False),  # type: ignore[arg-type]
                    mapping=pairs, reference=reference)
    assert info.value.code == code
    with pytest.raises(InvalidArgumentError) as info:
        check_reference(mode, reference, mapping)
    assert info.value.code == code
    # what a reference, and mode reference, may come with
    check_reference("reference", True, False)
    check_reference("reference", False, True)
    if mode != "reference":
        check_reference(mode, False, mapping)


def test_a_mapping_names_faces_so_the_target_is_embedded_only_to_evaluate() -> None:
    mapping = parse_mapping([{"source": 0, "target": 1}, {"source": 1, "source_face": 1,
                                                          "target": 0}])
    options = FuseOptions(mode="reference", evaluate=False)
    assert jobs(options=options, sources=2, mapping=mapping) == [
        ("source", 0, False, "all"), ("source", 1, False, "all"), ("target", 2, False, "all")]
    assert jobs(sources=2, mapping=mapping)[-1] == ("target", 2, True, "all")


def test_known_target_faces_are_not_analysed_again() -> None:
    assert jobs(target_faces=(), target_size=(8, 8)) == [("source", 0, True, "largest")]
    assert jobs(options=FuseOptions(mode="many"), target_purpose="largest")[-1] == (
        "target", 1, True, "largest")


def test_the_images_must_match_the_request() -> None:
    with pytest.raises(ValueError, match="needs 3 decoded images"):
        next(fuse_plan(FuseRequest(FuseOptions(), sources=2), models=None,  # type: ignore[arg-type]
                       images=[np.zeros((8, 8, 3), np.uint8)] * 2))
