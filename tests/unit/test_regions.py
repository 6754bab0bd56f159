"""Facial hair and glasses as regions: found on realistic variants of the sample
photos (real scalp hair as a beard or stubble; clear glasses of real darkened
pixels with lens reflections), not on the clean faces; the target's kept through
fusion, the source's not carried."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.detectors import Purpose
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.swappers.classic import occlusion, regions
from facefuse.fusion.swappers.classic.swapper import WORK_EYE_PX, ClassicSwapper
from facefuse.fusion.types import FuseOptions
from facefuse.toolchain.measures import face_outline_mask
from facefuse.toolchain.synthetic import (
    FacialHairKind,
    FrameKind,
    paste_facial_hair,
    paste_glasses,
    paste_hairline,
)
from facefuse.toolchain.synthetic import variant as synthetic_variant
from facefuse.toolchain.trials import (
    REGIONS,
    Sample,
    facial_hair_leak_trial,
    facial_hair_survival_trial,
    fuse_sample,
    glasses_leak_trial,
    glasses_survival_trial,
)

#: (source, target, donor of the hair or frame pixels): dark hair onto light skin
#: and brown onto dark, each identity in each role.
PAIRS = [("obama", "biden", "astronaut"), ("biden", "astronaut", "obama"),
         ("obama2", "obama3", "astronaut")]
#: The classic swapper's working eye distance for targets (pixels).
WORK_EYE = WORK_EYE_PX


def _working(image: np.ndarray, lm: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The image and mesh at the swapper's working scale, and that scale."""
    s = min(1.0, WORK_EYE / eye_distance(lm))
    small = cv2.resize(image, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)
    local = lm.copy()
    local[:, :3] *= s
    return small, local, s


@pytest.mark.parametrize("variant", ["native", "mirrored", "tilt+12", "tilt-12", "relit"])
def test_clean_faces_have_no_regions(analyser: FaceAnalyser, samples: dict[str, Sample],
                                     variant: str) -> None:
    """No sample face wears a beard or glasses: not one pixel of either is found,
    whether the face is tilted, mirrored or lit from one side (smile folds, the
    shadow under the nose and a shaded jaw are not hair)."""
    for name, s in samples.items():
        image = synthetic_variant(s.image, variant)
        found = analyser.analyse(image, embed=False)[0].landmarks
        assert found is not None
        img, lm, _ = _working(image, found)
        assert not regions.facial_hair_mask(img, lm).any(), (name, variant)
        assert not regions.glasses_mask(img, lm).any(), (name, variant)


@pytest.mark.parametrize("purpose", ["largest", "all"])
def test_the_occluder_mask_finds_no_glasses_on_clean_faces(
        analyser: FaceAnalyser, samples: dict[str, Sample], purpose: Purpose) -> None:
    """Through the swapper's own entry point (the occluder mask with the regions, on
    the working copy of the face's region), glasses add nothing on a face without
    them, with either detector's mesh. (Looked for on the face outline's crop, the
    eye band was cut at the temples and obama2's YuNet mesh at 80 px got "frames"
    round both eyes.)"""
    for name, s in samples.items():
        lm = analyser.analyse(s.image, embed=False, purpose=purpose)[0].landmarks
        assert lm is not None
        img, local, _ = _working(s.image, lm)
        with_glasses = regions.face_occluders(img, local, glasses=True)
        without = regions.face_occluders(img, local, glasses=False)
        assert np.array_equal(with_glasses, without), (name, purpose)


