"""Fusion trials on synthetic variants: one figure and the output image each.

Shared by the tests and ``bench/fuse_quality.py``. Every trial fuses with the
given options at degree 100 on already-analysed sample faces. An image with an
occluder pasted keeps its clean analysis (the occluder does not move the face;
what is measured is the masks, not the landmarker's robustness to occlusion); a
relit image is analysed again, as a user's photo would be.

* :func:`survival_trial` — an occluder over the target: the share of its pixels
  (inside the face) left unchanged; goal ≥ 0.95.
* :func:`leak_trial` — an occluder over the source: the share of it that reaches
  the output; goal ≤ 0.05.
* :func:`lighting_trial` — a source lit by a known horizontal gradient: the share
  of that gradient left on the output face (0 = the target's lighting, 1 = the
  source's carried over whole).
* :func:`background_trial` — the source's background repainted flat: the share
  of the output's changed pixels that change again (0 = no pixel of the output
  comes from beyond the source's face).
* :func:`facial_hair_survival_trial`, :func:`facial_hair_leak_trial`,
  :func:`glasses_survival_trial`, :func:`glasses_leak_trial` — the same for a
  beard, moustache or stubble of real scalp hair and for clear glasses
  (:mod:`facefuse.toolchain.synthetic`); the hair's leak also in grey levels of
  darkening of the clean-shaven target's beard zone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from facefuse.faces.types import Face
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.swappers.classic.regions import beard_zone
from facefuse.fusion.types import FuseOptions
from facefuse.toolchain.measures import (
    face_outline_mask,
    gradient_slope,
    hair_kept,
    occluder_leak,
    occluder_survival,
)
from facefuse.toolchain.synthetic import (
    FacialHairKind,
    FrameKind,
    OccluderKind,
    facial_hair_alpha,
    paste_facial_hair,
    paste_glasses,
    paste_occluder,
    relight_gradient,
)

#: The engine without relighting, occluder masks and the symmetric fill: the
#: "before" of comparisons.
BEFORE = FuseOptions(relight=False, reject_source_occluders=False, keep_target_occluders=False,
                     symmetric_fill=False)
AFTER = FuseOptions()
#: The defaults with facial hair and glasses found as regions.
REGIONS = FuseOptions(glasses=True, facial_hair="both")
#: Gain slope of the synthetic gradient, per eye distance.
GRADIENT_STRENGTH = 0.35


@dataclass(frozen=True)
class Sample:
    """An image (H, W, 3) uint8 and its analysed faces, largest first."""

    image: np.ndarray
    faces: list[Face]

    @property
    def landmarks(self) -> np.ndarray:
        lm = self.faces[0].landmarks
        assert lm is not None
        return lm.astype(np.float64)


def _degree_100(options: FuseOptions) -> FuseOptions:
    return dataclasses.replace(options, degree=100.0, shape=None, texture=None, evaluate=False)


def fuse_sample(fuser: FaceFuser, src: Sample, tgt: Sample, options: FuseOptions) -> np.ndarray:
    """``src``'s first face fused into ``tgt``'s first at degree 100 with ``options``
    otherwise: the output image (H, W, 3) uint8."""
    r = fuser.fuse_faces(src.image, src.faces[0], tgt.image, tgt.faces, [0],
                         _degree_100(options))
    return r.image


def _reanalysed(fuser: FaceFuser, image: np.ndarray) -> Sample | None:
    faces = fuser.analyser.analyse(image, embed=False)
    return Sample(image, faces) if faces else None


def survival_trial(fuser: FaceFuser, src: Sample, tgt: Sample, kind: OccluderKind,
                   donor: Sample, options: FuseOptions, seed: int = 0
                   ) -> tuple[float, np.ndarray]:
    """(survival, output) of fusing ``src`` into ``tgt`` with an occluder over
    ``tgt``'s face."""
    occluded, fp = paste_occluder(tgt.image, tgt.landmarks, kind, donor.image,
                                  donor.landmarks, seed)
    out = fuse_sample(fuser, src, Sample(occluded, tgt.faces), options)
    return occluder_survival(out, occluded, fp, tgt.landmarks), out


