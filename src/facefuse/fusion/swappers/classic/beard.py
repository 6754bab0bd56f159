"""A target's facial hair laid over the fused face, never kept as its pixels.

Kept as pixels, a stubbled or bearded target kept its whole lower face — its
mouth, chin and jaw — and with them its identity. Here the hair found
(:func:`facefuse.fusion.swappers.classic.regions.facial_hair_regions`) is read as
the target photo over its own skin without the hair (the hair filled from the skin
around it, as a source's occluders are: :mod:`.skin_fill`), a gain per channel, and
the fused face is multiplied by it: every strand stays where it was at full
resolution, and the source's skin and mouth show between the strands.

Images (H, W, 3) float32 0..255 at the face region's full resolution unless said;
masks (H, W) float32 in [0, 1].
"""

from __future__ import annotations

import cv2
import numpy as np

from facefuse.fusion import mask as masks
from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.swappers.classic import detail, skin_fill
from facefuse.fusion.swappers.classic import occlusion as occ
from facefuse.imaging.channels import each_channel

#: Bounds on the target's facial hair's shading of its own skin (the photo over its
#: shaved estimate, per channel): a dark beard darkens it, fair or grey hairs on
#: darker skin brighten it.
HAIR_SHADE = (0.05, 3.0)
#: σ of the facial hair's mask's feather, in working pixels.
HAIR_FEATHER = 1.0
#: σ (eye distances) over which the fused skin under the hair takes the target's own
#: skin tone there, and the bounds on that gain.
HAIR_TONE_SIGMA = 0.08
HAIR_TONE = (0.5, 2.0)
#: σ (eye distances) of the blur that takes the fused layer's own fine detail out
#: under the hair (the photo's hair and skin detail replace it).
HAIR_DETAIL = 0.015


def lay_over(face: np.ndarray, frame: detail.Scaled, tgt_img: np.ndarray,
             tgt_lm: np.ndarray, hair: np.ndarray, fused: np.ndarray, dst: np.ndarray,
             feather: float, strength: float) -> None:
    """Lay the target's facial hair over the fused ``face`` (H, W, 3) float32 at the
    region's full resolution, in place: where ``hair`` (h, w, working scale) is,
    the face takes the target's own skin tone there (its skin without the hair,
    filled from the skin around it, :func:`skin_fill.fill_from_skin`, over the
    working-scale ``fused`` layer (h, w, 3), both low-passed) and is multiplied by
    the target photo over that skin. The hair stays exactly where it is, strand for
    strand at full resolution, and the skin and the mouth under it are the
    source's: stubble shades the new jaw, a dense beard keeps its colour, and the
    fused lips are left out. ``tgt_lm`` (N, 3) the target's working landmarks;
    ``dst`` (N, 3) the fused mesh in the region's full-resolution frame;
    ``feather`` pixels there; ``strength`` in [0, 1] the share laid over (the
    texture weight: at degree 1 the face is nearly the target's own, beard and all)."""
    d = eye_distance(tgt_lm)
    outline = occ.outline_mask(tgt_lm, tgt_img.shape)
    shaved: np.ndarray = skin_fill.fill_from_skin(
        tgt_img, skin_fill.covered(hair, d), occ.readable_skin(tgt_img, tgt_lm, outline),
        d).astype(np.float32)
    weight: np.ndarray = strength * cv2.GaussianBlur(skin_fill.covered(hair, d), (0, 0),
                                                     HAIR_FEATHER)
    core: np.ndarray = strength * cv2.GaussianBlur(hair, (0, 0), HAIR_FEATHER)
    sigma = max(1.0, HAIR_TONE_SIGMA * d)
    tone: np.ndarray = np.clip((cv2.GaussianBlur(shaved, (0, 0), sigma) + 1.0)
                               / (cv2.GaussianBlur(fused, (0, 0), sigma) + 1.0),
                               *HAIR_TONE).astype(np.float32)
    if frame.small != frame.size:
        shaved = cv2.resize(shaved, frame.size, interpolation=cv2.INTER_LINEAR)
        weight = cv2.resize(weight, frame.size, interpolation=cv2.INTER_LINEAR)
        core = cv2.resize(core, frame.size, interpolation=cv2.INTER_LINEAR)
        tone = cv2.resize(tone, frame.size, interpolation=cv2.INTER_LINEAR)
    h, w = face.shape[:2]
    weight *= 1.0 - masks.lips_mask(dst, (0, 0, w, h), feather)
    weight[weight < 1e-3] = 0.0
    window = detail.nonzero_window(weight, (1.0, 1.0), (w, h))
    if window is None:
        return
    x0, y0, x1, y1 = window
    photo = frame.full[y0:y1, x0:x1].astype(np.float32)
    shade = np.clip((photo + 1.0) / (shaved[y0:y1, x0:x1] + 1.0), *HAIR_SHADE)
    shade *= tone[y0:y1, x0:x1]
    under = face[y0:y1, x0:x1]
    # The fine detail under the hair itself is the photo's (its strands and the skin
    # between them), not the fused layer's as well: there the layer is taken smooth.
    fine = max(0.5, HAIR_DETAIL * d / min(frame.ratio))
    smooth = cv2.GaussianBlur(under, (0, 0), fine)
    smooth -= under
    smooth *= each_channel(core[y0:y1, x0:x1])
    smooth += under
    shade *= smooth
    shade -= under
    shade *= each_channel(weight[y0:y1, x0:x1])
    under += shade