def test_default_fusion_of_a_clean_shaven_target_is_unchanged(
        fuser: FaceFuser, samples: dict[str, Sample]) -> None:
    """The target's facial hair is looked for by default; where there is none (the
    stubble-shaded obama2), the output is the one without looking, bit for bit."""
    s, t = samples["biden"], samples["obama2"]
    outs = [fuser.fuse_faces(s.image, s.faces[0], t.image, t.faces, [0],
                             FuseOptions(facial_hair=m, evaluate=False)).image
            for m in ("target", "off")]
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("kind", ["beard", "stubble"])
def test_facial_hair_is_found(samples: dict[str, Sample], kind: FacialHairKind) -> None:
    """On light skin and dark, fair hair on dark skin too (the astronaut's brown
    hair, half of the skin showing through as stubble, on obama: neither much
    greyer nor darker than his skin)."""
    for t, donor in [(t, donor) for _, t, donor in PAIRS] + [("obama", "astronaut")]:
        s, d = samples[t], samples[donor]
        hairy, fp = paste_facial_hair(s.image, s.landmarks, kind, d.image, d.landmarks)
        img, lm, _ = _working(hairy, s.landmarks)
        fp_small = cv2.resize(fp.astype(np.uint8), (img.shape[1], img.shape[0]),
                              interpolation=cv2.INTER_NEAREST) > 0
        where = fp_small & regions.beard_zone(lm, img.shape[:2])
        found = regions.facial_hair_mask(img, lm) > 0
        assert found[where].mean() > (0.85 if kind == "beard" else 0.5), (t, kind,
                                                                      found[where].mean())
        if kind == "stubble":  # the colour-outlier occluders alone miss most of it
            assert (occlusion.occluder_mask(img, lm) > 0.5)[where].mean() < 0.5


@pytest.mark.parametrize("kind", ["beard", "moustache", "stubble"])
def test_hair_on_one_side_only_is_not_facial_hair(samples: dict[str, Sample],
                                                  kind: FacialHairKind) -> None:
    """Facial hair grows on both sides of the face; a dark patch reaching the
    philtrum or the chin from one side (a smile fold, a shaded jaw) is not it."""
    for _, t, donor in PAIRS[:1] + PAIRS[2:]:  # the faces where it is found whole
        s, d = samples[t], samples[donor]
        hairy, _ = paste_facial_hair(s.image, s.landmarks, kind, d.image, d.landmarks)
        img, lm, _ = _working(hairy, s.landmarks)
        clean, _, _ = _working(s.image, s.landmarks)
        assert regions.facial_hair_mask(img, lm).any(), (t, kind)
        # The hair on one side of the midline (nose base to chin) only.
        a, b = lm[2, :2], lm[152, :2]
        yy, xx = np.mgrid[0:img.shape[0], 0:img.shape[1]]
        left = (xx - a[0]) * (b[1] - a[1]) - (yy - a[1]) * (b[0] - a[0]) < 0
        for side in (left, ~left):
            half = img.copy()
            half[side] = clean[side]
            assert not regions.facial_hair_mask(half, lm).any(), (t, kind)


@pytest.mark.parametrize("kind", ["beard", "moustache", "stubble"])
def test_target_facial_hair_is_kept(fuser: FaceFuser, samples: dict[str, Sample],
                                    kind: FacialHairKind) -> None:
    """Strand for strand, by default and with the source's rejected too; not when
    nothing of the target is kept."""
    for s, t, donor in PAIRS:
        for opts in (FuseOptions(), REGIONS):
            kept, _ = facial_hair_survival_trial(fuser, samples[s], samples[t], kind,
                                                 samples[donor], opts)
            assert kept >= KEPT[kind], (s, t, kind, opts.facial_hair, kept)
        gone, _ = facial_hair_survival_trial(fuser, samples[s], samples[t], kind,
                                             samples[donor],
                                             FuseOptions(keep_target_occluders=False))
        assert gone < kept - 0.2, (s, t, kind, gone, kept)


def test_the_source_shows_under_the_targets_stubble(fuser: FaceFuser,
                                                   samples: dict[str, Sample]) -> None:
    """The target's stubble is laid over the fused face, not kept as the target's
    pixels: under it the output changes (low-passed) by more than a third of what
    fusing the clean-shaven target changes there (kept as the target's pixels, the
    old rule: 0.07 of it)."""
    for s, t, donor in PAIRS:
        src, tgt = samples[s], samples[t]
        hairy, fp = paste_facial_hair(tgt.image, tgt.landmarks, "stubble",
                                      samples[donor].image, samples[donor].landmarks)
        out = fuse_sample(fuser, src, Sample(hairy, tgt.faces), FuseOptions())
        clean = fuse_sample(fuser, src, tgt, FuseOptions())
        sigma = 0.05 * eye_distance(tgt.landmarks)
        where = fp & face_outline_mask(tgt.landmarks, tgt.image.shape)

        def change(a: np.ndarray, b: np.ndarray, sigma: float = sigma,
                   where: np.ndarray = where) -> float:
            d = cv2.GaussianBlur(a.astype(np.float32) - b.astype(np.float32), (0, 0), sigma)
            return float(np.abs(d).max(-1)[where].mean())

        under, bare = change(out, hairy), change(clean, tgt.image)
        assert under >= 0.35 * bare, (s, t, under, bare)


