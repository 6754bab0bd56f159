"""The fused face's eyes: the target's opening, gaze and catchlights survive a
squinting source, and the irises take the source's colour."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion import mask as masks
from facefuse.fusion.carry import IrisReading
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.geometry import eye_groups, openness
from facefuse.fusion.swappers.classic import eyes
from facefuse.fusion.types import FuseOptions
from facefuse.toolchain.samples import SAMPLES
from facefuse.toolchain.synthetic import LIGHT_IRIS, light_irises, squinting
from facefuse.toolchain.trials import Sample

#: Degree 100 with the target's geometry: the output's eyes sit on the target's pixels.
FULL_TEXTURE = FuseOptions(degree=100.0, shape=0.0)


def _fuse(fuser: FaceFuser, src: Sample, tgt: Sample, options: FuseOptions) -> np.ndarray:
    return fuser.fuse_faces(src.image, src.faces[0], tgt.image, tgt.faces, [0], options).image


def _apertures(lm: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Boolean (H, W) inside both lid openings, a feather's tenth in from the lids."""
    return masks.eyes_mask(lm, (0, 0, shape[1], shape[0])) > 0.9


def _eye_openness(lm: np.ndarray) -> float:
    o = openness(lm)
    return (o["eye_image_left"] + o["eye_image_right"]) / 2.0


@pytest.fixture(scope="module")
def squinting_source(analyser: FaceAnalyser, samples: dict[str, Sample]) -> Sample:
    """obama with both upper lids lowered over the eyes, analysed again."""
    image = squinting(samples["obama"].image, samples["obama"].landmarks, 0.9)
    return Sample(image, analyser.analyse(image, embed=False))


def test_the_squint_variant_really_squints(samples: dict[str, Sample],
                                           squinting_source: Sample) -> None:
    before = _eye_openness(samples["obama"].landmarks)
    after = _eye_openness(squinting_source.landmarks)
    assert after < 0.7 * before, (before, after)


@pytest.mark.parametrize("target", ["biden", "astronaut", "obama3"])
def test_a_squinting_source_keeps_the_targets_open_eyes(
        fuser: FaceFuser, samples: dict[str, Sample], squinting_source: Sample,
        target: str) -> None:
    """Large (full-resolution path) and small targets: inside the target's lid
    openings the output has the target's structure (sclera, iris, gaze) at the
    target's contrast, and each iris's catchlight stays as bright."""
    tgt = samples[target]
    out = _fuse(fuser, squinting_source, tgt, FULL_TEXTURE)
    inside = _apertures(tgt.landmarks, tgt.image.shape)
    assert inside.sum() > 50
    luma_t = tgt.image[inside].astype(np.float64).mean(1)
    luma_o = out[inside].astype(np.float64).mean(1)
    assert np.corrcoef(luma_t, luma_o)[0, 1] > 0.9
    assert luma_o.std() > 0.85 * luma_t.std()
    for _, iris in eye_groups(tgt.landmarks):
        c = tgt.landmarks[iris[0], :2]
        r = float(np.linalg.norm(tgt.landmarks[list(iris[1:]), :2] - c, axis=1).mean())
        yy, xx = np.mgrid[0:tgt.image.shape[0], 0:tgt.image.shape[1]]
        disc = (np.hypot(xx - c[0], yy - c[1]) < r) & inside
        assert out[disc].mean(1).max() > tgt.image[disc].mean(1).max() - 20


def test_the_irises_take_the_sources_colour(fuser: FaceFuser,
                                            samples: dict[str, Sample]) -> None:
    """astronaut's brown eyes into biden's blue-grey ones: the output's iris colour
    (chromaticity of its ring's median) is nearer the source's than the target's
    was, and at texture 0 it is the target's own."""
    src, tgt = samples["astronaut"], samples["biden"]

    def chroma(image: np.ndarray, lm: np.ndarray) -> np.ndarray:
        m = eyes.iris_colour(image.astype(np.float32), lm)
        assert m is not None
        out: np.ndarray = m[0] / m[0].sum()
        return out

    c_src, c_tgt = chroma(src.image, src.landmarks), chroma(tgt.image, tgt.landmarks)
    out = _fuse(fuser, src, tgt, FULL_TEXTURE)
    c_out = chroma(out, tgt.landmarks)
    assert np.linalg.norm(c_out - c_src) < 0.5 * np.linalg.norm(c_tgt - c_src)
    plain = _fuse(fuser, src, tgt, FuseOptions(degree=100.0, shape=0.0, texture=0.0))
    inside = _apertures(tgt.landmarks, tgt.image.shape)
    assert np.abs(plain[inside].astype(int) - tgt.image[inside]).max() <= 2


