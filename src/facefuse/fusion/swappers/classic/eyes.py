"""The fused face's eyes: the target's own eyeballs with the source's iris colour.

Inside the lid contours the layer is the target's (its opening, gaze, catchlights
and lashes are expression and scene, and a squinting or side-glancing source
squeezed into the target's opening reads as a cloudy, wandering eye). What the
source gives there is the colour of its irises: its hue at the target iris's own
luma texture, with one luma gain for the two faces' light and the photos' light
colour taken out and put in (read on the eye whites; each face's irises and whites
read at full resolution in its own image, both eyes pooled), applied at the
layer's own scale to the target's iris pixels.

Landmarks are (478, 3) float pixels with the iris points; images (h, w, 3)
float32 0-255 in the frame of those landmarks.
"""

from __future__ import annotations

import cv2
import numpy as np

from facefuse.faces import topology as topo
from facefuse.fusion import mask as masks
from facefuse.fusion.carry import IrisReading
from facefuse.fusion.geometry import eye_groups
from facefuse.fusion.swappers.classic.detail import LUMA
from facefuse.imaging.channels import each_channel
from facefuse.imaging.stats import median

#: The iris colour is measured on this annulus (fractions of the iris radius):
#: outside the pupil, inside the dark limbal ring and the lids' shadow.
SAMPLE_RING = (0.45, 0.85)
#: Fewest pixels of an iris (in the aperture) to measure its colour; a closed or
#: nearly closed eye gives fewer, and the target's colour is kept there.
MIN_SAMPLES = 12
#: Annulus pixels at least this much darker than the skin under the eye (ratio of
#: the channels' means) are iris: the lids, the sclera and the catchlights are brighter.
IRIS_OF_SKIN = 0.5
#: Where too few are (light eyes on dark skin: a blue or grey iris is brighter than
#: half the skin), the annulus pixels whose chromaticity lies at least this far
#: from the skin's (r, g, b shares; the lids are skin-coloured, a blue or grey iris
#: is not) and whose luma is at most HIGHLIGHT_RAMP[1] times their median (the
#: catchlights and the sclera are brighter) are the iris.
LIGHT_IRIS_CHROMA = 0.06
#: The skin under an eye that sets its light: (inset from the eye's left, from its
#: right), (top, bottom) below its lower lid, in eye widths along its own axis; and
#: the grid of points read there (along, below).
UNDER_EYE = ((0.15, 0.15), (0.15, 0.45))
UNDER_EYE_GRID = (12, 6)
#: Fewest iris pixels as a share of the annuli's pixels the openings show: a
#: squint the landmarks do not follow shows lid skin, not iris, there.
MIN_SEEN = 0.15
#: An eye whose lids' opening is smaller than this share of its iris disc is shut.
MIN_OPEN = 0.15
#: The luma weights (RGB), in float64 for the colours measured here.
_LUMA = LUMA.astype(np.float64)
#: Bounds of the iris's luma gain (a light iris made dark, a dark one light).
GAIN_RANGE = (0.4, 2.5)
#: The eye white is read in the lids' opening beyond this many iris radii from the
#: iris's centre (clear of the limbus), on its pixels between these percentiles of
#: luma (above the lashes' and the corners' shadow, below the catchlights).
SCLERA_BEYOND = 1.15
SCLERA_PERCENTILES = (60.0, 97.0)
#: Bounds of the light-colour correction per channel (the ratio of the two faces'
#: eye-white chromaticities): the eye white is the same tissue on every face, so
#: what differs between two photos' is mostly their light (a scan's yellow cast, a
#: warm lamp); beyond these the whites themselves differ (a red eye, a shadow).
LIGHT_COLOUR_RANGE = (0.85, 1.18)
#: Pixels this many times brighter than the iris's median are not iris (its
#: catchlights, or the sclera where the landmarks' disc overshoots the limbus):
#: they keep their own colour (ramp from the first to the second factor).
HIGHLIGHT_RAMP = (1.15, 1.6)


def iris_circle(landmarks: np.ndarray, iris: tuple[int, ...]) -> tuple[np.ndarray, float]:
    """(centre (2,), radius px) of an iris from its five landmarks (centre first)."""
    centre = landmarks[iris[0], :2]
    radius = float(np.linalg.norm(landmarks[list(iris[1:]), :2] - centre, axis=1).mean())
    return centre, radius


def _distance(shape: tuple[int, int], centre: np.ndarray) -> np.ndarray:
    """(h, w) float32 distance of each pixel centre to ``centre`` (x, y)."""
    yy, xx = np.mgrid[0:shape[0], 0:shape[1]].astype(np.float32)
    out: np.ndarray = np.hypot(xx - np.float32(centre[0]), yy - np.float32(centre[1]))
    return out


