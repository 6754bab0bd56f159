"""The options: one declaration on FuseOptions (and a clip's on VideoOptions), from which
the HTTP schemas, the CLI flags and the validation are made; and the library's front
door built on it."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest

import facefuse
from facefuse.cli import _fuse_options, _option_values, build_parser
from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError, NoFaceError
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.types import FuseOptions, declared, option_specs
from facefuse.serving.jobs.store import job_options
from facefuse.serving.routes.jobs import JobParams
from facefuse.serving.routes.schemas import FuseParams
from facefuse.video.codecs import ENCODERS, EncoderName
from facefuse.video.options import VideoOptions

# --- one declaration --------------------------------------------------------------------


def test_the_http_schema_is_the_declaration() -> None:
    schema = FuseParams.model_json_schema()["properties"]
    offered = [f for f, spec in option_specs() if spec.http]
    assert [f.name for f in offered] == [n for n in schema if n not in
                                         ("format", "quality", "similarity", "mapping")]
    for f, spec in option_specs():
        if not spec.http:
            assert f.name not in schema
            continue
        prop = schema[f.name]
        assert prop["default"] == f.default and prop["description"] == spec.help
        num = next((b for b in prop.get("anyOf", [prop]) if b.get("type") != "null"), prop)
        assert num.get("minimum") == spec.low and num.get("maximum") == spec.high, f.name
    # the parameters' defaults are the options' defaults
    assert FuseParams.model_validate({}).options() == FuseOptions()


def test_every_http_option_reaches_the_fusion_options() -> None:
    changed = {"degree": 40.0, "shape": 10.0, "texture": 90.0, "mode": "many",
               "blend": "alpha", "relight": False, "reject_source_occluders": False,
               "keep_target_occluders": False, "symmetric_fill": False, "facial_hair": "off",
               "glasses": False, "min_face_size": 60.0, "swapper": "my_swapper"}
    assert set(changed) | {"target_face_index"} == {f.name for f, s in option_specs() if s.http}
    assert FuseParams.model_validate(changed).options() == FuseOptions(**changed)  # type: ignore[arg-type]
    assert FuseParams.model_validate({"target_face_index": 2}).options().target_face_index == 2


def test_the_cli_flags_are_the_declaration() -> None:
    def options(*flags: str) -> FuseOptions:
        return _fuse_options(build_parser().parse_args(["fuse", "s.jpg", "t.jpg", *flags]))

    defaults = options()
    assert defaults == FuseOptions()
    on_cli = {f.name for f, spec in option_specs() if spec.cli}
    assert on_cli == {f.name for f in dataclasses.fields(FuseOptions)} - {"evaluate"}
    got = options("--degree", "40", "--shape", "10", "--mode", "reference", "--blend",
                  "poisson", "--swapper", "other", "--min-face-size", "60", "--no-relight")
    assert (got.degree, got.shape, got.mode, got.blend, got.swapper, got.min_face_size,
            got.relight) == (40.0, 10.0, "reference", "poisson", "other", 60.0, False)
    assert options("--target-face-index", "3").target_face_index == 3


def test_a_clips_options_are_one_declaration_too() -> None:
    """The job fields of ``POST /v1/jobs``, the ``facefuse video`` flags and what a
    worker reads back from a job are all made from VideoOptions' declaration."""
    offered = [(f, spec) for f, spec, _ in declared(VideoOptions) if spec.http]
    assert [f.name for f, _ in offered] == ["encoder", "detect_every", "smooth"]
    schema = JobParams.model_json_schema()["properties"]
    group = next(g for g in _subparser("video")._action_groups if g.title == "clip options")
    flags = {a.dest: a for a in group._group_actions}
    for f, spec, hint in declared(VideoOptions):
        assert (f.name in schema) == spec.http, f.name
        assert (f.name in flags) == (spec.cli is not None), f.name
        if spec.http:
            prop = schema[f.name]
            assert prop["default"] == f.default and prop["description"] == spec.help
            assert prop.get("minimum") == spec.low and prop.get("maximum") == spec.high
            assert prop.get("enum", None) == (list(get_args(hint)) or None)
        if spec.cli is not None:
            assert flags[f.name].option_strings == [spec.cli]
            assert flags[f.name].default == f.default
    assert set(get_args(EncoderName)) == set(ENCODERS)
    # what the API stores for a job is what the worker reads back
    changed = {"encoder": "x264", "detect_every": 5, "smooth": False}
    raw = JobParams.model_validate(changed).model_dump()
    video = job_options(raw, "clip")[0]
    assert video == VideoOptions(fuse=FuseOptions(evaluate=False), **changed)  # type: ignore[arg-type]
    assert job_options(JobParams.model_validate({}).model_dump(), "clip")[0] == VideoOptions(
        fuse=FuseOptions(evaluate=False))
    args = build_parser().parse_args(["video", "s.jpg", "c.mp4", "-o", "o.mp4", "--encoder",
                                      "x264", "--detect-every", "5", "--no-smooth"])
    assert _option_values(args, VideoOptions) == changed
    with pytest.raises(InvalidArgumentError) as exc:
        VideoOptions(detect_every=0)
    assert exc.value.code == "invalid_detect_every"


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices[name]
    return parser