@pytest.mark.parametrize("light", ["source", "target"])
def test_light_eyes_on_dark_skin_are_read_and_take_and_give_their_colour(
        fuser: FaceFuser, samples: dict[str, Sample], light: str) -> None:
    """obama's irises painted light blue-grey (brighter than half his skin, which
    the darkness rule alone took for lid or sclera): read as that colour, they give
    it to the astronaut's brown eyes as a source, and take her brown as a target."""
    dark = samples["obama"]
    painted = Sample(light_irises(dark.image, dark.landmarks), dark.faces)

    def chroma(image: np.ndarray, lm: np.ndarray) -> np.ndarray:
        m = eyes.iris_colour(image.astype(np.float32), lm)
        assert m is not None
        out: np.ndarray = m[0] / m[0].sum()
        return out

    c_light = chroma(painted.image, painted.landmarks)
    want = np.array(LIGHT_IRIS) / sum(LIGHT_IRIS)
    assert np.linalg.norm(c_light - want) < 0.03, c_light
    src, tgt = ((painted, samples["astronaut"]) if light == "source"
                else (samples["astronaut"], painted))
    c_src, c_tgt = chroma(src.image, src.landmarks), chroma(tgt.image, tgt.landmarks)
    out = _fuse(fuser, src, tgt, FULL_TEXTURE)
    c_out = chroma(out, tgt.landmarks)
    assert np.linalg.norm(c_out - c_src) < 0.5 * np.linalg.norm(c_tgt - c_src), (
        c_src, c_tgt, c_out)


def test_gains_are_none_without_an_iris_or_with_a_closed_eye(
        samples: dict[str, Sample]) -> None:
    """A face against itself keeps its iris's hue and luma; a mesh without iris
    points leaves the target's colour, and so does an eye whose opening shows fewer
    than MIN_SAMPLES iris pixels."""
    img = np.zeros((8, 8, 3), np.float32)
    lm = np.zeros((468, 3))
    assert eyes.iris_gains(eyes.iris_colour(img, lm), eyes.iris_colour(img, lm)) == [None, None]
    for name in SAMPLES:
        face = samples[name]
        image = face.image.astype(np.float32)
        found = eyes.iris_colour(image, face.landmarks)
        gains = eyes.iris_gains(found, found)
        # Against itself: the irises' own hue (never magenta: a reddish reading's
        # blue lowered to its green, a bluish one's green raised to its red), at a
        # luma gain of 1 where the hue is their own; one colour for both eyes.
        assert found is not None and gains[0] is not None, name
        assert gains[1] is not None and np.array_equal(gains[0], gains[1])
        own = found[0] + 1.0
        hue = own.copy()
        if hue[1] < min(hue[0], hue[2]):
            if hue[0] >= hue[2]:
                hue[2] = hue[1]
            else:
                hue[1] = hue[0]
        assert np.allclose(gains[0] / gains[0].sum(), hue / hue.sum()), name
        if np.array_equal(hue, own):
            assert gains[0] @ np.array([0.299, 0.587, 0.114]) == pytest.approx(1.0, abs=1e-5)
    tgt_lm = samples["biden"].landmarks
    shut = tgt_lm.copy()
    for contour, _ in eye_groups(tgt_lm):
        shut[list(contour), 1] = tgt_lm[list(contour), 1].mean()  # the lids closed
    image = samples["biden"].image.astype(np.float32)
    assert eyes.iris_gains(eyes.iris_colour(image, shut), eyes.iris_colour(image, shut)) == [
        None, None]


def test_the_photos_light_colour_is_read_on_the_eye_whites(
        samples: dict[str, Sample]) -> None:
    """The eye whites are found on every sample; the same white gives no change, a
    yellow cast (blue halved) on the source's white is taken out within its bound,
    and without a white nothing moves. obama3's irises read magenta in its reddish
    light: its colour given to another face is brown (red over green over blue),
    not the cool grey that raising green made of it."""
    for name in SAMPLES:
        found = eyes.iris_colour(samples[name].image.astype(np.float32), samples[name].landmarks)
        assert found is not None and found.sclera is not None, name
        assert found.sclera.min() > found.iris.max(), name  # whites brighter than irises
    white = np.array([200.0, 190.0, 180.0])
    assert np.allclose(eyes.light_colour(white, white), 1.0)
    cast = eyes.light_colour(white * np.array([1.0, 1.0, 0.5]), white)
    assert cast[2] == eyes.LIGHT_COLOUR_RANGE[1] and cast[0] < 1.0 and cast[1] < 1.0
    assert np.array_equal(eyes.light_colour(None, white), np.ones(3))
    o3, astro = (eyes.iris_colour(samples[n].image.astype(np.float32), samples[n].landmarks)
                 for n in ("obama3", "astronaut"))
    assert o3 is not None and astro is not None
    assert o3.iris[1] < min(o3.iris[0], o3.iris[2]) and o3.iris[0] > o3.iris[2]
    gain = eyes.iris_gains(o3, astro)[0]
    assert gain is not None and gain[0] > gain[1] >= gain[2], gain


def test_a_magenta_reading_is_brown_in_reddish_light_and_grey_in_bluish() -> None:
    """Green below red and blue is no iris colour: red the larger, blue comes down
    to green (brown); blue the larger, green goes up to red (grey-blue). The same
    readings on both sides (one light) leave the hue as fixed."""
    skin = np.array([150.0, 100.0, 80.0])
    white = np.array([200.0, 180.0, 170.0])
    reddish = IrisReading(np.array([39.0, 24.0, 31.0]), skin, white)
    bluish = IrisReading(np.array([29.0, 24.0, 39.0]), skin, white)
    for reading, want in ((reddish, [40.0, 25.0, 25.0]), (bluish, [30.0, 30.0, 40.0])):
        gain = eyes.iris_gains(reading, reading)[0]
        assert gain is not None
        assert np.allclose(gain / gain.sum(), np.array(want) / sum(want), atol=1e-6), gain