def _box(lo: np.ndarray, hi: np.ndarray, reach: int, size: tuple[int, int]
         ) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1): the pixels within ``reach`` of the points' box ``lo``..``hi``
    (x, y), clipped to an image of ``size`` (w, h); None when nothing is left."""
    w, h = size
    x0, y0 = max(0, int(lo[0]) - reach), max(0, int(lo[1]) - reach)
    x1, y1 = min(w, int(hi[0]) + reach + 1), min(h, int(hi[1]) + reach + 1)
    return None if x1 <= x0 or y1 <= y0 else (x0, y0, x1, y1)


def _annulus(centre: np.ndarray, radius: float, size: tuple[int, int]
             ) -> tuple[tuple[int, int, int, int], np.ndarray] | None:
    """The iris annulus (:data:`SAMPLE_RING`) of an image of ``size`` (w, h): its
    bounding box (x0, y0, x1, y1) and (h, w) bool over that box; None off the image."""
    box = _box(centre, centre, int(np.ceil(SAMPLE_RING[1] * radius)) + 1, size)
    if box is None:
        return None
    x0, y0, x1, y1 = box
    d = _distance((y1 - y0, x1 - x0), centre - np.array([x0, y0]))
    return box, (d >= SAMPLE_RING[0] * radius) & (d <= SAMPLE_RING[1] * radius)


def _iris_pixels(image: np.ndarray, landmarks: np.ndarray, eye: tuple[tuple[int, ...], ...],
                 skin: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """One eye's iris pixels (K, 3) in ``image`` (h, w, 3): its annulus inside the
    lids' opening (the lid contour of ``eye`` = (contour, iris), filled over the
    annulus's box only: the same opening on both faces of a pair), the pixels
    darker than :data:`IRIS_OF_SKIN` × the ``skin`` colour's (3,) mean (a lid over
    the iris — a squint the landmarks do not follow —, the sclera, the catchlights
    are brighter); the annulus's pixels the opening shows (M, 3), and how many."""
    contour, iris = eye
    centre, radius = iris_circle(landmarks, iris)
    lids = np.asarray(landmarks[list(contour), :2], np.float32)
    found = _annulus(centre, radius, (image.shape[1], image.shape[0]))
    if found is None or cv2.contourArea(lids) < MIN_OPEN * np.pi * radius * radius:
        nothing = np.zeros((0, 3), np.float32)
        return nothing, nothing, 0
    box, ring = found
    x0, y0, x1, y1 = box
    seen = ring & masks.inside_contour(landmarks, contour, box)
    pixels = image[y0:y1, x0:x1][seen]
    return (pixels[pixels.mean(1) < IRIS_OF_SKIN * float(skin.mean())], pixels,
            int(seen.sum()))


def _light_iris(pixels: np.ndarray, skin: np.ndarray) -> np.ndarray:
    """The iris among an annulus's open ``pixels`` (M, 3) by colour, not darkness
    (:data:`LIGHT_IRIS_CHROMA`): those unlike the ``skin`` (3,) in chromaticity,
    without the brightest (catchlights, sclera)."""
    p = pixels.astype(np.float64)
    share = (p + 1.0) / (p + 1.0).sum(1, keepdims=True)
    own = (skin + 1.0) / float((skin + 1.0).sum())
    iris: np.ndarray = p[np.linalg.norm(share - own, axis=1) >= LIGHT_IRIS_CHROMA]
    if len(iris) == 0:
        return iris.astype(np.float32)
    luma = iris @ _LUMA
    out: np.ndarray = iris[luma <= HIGHLIGHT_RAMP[1] * float(np.median(luma))]
    return out.astype(np.float32)