@pytest.mark.parametrize("kind", ["beard", "moustache", "stubble"])
def test_source_facial_hair_is_not_carried(fuser: FaceFuser, samples: dict[str, Sample],
                                           kind: FacialHairKind) -> None:
    for s, t, donor in PAIRS:
        _, dark, _, _ = facial_hair_leak_trial(fuser, samples[s], samples[t], kind,
                                               samples[donor], REGIONS)
        # Grey levels the source's hair moves the clean-shaven target's beard zone (the
        # worst, biden's beard into the 105-px astronaut: 3.1; it moves by ~0.5 with a
        # pixel's shift of the source's mesh, and 2.6 read the same at 1:1).
        assert abs(dark) <= 3.5, (s, t, kind, dark)


@pytest.mark.parametrize("kind", ["metal", "plastic"])
def test_glasses_are_found(samples: dict[str, Sample], kind: FrameKind) -> None:
    for _, t, donor in PAIRS:
        s, d = samples[t], samples[donor]
        worn, fp = paste_glasses(s.image, s.landmarks, kind, d.image, d.landmarks)
        img, lm, _ = _working(worn, s.landmarks)
        fp_small = cv2.resize(fp.astype(np.float32), (img.shape[1], img.shape[0]),
                              interpolation=cv2.INTER_AREA) > 0.3
        where = fp_small & face_outline_mask(lm, img.shape)
        found = regions.glasses_mask(img, lm) > 0
        assert found[where].mean() > 0.65, (t, kind, found[where].mean())


@pytest.mark.parametrize("kind", ["metal", "plastic"])
def test_target_glasses_are_kept_and_source_glasses_rejected(
        fuser: FaceFuser, samples: dict[str, Sample], kind: FrameKind) -> None:
    """By default glasses are regions, not colour outliers."""
    on, off = FuseOptions(), FuseOptions(glasses=False)
    for s, t, donor in PAIRS:
        kept, _ = glasses_survival_trial(fuser, samples[s], samples[t], kind, samples[donor],
                                         on)
        leak, _ = glasses_leak_trial(fuser, samples[s], samples[t], kind, samples[donor], on)
        # (The 60-px astronaut's metal frame is the worst: 0.74 before the rims were
        # followed under the brows.)
        assert kept >= 0.95, (s, t, kind, kept)
        assert leak <= 0.1, (s, t, kind, leak)
        kept_off, _ = glasses_survival_trial(fuser, samples[s], samples[t], kind,
                                             samples[donor], off)
        assert kept_off < kept, (s, t, kind, kept_off, kept)


#: (A moustache kept 0.82-0.84 and stubble 0.92-0.96 before a found region took the
#: nostrils' discs it touches and the holes it encloses.)
#: The least correlation of the hair's fine detail with the target's (hair_kept): the
#: hair is laid over the fused skin, whose tone and mouth are the source's (a
#: moustache's lower edge meets the source's lips: 0.58 on obama3).
KEPT = {"beard": 0.7, "moustache": 0.55, "stubble": 0.85}


def test_a_rim_is_followed_along_its_own_line_only() -> None:
    seed = np.zeros((30, 30), bool)
    seed[20, 5:12] = True  # a rim's piece the ridge test found
    lines = np.zeros_like(seed)
    lines[20, 12:25] = True  # the same dark line, where the zone does not look
    lines[5, 5:25] = True  # another line (a brow), not joined to the rim
    out = regions._followed(seed, lines)
    assert out[20, 12:25].all() and not out[5].any()
    assert not out[seed].any()  # only what ``lines`` holds


