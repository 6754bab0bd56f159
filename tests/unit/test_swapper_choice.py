"""Choosing a swapper: the default setting, the check before any work, what the
fuser says of its swappers, and the clip engine on the same path.

The swap model is a tiny one built to the contract (``swap_models``), registered
in the manifest of a temporary model directory beside the real zoo.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.types import FuseOptions
from facefuse.video.engine import ClipFusion, VideoOptions
from facefuse.video.fuser import VideoFuser
from swap_models import TINY, middle_third, painted, tiny_swap_dir


@pytest.fixture(scope="module")
def tiny_settings(settings: Settings, model_dir: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> Settings:
    return settings.replace(models_dir=tiny_swap_dir(tmp_path_factory.mktemp("tiny"), model_dir))


@pytest.fixture(scope="module")
def tiny_default(tiny_settings: Settings) -> FaceFuser:
    """A fuser whose default swapper (``FACEFUSE_SWAPPER``) is the tiny one."""
    return FaceFuser(tiny_settings.replace(swapper=TINY))


@pytest.fixture(scope="module")
def target_box(analyser: FaceAnalyser, sample_images: dict[str, np.ndarray]
               ) -> tuple[int, int, int, int]:
    """The middle of the target's (obama's) face."""
    return middle_third(analyser.analyse(sample_images["obama"], embed=False)[0].bbox)


def test_the_setting_is_read_from_the_environment() -> None:
    assert Settings.from_env({"FACEFUSE_SWAPPER": f" {TINY} "}).swapper == TINY
    assert Settings.from_env({}).swapper == "classic"
    with pytest.raises(InvalidArgumentError, match="swapper"):
        Settings(swapper="")


def test_options_that_name_no_swapper_get_the_default(
    tiny_default: FaceFuser, sample_paths: dict[str, Path],
    target_box: tuple[int, int, int, int]
) -> None:
    assert FuseOptions().swapper is None
    assert tiny_default.resolve(FuseOptions()).swapper == TINY
    assert tiny_default.resolve(FuseOptions(swapper="classic")).swapper == "classic"
    res = tiny_default.fuse(sample_paths["biden"], sample_paths["obama"], evaluate=False)
    assert painted(res.image, target_box)
    classic = tiny_default.fuse(sample_paths["biden"], sample_paths["obama"], evaluate=False,
                                swapper="classic")
    assert not painted(classic.image, target_box)


def test_an_unknown_default_stops_the_fuser(tiny_settings: Settings) -> None:
    with pytest.raises(InvalidArgumentError, match="FACEFUSE_SWAPPER='nope'") as info:
        FaceFuser(tiny_settings.replace(swapper="nope"))
    assert info.value.code == "unknown_swapper"
    assert "classic" in info.value.message and TINY in info.value.message


def test_an_unknown_name_is_refused_before_any_work(tiny_default: FaceFuser) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown swapper 'nope'") as info:
        tiny_default.resolve(FuseOptions(swapper="nope"))
    assert info.value.code == "unknown_swapper" and TINY in info.value.message
    # A clip: the name is checked before the clip is looked for.
    with pytest.raises(InvalidArgumentError) as clip:
        VideoFuser(tiny_default).fuse_video(Path("absent.jpg"), Path("absent.mp4"),
                                            Path("out.mp4"),
                                            VideoOptions(fuse=FuseOptions(swapper="nope")))
    assert clip.value.code == "unknown_swapper"


def test_the_fuser_describes_its_swappers(tiny_default: FaceFuser,
                                          tiny_settings: Settings) -> None:
    infos = {i.name: i for i in tiny_default.describe_swappers()}
    assert set(infos) == set(tiny_default.swappers)
    assert infos["classic"].to_dict() == {"name": "classic", "kind": "classic",
                                          "needs_source_embedding": False}
    assert infos[TINY].to_dict() == {"name": TINY, "kind": "onnx",
                                     "needs_source_embedding": True}
    manifest = tiny_default.analyser.registry.manifest
    # What goes into a result's key: the swap model's and its recogniser's sha256.
    assert dict(infos[TINY].models) == {TINY: manifest.get(TINY).sha256,
                                        "dlib_resnet": manifest.get("dlib_resnet").sha256}
    assert infos["classic"].models == {}
    assert tiny_default.swapper_info(None) == infos[TINY]


def test_a_clip_renders_with_the_default_swapper(
    tiny_default: FaceFuser, sample_paths: dict[str, Path],
    sample_images: dict[str, np.ndarray], target_box: tuple[int, int, int, int]
) -> None:
    clip = ClipFusion(tiny_default, VideoOptions(), [sample_paths["biden"]])
    assert clip.swapper is tiny_default.swappers[TINY]
    assert clip.options.fuse.swapper == TINY
    out, stats = clip.process(sample_images["obama"].copy(), 0, 0.0)
    assert stats.fused and painted(out, target_box)
    # Naming the default it already uses is no change of swapper.
    clip.retune(FuseOptions(degree=50))
    clip.retune(FuseOptions(degree=60, swapper=TINY))
    with pytest.raises(InvalidArgumentError) as info:
        clip.retune(FuseOptions(swapper="classic"))
    assert info.value.code == "option_fixed"