@pytest.mark.parametrize(("bad", "code"), [
    ({"degree": 101}, "invalid_degree"), ({"shape": -1}, "invalid_shape"),
    ({"target_face_index": -1}, "invalid_target_face_index"),
    ({"target_face_index": 1.5}, "invalid_target_face_index"),
    ({"relight": "yes"}, "invalid_relight"), ({"swapper": 3}, "invalid_swapper"),
    ({"min_face_size": 8}, "invalid_min_face_size"), ({"mode": "all"}, "invalid_mode"),
    ({"mode": "many", "target_face_index": 0}, "options_conflict"),
    ({"mode": "reference", "target_face_index": 1}, "options_conflict"),
])
def test_bad_and_contradictory_options_are_typed_errors(bad: dict[str, object],
                                                        code: str) -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        FuseOptions(**bad)  # type: ignore[arg-type]  # wrong values on purpose
    assert exc.value.code == code


def test_facial_hair_is_a_choice_that_takes_the_old_booleans() -> None:
    """both by default; true/false (the option's old spelling) read as both/off,
    in the library, over HTTP (JSON and multipart strings) and on the CLI."""
    assert FuseOptions().facial_hair == "both"
    for old, new in ((True, "both"), (False, "off"), ("true", "both"), ("false", "off")):
        if isinstance(old, bool):
            assert FuseOptions(facial_hair=old) == FuseOptions(facial_hair=new)  # type: ignore[arg-type]
        assert FuseParams.model_validate({"facial_hair": old}).options().facial_hair == new
    sides = {m: (FuseOptions(facial_hair=m).finds_facial_hair(source=True),
                 FuseOptions(facial_hair=m).finds_facial_hair(source=False))
             for m in ("target", "both", "off")}
    assert sides == {"target": (False, True), "both": (True, True), "off": (False, False)}

    def cli(*flags: str) -> str:
        args = build_parser().parse_args(["fuse", "s.jpg", "t.jpg", "-o", "o.jpg", *flags])
        return _fuse_options(args).facial_hair

    assert (cli(), cli("--facial-hair", "target"), cli("--facial-hair", "off")) == (
        "both", "target", "off")
    for bad in ("beard", 1, None):
        with pytest.raises(InvalidArgumentError) as exc:
            FuseOptions(facial_hair=bad)  # type: ignore[arg-type]
        assert exc.value.code == "invalid_facial_hair"


def test_numpy_numbers_are_numbers() -> None:
    numpy_values: dict[str, Any] = {"degree": np.float32(50), "target_face_index": np.int64(1)}
    assert FuseOptions(**numpy_values).degree == 50


# --- the front door -------------------------------------------------------------------


def test_fuser_refuses_options_given_twice(fuser: FaceFuser,
                                           sample_images: dict[str, np.ndarray]) -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        fuser.fuse(sample_images["obama"], sample_images["biden"], FuseOptions(), degree=10)
    assert exc.value.code == "options_conflict"


def test_fuse_takes_a_reference(settings: Settings, sample_paths: dict[str, Path],
                                make_group: Callable[..., np.ndarray]) -> None:
    group = make_group(["biden", "obama2"])
    result = facefuse.fuse(sample_paths["astronaut"], group, reference=sample_paths["obama"],
                           settings=settings, evaluate=False)
    assert len(result.fused) == 1
    assert result.fused[0].target_face.bbox[0] > group.shape[1] * 0.4  # obama2, on the right
    for kw in ({"mode": "many"}, {"mapping": [{"source": 0, "target": 0}]}):
        with pytest.raises(InvalidArgumentError) as exc:
            facefuse.fuse(sample_paths["astronaut"], group, reference=sample_paths["obama"],
                          settings=settings, **kw)
        assert exc.value.code == "options_conflict"
    with pytest.raises(InvalidArgumentError) as exc:
        facefuse.fuse(sample_paths["astronaut"], group, settings=settings, degre=50)
    assert exc.value.code == "unknown_option"


def test_verify_tells_the_same_person(settings: Settings,
                                      sample_paths: dict[str, Path]) -> None:
    same = facefuse.verify(sample_paths["obama"], sample_paths["obama2"], settings=settings)
    other = facefuse.verify(sample_paths["obama"], sample_paths["biden"], settings=settings)
    assert same.same_person and not other.same_person
    assert same.distance < settings.same_person_distance <= other.distance
    assert same.similarity > other.similarity
    assert same.to_dict()["same_person"] is True
    with pytest.raises(NoFaceError) as exc:
        facefuse.verify(sample_paths["obama"], np.full((200, 200, 3), 128, np.uint8),
                        settings=settings)
    assert exc.value.code == "b_no_face"


def test_library_defaults_are_shared_across_service_only_settings(settings: Settings) -> None:
    a = facefuse.default_analyser(settings)
    assert facefuse.default_analyser(settings.replace(redis_url="redis://other:6379/1",
                                                      max_inflight=3)) is a
    assert facefuse.default_fuser(settings.replace(label=True)).analyser is a
    assert settings.replace(threads=2).analysis_key() != settings.analysis_key()