def leak_trial(fuser: FaceFuser, src: Sample, tgt: Sample, kind: OccluderKind,
               donor: Sample, options: FuseOptions, seed: int = 0
               ) -> tuple[float, np.ndarray]:
    """(leak, output) of fusing ``src`` with an occluder over its face into ``tgt``
    (compared with fusing the clean ``src``)."""
    occluded, fp = paste_occluder(src.image, src.landmarks, kind, donor.image,
                                  donor.landmarks, seed)
    out = fuse_sample(fuser, Sample(occluded, src.faces), tgt, options)
    clean = fuse_sample(fuser, src, tgt, options)
    return occluder_leak(out, clean, tgt.image, fp, src.landmarks, tgt.landmarks), out


def lighting_trial(fuser: FaceFuser, src: Sample, tgt: Sample, options: FuseOptions,
                   strength: float = GRADIENT_STRENGTH) -> tuple[float, np.ndarray] | None:
    """(share of the gradient left, output) of fusing ``src`` lit by a known
    horizontal gradient into ``tgt``, against fusing the evenly lit ``src``."""
    lit = relight_gradient(src.image, src.landmarks, strength)
    src_lit = _reanalysed(fuser, lit)
    if src_lit is None:
        return None
    r = fuser.fuse_faces(src.image, src.faces[0], tgt.image, tgt.faces, [0],
                         _degree_100(options))
    out = fuse_sample(fuser, src_lit, tgt, options)
    x0, y0, x1, y1 = r.fused[0].region
    where = np.zeros(tgt.image.shape[:2], bool)
    where[y0:y1, x0:x1] = r.fused[0].mask >= 0.9
    src_where = face_outline_mask(src.landmarks, src.image.shape)
    applied = gradient_slope(lit, src.image, src_where, src.landmarks)
    left = gradient_slope(out, r.image, where, tgt.landmarks)
    return left / applied if applied else 0.0, out


#: Output pixels differing by more than this between the two background trials count.
BACKGROUND_THRESHOLD = 25
#: The flat colour the source's background is repainted with.
FLAT_BACKGROUND = (0, 255, 0)


def background_trial(fuser: FaceFuser, src: Sample, tgt: Sample, options: FuseOptions
                     ) -> tuple[float, np.ndarray]:
    """(share, output): fuse ``src`` into ``tgt``, then repaint everything of the
    source outside its face outline with a flat colour and fuse again; the share
    of the pixels the first fusion changed that differ by more than
    :data:`BACKGROUND_THRESHOLD` between the two (0 = the output does not depend
    on the source's background)."""
    first = fuse_sample(fuser, src, tgt, options)
    flat = src.image.copy()
    flat[~face_outline_mask(src.landmarks, flat.shape)] = FLAT_BACKGROUND
    second = fuse_sample(fuser, Sample(flat, src.faces), tgt, options)
    changed = np.abs(first.astype(np.int16) - tgt.image.astype(np.int16)).max(-1) > 0
    if not changed.any():
        return 0.0, second
    diff = np.abs(first.astype(np.int16) - second.astype(np.int16)).max(-1)
    return float((diff[changed] > BACKGROUND_THRESHOLD).mean()), second


def _luma(img: np.ndarray) -> np.ndarray:
    out: np.ndarray = img.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    return out


