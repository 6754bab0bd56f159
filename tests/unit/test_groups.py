"""Group photos degrade per face: in mode many and with a mapping a face that cannot
be fused is skipped and reported (index, box, reason), the others are fused; the
request fails only when none can be; mode one keeps its errors. Real photos, real
models: the synthetic group has one face deliberately below the size limit."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from face_poses import turn_yaw

from facefuse.errors import FaceError, FaceTooSmallError, InvalidArgumentError
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.types import Face
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.select import MIN_EYE_DISTANCE_PX, split_usable, usability_error
from facefuse.fusion.types import FuseOptions, FusionResult
from facefuse.fusion.visibility import visible_fraction
from facefuse.imaging.encode import encode_image

SMALL = 2  # the smallest face of the group, largest first


@pytest.fixture(scope="module")
def group_faces(analyser: FaceAnalyser, small_face_group: np.ndarray) -> list[Face]:
    faces = analyser.analyse(small_face_group, purpose="all")  # as many mode finds them
    assert len(faces) == 3
    sizes = [eye_distance(f.landmarks) for f in faces if f.landmarks is not None]
    # the premise: two faces above the limit, the smallest between 16 and the limit
    assert sizes[1] > MIN_EYE_DISTANCE_PX > sizes[SMALL] > 30, sizes
    return faces


@pytest.fixture(scope="module")
def many(fuser: FaceFuser, sample_images: dict[str, np.ndarray], small_face_group: np.ndarray,
         group_faces: list[Face]) -> FusionResult:
    return fuser.fuse(sample_images["astronaut"], small_face_group,
                      FuseOptions(mode="many", evaluate=False))


def _unchanged_inside(out: np.ndarray, before: np.ndarray, box: tuple[float, ...]) -> bool:
    x0, y0, x1, y1 = (round(v) for v in box)
    return bool(np.array_equal(out[y0:y1, x0:x1], before[y0:y1, x0:x1]))


def test_many_mode_fuses_the_usable_faces_and_reports_the_small_one(
        many: FusionResult, small_face_group: np.ndarray, group_faces: list[Face]) -> None:
    assert [f.target_index for f in many.fused] == [0, 1]
    assert len(many.skipped) == 1
    skipped = many.skipped[0]
    assert skipped.target_index == SMALL and skipped.reason == "target_face_too_small"
    assert np.allclose(skipped.box, group_faces[SMALL].bbox[:4], atol=0.5)
    assert "between the outer eye corners" in skipped.message
    assert _unchanged_inside(many.image, small_face_group, skipped.box)
    for f in many.fused:
        x0, y0, x1, y1 = f.region
        assert np.any(many.image[y0:y1, x0:x1] != small_face_group[y0:y1, x0:x1])
    report = json.loads(json.dumps(many.report()))
    assert report["skipped_faces"] == [{
        "index": SMALL, "box": [round(v) for v in skipped.box],
        "reason": "target_face_too_small", "message": skipped.message}]


def test_min_face_size_lowers_and_raises_the_limit(
        fuser: FaceFuser, sample_images: dict[str, np.ndarray], small_face_group: np.ndarray,
        group_faces: list[Face]) -> None:
    low = fuser.fuse(sample_images["astronaut"], small_face_group,
                     FuseOptions(mode="many", evaluate=False, min_face_size=25))
    assert [f.target_index for f in low.fused] == [0, 1, 2] and low.skipped == []
    x0, y0, x1, y1 = low.fused[2].region
    assert np.any(low.image[y0:y1, x0:x1] != small_face_group[y0:y1, x0:x1])
    # above every face: the request fails, with the usual code of the largest face
    with pytest.raises(FaceTooSmallError) as exc:
        fuser.fuse(sample_images["obama"], small_face_group,
                   FuseOptions(mode="many", evaluate=False, min_face_size=100))
    assert exc.value.code == "target_face_too_small" and "none of the 3" in exc.value.message


def test_mode_one_keeps_its_error(fuser: FaceFuser, sample_images: dict[str, np.ndarray],
                                  small_face_group: np.ndarray, group_faces: list[Face]) -> None:
    with pytest.raises(FaceTooSmallError) as exc:
        fuser.fuse(sample_images["astronaut"], small_face_group,
                   FuseOptions(target_face_index=SMALL, evaluate=False))
    assert exc.value.code == "target_face_too_small"


def test_mapping_skips_the_pair_it_cannot_fuse(
        fuser: FaceFuser, sample_images: dict[str, np.ndarray], small_face_group: np.ndarray,
        group_faces: list[Face]) -> None:
    result = fuser.fuse([sample_images["astronaut"]], small_face_group,
                        FuseOptions(evaluate=False),
                        mapping=[{"source": 0, "target": 1}, {"source": 0, "target": SMALL}])
    assert [f.target_index for f in result.fused] == [1]
    assert [(s.target_index, s.reason) for s in result.skipped] == [
        (SMALL, "target_face_too_small")]
    with pytest.raises(FaceTooSmallError):
        fuser.fuse([sample_images["astronaut"]], small_face_group, FuseOptions(evaluate=False),
                   mapping=[{"source": 0, "target": SMALL}])


def test_reasons_cover_missing_landmarks_and_profile(group_faces: list[Face]) -> None:
    face = group_faces[0]
    assert usability_error(face, "target") is None
    err = usability_error(replace(face, landmarks=None), "target")
    assert isinstance(err, FaceError) and err.code == "target_face_landmarks_failed"
    turned = turn_yaw(face, 70)
    small = group_faces[SMALL]
    usable, skipped = split_usable([face, turned, small], [0, 1, 2])
    assert usable == [0]
    assert [s.target_index for s in skipped] == [1, 2]
    # with the smallest allowed limit, the turned face is refused for its pose
    usable, skipped = split_usable([face, turned, small], [0, 1, 2], 16.0)
    assert usable == [0, 2]
    assert [(s.target_index, s.reason) for s in skipped] == [(1, "target_face_profile")]


@pytest.mark.parametrize("bad", [0, 15.9, 2000, "40", True, None])
def test_min_face_size_out_of_range_is_a_typed_error(bad: object) -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        FuseOptions(min_face_size=bad)  # type: ignore[arg-type]  # wrong values on purpose
    assert exc.value.code == "invalid_min_face_size"


def test_cli_reports_skipped_faces(small_face_group: np.ndarray, sample_paths: dict[str, Path],
                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from facefuse.cli import main as cli_main

    group = tmp_path / "group.png"
    group.write_bytes(encode_image(small_face_group, "png"))
    out, report = tmp_path / "out.png", tmp_path / "report.json"
    rc = cli_main(["fuse", str(sample_paths["astronaut"]), str(group), "-o", str(out),
                   "--mode", "many", "--report", str(report)])
    assert rc == 0 and out.is_file()
    text = capsys.readouterr().out
    assert "fused 2 face(s)" in text
    assert f"skipped face [{SMALL}]" in text and "target_face_too_small" in text
    skipped = json.loads(report.read_text())["skipped_faces"]
    assert [(s["index"], s["reason"]) for s in skipped] == [(SMALL, "target_face_too_small")]
    rc = cli_main(["fuse", str(sample_paths["astronaut"]), str(group), "-o", str(out),
                   "--mode", "many", "--min-face-size", "25"])
    assert rc == 0 and "fused 3 face(s)" in capsys.readouterr().out


def test_visible_fraction_falls_as_the_poses_part(group_faces: list[Face]) -> None:
    face = group_faces[0]
    assert face.landmarks is not None
    assert visible_fraction(face.landmarks, face.landmarks) == 1.0
    seen = []
    for deg in (10, 30, 50):
        turned = turn_yaw(face, deg).landmarks
        assert turned is not None
        seen.append(visible_fraction(turned, face.landmarks))
    assert 1.0 > seen[0] > seen[1] > seen[2] > 0.3, seen


def test_each_fused_face_has_its_quality_figures(
        fuser: FaceFuser, sample_images: dict[str, np.ndarray], small_face_group: np.ndarray,
        group_faces: list[Face]) -> None:
    result = fuser.fuse(sample_images["astronaut"], small_face_group, FuseOptions(mode="many"))
    report = result.report()
    faces = report["fused_faces"]
    assert isinstance(faces, list) and len(faces) == 2
    for f in faces:
        q = f["quality"]
        assert q["id_sim_source"] > q["id_sim_target"]
        assert 0.0 <= q["source_yaw_diff"] < 45 and 0.0 <= q["source_pitch_diff"] < 45
        assert 0.5 < q["visible_fraction"] <= 1.0