def test_a_found_region_takes_the_hair_of_the_nostrils_it_touches() -> None:
    found = np.zeros((40, 40), bool)
    found[20:30, 5:35] = True  # a moustache below the nose
    nostrils = np.zeros_like(found)
    nostrils[14:22, 8:14] = True  # a nostril's disc reaching into it
    nostrils[2:8, 28:34] = True  # one far from it
    hair = np.ones_like(found)
    out = regions._into_nostrils(found, nostrils, hair)
    assert out[14:22, 8:14].all() and out[found].all()
    assert not out[2:8, 28:34].any()
    # Only hair pixels join: a dark opening that is not hair-like stays out.
    hair[14:18, 8:14] = False
    assert not regions._into_nostrils(found, nostrils, hair)[14:18, 8:14].any()


def test_a_found_region_takes_the_holes_it_encloses_not_the_gaps_to_its_edge() -> None:
    zone = np.zeros((60, 60), bool)
    zone[10:50, 10:50] = True
    zone[26:34, 22:38] = False  # the lips: a hole of the zone
    found = zone.copy()
    found[15:19, 15:19] = False  # a hole inside the hair
    found[10:14, 30:34] = False  # a gap at the zone's outer edge
    found[34:37, 28:32] = False  # a gap the hair and the lips enclose
    found[38:49, 14:25] = False  # a hole larger than the limit
    out = regions._holes_filled(found, zone, 100)
    assert out[15:19, 15:19].all() and out[34:37, 28:32].all()
    assert not out[10:14, 30:34].any() and not out[38:49, 14:25].any()
    # A face cut by the image's border: a gap on the box's edge is not enclosed.
    cut = regions._holes_filled(found[:, 16:], zone[:, 16:], 100)
    assert not cut[15:19, :3].any()


#: (target wearing the hair, donor of its pixels): dark hair onto light skin and
#: onto dark, light brown onto dark.
HAIRLINES = [("biden", "obama"), ("obama2", "astronaut"), ("obama3", "obama"),
             ("astronaut", "obama")]


def _hairline_at_work(s: Sample, donor: Sample) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``s`` with the donor's hair across its outline (:func:`paste_hairline`) at the
    working scale: (image, landmarks, the hair's (h, w) bool footprint)."""
    hairy, fp = paste_hairline(s.image, s.landmarks, donor.image, donor.landmarks)
    img, lm, _ = _working(hairy, s.landmarks)
    fp_small = cv2.resize(fp.astype(np.float32), (img.shape[1], img.shape[0]),
                          interpolation=cv2.INTER_AREA) > 0.5
    return img, lm, fp_small


def test_scalp_hair_inside_the_outline_is_found(samples: dict[str, Sample]) -> None:
    """Hair reaching into the face outline from its upper edge (a hairline the mesh
    runs across) is found where it is, at the working scale."""
    for t, donor in HAIRLINES:
        img, lm, fp_small = _hairline_at_work(samples[t], samples[donor])
        found = regions.hairline_mask(img, lm) > 0
        assert found[fp_small].mean() >= 0.75, (t, found[fp_small].mean())
        # Nothing far from the outline's upper edge.
        inner = occlusion.grow(~face_outline_mask(lm, img.shape), regions.HAIRLINE_BAND
                               * eye_distance(lm) + 1.0)
        assert not (found & ~inner).any(), t


def test_a_sources_hair_inside_its_outline_is_rejected(
        samples: dict[str, Sample], monkeypatch: pytest.MonkeyPatch) -> None:
    """The source's occluders include its hair across the outline (grey temples on
    pale skin, which the colour-outlier mask takes for skin, came out as a pale
    smudge at the target's temples); the target's are found without it (its hair
    is kept by the occluder mask as before)."""
    for t, donor in HAIRLINES:
        img, lm, fp_small = _hairline_at_work(samples[t], samples[donor])
        found = regions.face_occluders(img, lm, hairline=True) > 0.5
        assert found[fp_small].mean() >= 0.75, (t, found[fp_small].mean())
    calls: list[bool] = []
    real = regions.hairline_mask

    def spy(img: np.ndarray, lm: np.ndarray) -> np.ndarray:
        calls.append(True)
        return real(img, lm)

    monkeypatch.setattr(regions, "hairline_mask", spy)
    src, tgt = samples["biden"], samples["astronaut"]
    ClassicSwapper(cache_sources=False).render(src.image, src.faces[0], tgt.image,
                                               tgt.faces[0], FuseOptions(evaluate=False))
    assert len(calls) == 1  # the source's side only