def _sclera_pixels(image: np.ndarray, landmarks: np.ndarray,
                   eye: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """One eye's white (K, 3): the pixels of its lids' opening (the contour of
    ``eye`` = (contour, iris)) beyond :data:`SCLERA_BEYOND` iris radii from the
    iris's centre, on the image."""
    contour, iris = eye
    centre, radius = iris_circle(landmarks, iris)
    pts = np.asarray(landmarks[list(contour), :2], np.float64)
    box = _box(pts.min(0), pts.max(0), 1, (image.shape[1], image.shape[0]))
    if box is None:
        return np.zeros((0, 3), np.float32)
    x0, y0, x1, y1 = box
    opening = masks.inside_contour(landmarks, contour, box)
    beyond = _distance((y1 - y0, x1 - x0), centre - np.array([x0, y0])) > SCLERA_BEYOND * radius
    out: np.ndarray = image[y0:y1, x0:x1][opening & beyond]
    return out


def _sclera(image: np.ndarray, landmarks: np.ndarray) -> np.ndarray | None:
    """The median colour (3,) of both eye whites (:func:`_sclera_pixels`, between
    :data:`SCLERA_PERCENTILES` of luma), None where fewer than :data:`MIN_SAMPLES`
    pixels show."""
    pixels = np.concatenate([_sclera_pixels(image, landmarks, eye)
                             for eye in eye_groups(landmarks)]).astype(np.float64)
    if len(pixels) < MIN_SAMPLES:
        return None
    luma = pixels @ _LUMA
    lo, hi = np.percentile(luma, SCLERA_PERCENTILES)
    white = pixels[(luma >= lo) & (luma <= hi)]
    if len(white) < MIN_SAMPLES:
        return None
    return np.asarray(median(white, axis=0))


def _under_eye(image: np.ndarray, landmarks: np.ndarray, contour: tuple[int, ...]
               ) -> np.ndarray:
    """Pixels (K, 3) of the skin under an eye: a grid over :data:`UNDER_EYE` (in eye
    widths along and below the eye's own axis, so a rolled face reads the same
    skin), those on the image."""
    pts = landmarks[list(contour), :2].astype(np.float64)
    centre = pts.mean(0)
    along = np.linalg.svd(pts - centre, full_matrices=False)[2][0]
    down = np.array([-along[1], along[0]])
    mouth = landmarks[list(topo.MOUTH_CORNERS), :2].mean(0)
    if (mouth - centre) @ down < 0:
        down = -down
    u, v = (pts - centre) @ along, (pts - centre) @ down
    width = float(u.max() - u.min())
    (left, right), (top, bottom) = UNDER_EYE
    su = np.linspace(u.min() + left * width, u.max() - right * width, UNDER_EYE_GRID[0])
    sv = v.max() + width * np.linspace(top, bottom, UNDER_EYE_GRID[1])
    grid = centre + su[None, :, None] * along + sv[:, None, None] * down
    xy = np.rint(grid.reshape(-1, 2)).astype(np.int64)
    h, w = image.shape[:2]
    on = (xy[:, 0] >= 0) & (xy[:, 0] < w) & (xy[:, 1] >= 0) & (xy[:, 1] < h)
    out: np.ndarray = image[xy[on, 1], xy[on, 0]].reshape(-1, 3)
    return out


def iris_colour(image: np.ndarray, landmarks: np.ndarray) -> IrisReading | None:
    """The median colours (3,) of a face's irises (both eyes' pixels pooled,
    :func:`_iris_pixels`: one colour, so the two eyes never differ), of the skin
    under its eyes and of its eye whites (:func:`_sclera`), in ``image`` (h, w, 3)
    with its ``landmarks``
    (478 points, at the image's own resolution: a small working copy leaves an
    iris a few pixels wide); the iris read by darkness, or where too few pixels are
    dark enough (a light iris on dark skin), by colour (:func:`_light_iris`).
    None where fewer than :data:`MIN_SAMPLES` iris pixels,
    or fewer than :data:`MIN_SEEN` of the annuli's open pixels, are seen (closed or
    squinting eyes), or the skin is off the image."""
    if len(landmarks) < 478:
        return None
    groups = eye_groups(landmarks)
    under = np.concatenate([_under_eye(image, landmarks, contour) for contour, _ in groups])
    if len(under) < MIN_SAMPLES:
        return None
    skin = median(under, axis=0)
    found = [_iris_pixels(image, landmarks, eye, skin) for eye in groups]
    pixels = np.concatenate([p for p, _, _ in found])
    seen = sum(n for _, _, n in found)
    enough = max(MIN_SAMPLES, MIN_SEEN * seen)
    if len(pixels) < enough:
        # Light eyes on dark skin: too few are darker than the skin's half.
        pixels = _light_iris(np.concatenate([a for _, a, _ in found]), skin)
        if len(pixels) < enough:
            return None
    return IrisReading(median(pixels, axis=0), skin, _sclera(image, landmarks))


def light_colour(src: np.ndarray | None, tgt: np.ndarray | None) -> np.ndarray:
    """(3,) float64: what a colour seen in the source's light is multiplied by to be
    seen in the target's — the ratio of the eye whites' (``src``, ``tgt`` (3,) or
    None) chromaticities (each colour over its luma), per channel within
    :data:`LIGHT_COLOUR_RANGE`; ones where either white is unknown."""
    if src is None or tgt is None:
        return np.ones(3)
    s, t = src + 1.0, tgt + 1.0
    ratio = (t / float(t @ _LUMA)) / (s / float(s @ _LUMA))
    out: np.ndarray = np.clip(ratio, *LIGHT_COLOUR_RANGE)
    return out


def iris_gains(src: IrisReading | None, tgt: IrisReading | None) -> list[np.ndarray | None]:
    """Per eye (image-left, image-right), the colour (3,) an iris pixel of the target
    takes per unit of its own luma (None: not measurable, keep the target's); the
    same for both eyes.

    ``src``, ``tgt``: each face's :func:`iris_colour`, read in its own image at
    full resolution with its own landmarks: the source's iris inside its own lids'
    opening (a squinting source stretched onto the target's opening shows its lids
    there), the target's inside its own (the eyes move rigidly onto the fused
    mesh). The colour is the source iris's chromaticity (``src_iris /
    Y(src_iris)``) times a luma gain ``Y(src_iris) / Y(tgt_iris) · Y(tgt_skin) /
    Y(src_skin)`` bounded to :data:`GAIN_RANGE`: the source's iris in the target's
    light (the skins' luma under the eyes), its hue its own but for the two
    photos' light colour (:func:`light_colour`, read on the eye whites: a scanned
    photo's yellow cast made amber eyes olive on a neutral photo). (Multiplying
    the target's channels by the source's over the target's, or the skins' ratio
    per channel, turned a dark source's brown iris navy on a fair target's amber
    one: skins differ in their own colour, eye whites little.)
    """
    if src is None or tgt is None:
        return [None, None]
    light = (float(tgt.skin @ _LUMA) + 1.0) / (float(src.skin @ _LUMA) + 1.0)
    colour = src.iris + 1.0
    # No iris is magenta (green below both red and blue): a photo's tinted light
    # makes one so (obama3's brown eyes read [36, 23.5, 31]). Read in the source's
    # own light: a reddish one is brown (blue lowered to green), a bluish one grey
    # or blue (green raised to red). (Raising green always turned obama3's brown a
    # cool grey, which a neutral target's light then showed blue-grey.)
    if colour[1] < min(colour[0], colour[2]):
        if colour[0] >= colour[2]:
            colour[2] = colour[1]
        else:
            colour[1] = colour[0]
    adapted = colour * light_colour(src.sclera, tgt.sclera)
    colour = adapted * (float(colour @ _LUMA) / float(adapted @ _LUMA))
    y_src, y_tgt = float(colour @ _LUMA), float(tgt.iris @ _LUMA) + 1.0
    gain = float(np.clip(y_src * light / y_tgt, *GAIN_RANGE))
    out = (colour / y_src * gain).astype(np.float32)
    return [out, out]


def recolour_irises(layer: np.ndarray, dst: np.ndarray, gains: list[np.ndarray | None],
                    weight: float, feather: float) -> None:
    """Give the target's irises in ``layer`` (h, w, 3, in place) the source's colour.

    ``dst``: the fused mesh in ``layer``'s frame; ``gains`` from :func:`iris_gains`
    (a colour per unit of luma); ``weight`` in [0, 1] the texture weight;
    ``feather`` px the face's feather width at this scale. Each pixel of an iris's
    disc (soft by a tenth of its radius) inside the lids' opening becomes its own
    luma times that colour (the target's iris texture, the source's hue), its
    catchlights left as they are.
    """
    if weight <= 0.0 or len(dst) < 478 or all(g is None for g in gains):
        return
    h, w = layer.shape[:2]
    irises = [(iris_circle(dst, iris), gain) for (_, iris), gain in zip(eye_groups(dst), gains,
                                                                 strict=True)
              if gain is not None]
    # One box over both irises: the lids' openings are drawn once.
    reach = max(int(np.ceil(1.2 * r)) + 2 for (_, r), _ in irises)
    cs = np.array([c for (c, _), _ in irises])
    both = _box(cs.min(0), cs.max(0), reach, (w, h))
    if both is None:
        return
    x0, y0, x1, y1 = both
    origin = np.array([x0, y0])
    aperture = masks.eyes_mask(dst - np.array([x0, y0, 0.0]), (0, 0, x1 - x0, y1 - y0),
                               feather)
    for (centre, radius), gain in irises:
        c = centre - origin
        one = _box(c, c, reach, (x1 - x0, y1 - y0))
        if one is None:
            continue
        bx0, by0, bx1, by1 = one
        box = layer[y0 + by0:y0 + by1, x0 + bx0:x0 + bx1]
        opening = aperture[by0:by1, bx0:bx1]
        d = _distance(box.shape[:2], c - np.array([bx0, by0]))
        soft = max(0.5, 0.1 * radius)
        disc = np.clip((radius - d) / soft + 0.5, 0.0, 1.0)
        luma = box.mean(2)
        inside = (disc > 0.5) & (opening > 0.5)
        if not inside.any():
            continue
        lo, hi = (f * float(median(luma[inside])) for f in HIGHLIGHT_RAMP)
        spare = np.clip((luma - lo) / max(1e-3, hi - lo), 0.0, 1.0)
        share = each_channel(weight * disc * opening * (1.0 - spare))
        # Each pixel takes the source's hue at its own luma times the gain: the
        # target iris's texture stays, its hue goes.
        box += share * (each_channel(box @ LUMA) * gain - box)
