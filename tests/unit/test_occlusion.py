"""Occluder masks both ways, the closed-mouth rule and the lighting of fused faces,
on the sample photos and synthetic variants of them (facefuse.toolchain.synthetic)."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.errors import InvalidArgumentError
from facefuse.fusion import mask as masks
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.swappers.classic import detail
from facefuse.fusion.swappers.classic.occlusion import occluder_mask
from facefuse.fusion.types import FuseOptions
from facefuse.toolchain.measures import face_outline_mask
from facefuse.toolchain.synthetic import OccluderKind, paste_occluder
from facefuse.toolchain.trials import (
    AFTER,
    BEFORE,
    Sample,
    background_trial,
    leak_trial,
    lighting_trial,
    survival_trial,
)

#: (source, target, donor of the occluder's pixels): every identity in each role.
PAIRS = [("obama", "biden", "astronaut"), ("astronaut", "obama2", "biden"),
         ("biden", "astronaut", "obama")]


def test_clean_faces_have_few_occluders(samples: dict[str, Sample]) -> None:
    for name, s in samples.items():
        face = face_outline_mask(s.landmarks, s.image.shape)
        occ = occluder_mask(s.image, s.landmarks) > 0.5
        assert occ[face].mean() < 0.08, (name, occ[face].mean())


@pytest.mark.parametrize("kind", ["bar", "sunglasses"])
def test_pasted_occluders_are_found(samples: dict[str, Sample], kind: OccluderKind) -> None:
    for _, t, donor in PAIRS:
        s, d = samples[t], samples[donor]
        img, fp = paste_occluder(s.image, s.landmarks, kind, d.image, d.landmarks)
        where = fp & face_outline_mask(s.landmarks, img.shape)
        found = occluder_mask(img, s.landmarks) > 0.5
        assert found[where].mean() > 0.9, (t, kind, found[where].mean())


@pytest.mark.parametrize("kind", ["bar", "sunglasses"])
def test_target_occluders_survive_fusion(fuser: FaceFuser, samples: dict[str, Sample],
                                         kind: OccluderKind) -> None:
    for s, t, donor in PAIRS:
        after, _ = survival_trial(fuser, samples[s], samples[t], kind, samples[donor], AFTER)
        before, _ = survival_trial(fuser, samples[s], samples[t], kind, samples[donor], BEFORE)
        assert after >= 0.95, (s, t, kind, after)
        assert before < 0.5, (s, t, kind, before)  # without the mask it is painted over


@pytest.mark.parametrize("kind", ["bar", "sunglasses"])
def test_source_occluders_do_not_leak(fuser: FaceFuser, samples: dict[str, Sample],
                                      kind: OccluderKind) -> None:
    worst_before = 0.0
    for s, t, donor in PAIRS:
        after, _ = leak_trial(fuser, samples[s], samples[t], kind, samples[donor], AFTER)
        before, _ = leak_trial(fuser, samples[s], samples[t], kind, samples[donor], BEFORE)
        assert after <= 0.05, (s, t, kind, after)
        worst_before = max(worst_before, before)
    assert worst_before > 0.3  # without the mask the occluder comes along


def test_source_lighting_is_replaced_by_the_targets(fuser: FaceFuser,
                                                   samples: dict[str, Sample]) -> None:
    for s, t, _ in PAIRS:
        after = lighting_trial(fuser, samples[s], samples[t], AFTER)
        before = lighting_trial(fuser, samples[s], samples[t], BEFORE)
        assert after is not None and before is not None
        assert abs(after[0]) <= 0.08, (s, t, after[0])
        assert abs(after[0]) < abs(before[0]), (s, t, before[0], after[0])


def test_no_output_pixel_comes_from_the_sources_background(
        fuser: FaceFuser, samples: dict[str, Sample]) -> None:
    # Head yaw differences of about 25° (biden → obama2) down to 0°.
    worst_before = 0.0
    for s, t in [("biden", "obama2"), ("obama2", "astronaut"), ("obama", "obama2"),
                 ("obama3", "biden")]:
        after, _ = background_trial(fuser, samples[s], samples[t], AFTER)
        assert after <= 0.002, (s, t, after)
        worst_before = max(worst_before, background_trial(fuser, samples[s], samples[t],
                                                          BEFORE)[0])
    assert worst_before > 0.02  # without the outline limit the background shows


def _teeth_share(image: np.ndarray, lips: np.ndarray) -> float:
    """Share of pixels in the lips region that are specks brighter than their
    neighbourhood (teeth squeezed between closed lips show as a dotted line)."""
    import cv2

    luma = image.mean(-1).astype(np.uint8)
    specks = luma.astype(np.int16) - cv2.medianBlur(luma, 9) > 15
    return float(specks[lips].mean())


def test_an_open_source_mouth_brings_no_teeth_into_a_closed_one(
        fuser: FaceFuser, samples: dict[str, Sample], monkeypatch: pytest.MonkeyPatch) -> None:
    from facefuse.fusion.swappers.classic import swapper as classic

    src, tgt = samples["obama2"], samples["biden"]  # open mouth with teeth → closed mouth
    assert masks.mouth_open(src.landmarks) and not masks.mouth_open(tgt.landmarks)
    h, w = tgt.image.shape[:2]
    lips = masks.lips_mask(tgt.landmarks, (0, 0, w, h), masks.feather_px(tgt.landmarks)) > 0.2
    opts = FuseOptions(evaluate=False)

    def teeth() -> float:
        out = fuser.fuse_faces(src.image, src.faces[0], tgt.image, tgt.faces, [0], opts).image
        return _teeth_share(out, lips)

    # The target's own lips have specks of grain (rendered at full resolution they
    # stay): the kept lips have no more than those, the source's teeth far more.
    own = _teeth_share(tgt.image, lips)
    kept = teeth()
    # The detail layer takes no source detail where the squeezed mouth tears the
    # source map; the lips' keep alone must do, and without both the teeth show.
    monkeypatch.setattr(detail, "map_tears", lambda mx, my, valid: np.zeros(mx.shape, bool))
    kept_alone = teeth()
    monkeypatch.setattr(classic, "SOURCE_OPEN_LIPS_KEEP", 0.0)
    without = teeth()
    assert kept <= own + 0.001 and kept_alone <= own + 0.001, (kept, kept_alone, own)
    assert without > 3 * max(own, 0.001), (without, own)


@pytest.mark.parametrize("name", ["relight", "reject_source_occluders", "keep_target_occluders"])
def test_mask_part_options_must_be_booleans(name: str) -> None:
    with pytest.raises(InvalidArgumentError) as exc:
        FuseOptions(**{name: "yes"})  # type: ignore[arg-type]
    assert exc.value.code == f"invalid_{name}"
