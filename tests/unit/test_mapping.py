"""Face mapping: several source faces, each into the target face it names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import facefuse
from facefuse.errors import FaceIndexError, MappingError
from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.mapping import MAX_MAPPINGS, FacePair, parse_cli_pair, parse_mapping
from facefuse.fusion.types import FuseOptions


@pytest.fixture(scope="module")
def group(make_group: Callable[..., np.ndarray]) -> np.ndarray:
    return make_group(["biden", "obama2", "obama3"])


@pytest.fixture(scope="module")
def group_boxes(analyser: FaceAnalyser, group: np.ndarray) -> list[np.ndarray]:
    return [f.bbox for f in analyser.analyse(group, purpose="all")]  # as a mapping counts them


def _by_x(boxes: list[np.ndarray]) -> list[int]:
    """Face indices (largest first) ordered left to right."""
    return sorted(range(len(boxes)), key=lambda i: float(boxes[i][0]))


def test_two_sources_replace_the_faces_they_name_and_nothing_else(
        fuser: FaceFuser, sample_images: dict[str, np.ndarray], group: np.ndarray,
        group_boxes: list[np.ndarray]) -> None:
    left, middle, right = _by_x(group_boxes)
    x0, y0, x1, y1 = (float(v) for v in group_boxes[right])
    rect = [x0 - 10, y0 - 10, x1 + 10, y1 + 10]
    # Sources of other people than the faces they replace (obama into obama3 would
    # be nearer "the target" or "the source" by a coin's toss: one identity).
    result = fuser.fuse([sample_images["astronaut"], sample_images["biden"]], group,
                        FuseOptions(), mapping=[{"source": 0, "target": left},
                                                {"source": 1, "target": rect}])
    assert [f.target_index for f in result.fused] == [left, right]
    assert [f.source_index for f in result.fused] == [0, 1]
    changed = np.any(result.image != group, axis=2)
    inside = np.zeros(changed.shape, bool)
    for f in result.fused:
        rx0, ry0, rx1, ry1 = f.region
        inside[ry0:ry1, rx0:rx1] = True
        assert changed[ry0:ry1, rx0:rx1].mean() > 0.05
        assert f.quality["id_sim_source"] > f.quality["id_sim_target"]
    assert not changed[~inside].any()  # the middle face and the background are untouched
    mx0, my0, mx1, my1 = (int(v) for v in group_boxes[middle])
    assert not changed[my0:my1, mx0:mx1].any()
    # each fused face looks like its own source, not the other one
    q0, q1 = result.fused[0].quality, result.fused[1].quality
    assert q0["id_sim_source"] > 0.5 and q1["id_sim_source"] > 0.5


def test_library_function_takes_a_mapping(sample_paths, group, group_boxes, settings) -> None:  # type: ignore[no-untyped-def]
    middle = _by_x(group_boxes)[1]
    result = facefuse.fuse([sample_paths["astronaut"]], group, settings=settings,
                           mapping=[{"source": 0, "target": middle}], evaluate=False)
    assert [f.target_index for f in result.fused] == [middle]


@pytest.mark.parametrize(("mapping", "code"), [
    ([{"source": 0, "target": 0}, {"source": 0, "target": 0}], "mapping_duplicate_target"),
    ([{"source": 2, "target": 0}], "mapping_source_out_of_range"),
    ([{"source": 0, "source_face": 3, "target": 0}], "mapping_source_out_of_range"),
    ([{"source": 0, "target": 7}], "mapping_target_out_of_range"),
    ([{"source": 0, "target": [0, 0, 30, 30]}], "mapping_rect_no_face"),
])
def test_mapping_errors_against_the_faces(fuser: FaceFuser, sample_images: dict[str, np.ndarray],
                                          group: np.ndarray, mapping: list[dict[str, Any]],
                                          code: str) -> None:
    with pytest.raises(MappingError) as exc:
        fuser.fuse([sample_images["astronaut"]], group, FuseOptions(evaluate=False),
                   mapping=mapping)
    assert exc.value.code == code
    assert exc.value.http_status == 422


def test_a_rectangle_and_an_index_naming_one_face_are_duplicates(
        fuser: FaceFuser, sample_images: dict[str, np.ndarray], group: np.ndarray,
        group_boxes: list[np.ndarray]) -> None:
    box = [float(v) for v in group_boxes[0]]
    with pytest.raises(MappingError) as exc:
        fuser.fuse([sample_images["astronaut"], sample_images["obama"]], group,
                   FuseOptions(evaluate=False),
                   mapping=[{"source": 0, "target": 0}, {"source": 1, "target": box}])
    assert exc.value.code == "mapping_duplicate_target"


@pytest.mark.parametrize(("entries", "code"), [
    ([{"source": 0, "target": i} for i in range(MAX_MAPPINGS + 1)], "mapping_too_many"),
    ([], "mapping_invalid"),
    ("0=1", "mapping_invalid"),
    ([{"source": -1, "target": 0}], "mapping_invalid"),
    ([{"source": 0}], "mapping_invalid"),
    ([{"source": 0, "target": [1, 2, 3]}], "mapping_invalid"),
    ([{"source": 0, "target": [10, 10, 5, 20]}], "mapping_invalid"),
    ([{"source": 0, "target": True}], "mapping_invalid"),
    ([{"source": 0, "target": 0, "face": 1}], "mapping_invalid"),
    ([7], "mapping_invalid"),
])
def test_mapping_form_errors(entries, code) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(MappingError) as exc:
        parse_mapping(entries)
    assert exc.value.code == code


def test_cli_pair_syntax() -> None:
    assert parse_cli_pair("1=2") == FacePair(1, 0, 2, None)
    assert parse_cli_pair("0.1=10,20,110,140") == FacePair(0, 1, None, (10, 20, 110, 140))
    for bad in ("1", "a=2", "1=", "1=1,2"):
        with pytest.raises(MappingError):
            parse_cli_pair(bad)


def test_target_index_still_checked_without_mapping(fuser: FaceFuser, sample_images) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FaceIndexError):
        fuser.fuse(sample_images["astronaut"], sample_images["biden"],
                   FuseOptions(target_face_index=3, evaluate=False))


def test_cli_map_flag(sample_paths, group, group_boxes, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from facefuse.cli import main as cli_main
    from facefuse.imaging.decode import decode_image
    from facefuse.imaging.encode import encode_image

    target = tmp_path / "group.png"
    target.write_bytes(encode_image(group, "png"))
    right = _by_x(group_boxes)[2]
    out, report = tmp_path / "out.png", tmp_path / "r.json"
    rc = cli_main(["fuse", str(sample_paths["astronaut"]), str(sample_paths["obama"]),
                   str(target), "-o", str(out), "--map", f"1={right}", "--map", "0.0=0",
                   "--report", str(report)])
    assert rc == 0
    faces = json.loads(report.read_text())["fused_faces"]
    assert [(f["source_index"], f["target_index"]) for f in faces] == [(1, right), (0, 0)]
    assert decode_image(out).shape == group.shape
    rc = cli_main(["fuse", str(sample_paths["astronaut"]), str(target), "-o", str(out),
                   "--map", "0=0", "--map", "0=0"])
    assert rc == 2
    assert "error[mapping_duplicate_target]" in capsys.readouterr().err