def facial_hair_survival_trial(fuser: FaceFuser, src: Sample, tgt: Sample,
                               kind: FacialHairKind, donor: Sample, options: FuseOptions,
                               seed: int = 0) -> tuple[float, np.ndarray]:
    """(kept share, output) of fusing ``src`` into ``tgt`` wearing the donor's hair
    as a beard, moustache or stubble: how much of the hair is kept strand for
    strand (:func:`hair_kept`)."""
    hairy, fp = paste_facial_hair(tgt.image, tgt.landmarks, kind, donor.image,
                                  donor.landmarks, seed)
    out = fuse_sample(fuser, src, Sample(hairy, tgt.faces), options)
    return hair_kept(out, hairy, fp, tgt.landmarks), out


def facial_hair_leak_trial(fuser: FaceFuser, src: Sample, tgt: Sample, kind: FacialHairKind,
                           donor: Sample, options: FuseOptions, seed: int = 0
                           ) -> tuple[float, float, float, np.ndarray]:
    """(leaked share, darkening, darkening against the target, output) of fusing
    ``src`` wearing the donor's hair into the clean-shaven ``tgt``.

    Over the target's beard zone (:func:`facefuse.fusion.swappers.classic.regions.beard_zone`, where
    the source's hair lands): the darkening is the mean luma (grey levels) the
    hair takes off the output against fusing the clean ``src``, and the mean the
    output is darker than the target itself. The leaked share is the mean luma
    change, in the hair's direction (darker for dark hair), where the hair lands
    on the target (the same mesh zone, :func:`facial_hair_alpha`), over the mean
    change the hair made on the source's own face (0 = none of it came along, 1 =
    all of it; the target's own skin showing where the hair was rejected changes
    the output both ways and mostly cancels)."""
    hairy, fp = paste_facial_hair(src.image, src.landmarks, kind, donor.image,
                                  donor.landmarks, seed)
    out = fuse_sample(fuser, Sample(hairy, src.faces), tgt, options)
    clean = fuse_sample(fuser, src, tgt, options)
    zone = beard_zone(tgt.landmarks, tgt.image.shape[:2])
    # Where the source's hair lands: the same zone of the mesh on the target.
    lands = facial_hair_alpha(tgt.landmarks, tgt.image.shape[:2], kind) > 0.5
    if not fp.any() or not zone.any() or not lands.any():
        return 0.0, 0.0, 0.0, out
    applied = float((_luma(src.image)[fp] - _luma(hairy)[fp]).mean())
    change = _luma(clean) - _luma(out)
    darker = float(change[zone].mean())
    against = float((_luma(tgt.image)[zone] - _luma(out)[zone]).mean())
    leak = max(0.0, float(change[lands].mean()) / applied) if abs(applied) > 0 else 0.0
    return min(1.0, leak), darker, against, out


def glasses_survival_trial(fuser: FaceFuser, src: Sample, tgt: Sample, kind: FrameKind,
                           donor: Sample, options: FuseOptions, seed: int = 0
                           ) -> tuple[float, np.ndarray]:
    """(kept share, output) of fusing ``src`` into ``tgt`` wearing clear glasses
    (:func:`paste_glasses`): the share of the frame's pixels inside the face left
    unchanged."""
    worn, fp = paste_glasses(tgt.image, tgt.landmarks, kind, donor.image, donor.landmarks, seed)
    out = fuse_sample(fuser, src, Sample(worn, tgt.faces), options)
    return occluder_survival(out, worn, fp, tgt.landmarks), out


def glasses_leak_trial(fuser: FaceFuser, src: Sample, tgt: Sample, kind: FrameKind,
                       donor: Sample, options: FuseOptions, seed: int = 0
                       ) -> tuple[float, np.ndarray]:
    """(leak, output) of fusing ``src`` wearing clear glasses into ``tgt``
    (:func:`occluder_leak` against fusing the clean ``src``)."""
    worn, fp = paste_glasses(src.image, src.landmarks, kind, donor.image, donor.landmarks, seed)
    out = fuse_sample(fuser, Sample(worn, src.faces), tgt, options)
    clean = fuse_sample(fuser, src, tgt, options)
    return occluder_leak(out, clean, tgt.image, fp, src.landmarks, tgt.landmarks), out
