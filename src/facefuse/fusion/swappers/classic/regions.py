"""Facial hair and glasses as regions of a face, found from the mesh geometry and
the face's own skin (no model).

Colour outliers alone miss them: stubble and a thin moustache differ little from
skin pixel by pixel and break into islands smaller than the occluder rule keeps,
and a thin frame is a line a pixel or two wide. Here each is looked for only
where it can be, and judged as a region:

* **Facial hair** (:func:`facial_hair_mask`): inside the beard zone (the upper
  lip, the chin and the jaw up the cheeks, from the mesh; the lips and nostrils
  cut out), pixels whose *chromaticity is greyer* than the face's own skin
  (measured on the upper face, which a beard does not reach, each side of the
  face against its own side's skin: a face lit from one side has a darker,
  greyer half), or that are darker than it *and* carry more fine, oriented
  texture energy (the structure tensor's trace of the high-pass luma, relative
  to the upper face's) — shading is darker but smooth and more saturated, hair
  is textured and less so —, or that are a little of both greyer and more
  textured (fair hair over dark skin, half of the skin showing through, is
  neither much greyer nor darker than the skin). The pixels are closed into
  regions (hair is strands with skin between); only regions that cover a good
  part of the philtrum or the chin's middle, on both sides of the midline, are
  facial hair (it grows there, on both sides; a smile fold or a shaded jaw lies
  on one, and the shadow under the nose is too small), and all of them together
  must exceed :data:`MIN_HAIR_AREA` of the face. Only the lower face's box is examined, at
  no more than :data:`HAIR_EYE_PX`.
* **Glasses** (:func:`glasses_mask`): thin dark ridges (a morphological
  black-hat, wider than a frame and narrower than a brow) in a ring around each
  eye, over the nose bridge and out to the temples, kept only as connected curves
  that wind around an eye by at least :data:`FRAME_MIN_SPAN` degrees (a wrinkle
  or a lid crease does not); within the rims found, bright and grey lens
  reflections join the mask.

* **Scalp hair at the outline** (:func:`hairline_mask`): the mesh's outline
  runs along the hairline, so a source's grey temples, sideburns or the ends of
  a fringe lie inside it; pixels of a band along the outline's upper edge judged
  as facial hair is (greyer than the skin, or darker and more textured), kept
  where they connect to the edge within the band.

:func:`face_occluders` is the union, on the face's crop, at the scale of the
occluder masks (:func:`facefuse.fusion.swappers.classic.occlusion.occluder_mask` with regions);
:func:`worn_regions` the two regions alone (they move with the face: a clip
finds them once and carries them over a few frames).

Images (H, W, 3) RGB uint8 or float 0..255; landmarks (N, 3) pixels in the same
frame; masks (H, W) float32 in {0, 1}.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import cv2
import numpy as np

from facefuse.faces import topology as topo
from facefuse.fusion import mask as masks
from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.swappers.classic import occlusion as occ
from facefuse.imaging.stats import median

#: Beard zone: below a top edge at this height (0 at the eyes, 1 at the mouth
#: line) in the face's middle, rising by BEARD_TOP_RISE at its sides.
BEARD_TOP = 0.62
BEARD_TOP_RISE = 0.3
#: Skin reference vertices lie above this height (eyes 0, mouth 1).
UPPER_FACE = 0.55
#: Each side of the face needs this many of them for a reference of its own.
SIDE_VERTICES = 6
#: A pixel greyer than the skin by this share of the way to grey is hair.
HAIR_GREYER = 0.3
#: ... or darker by this much (natural log of the luma ratio) and this much more
#: textured (natural log of the energy ratio).
HAIR_DARKER = 0.12
HAIR_TEXTURE = 1.0
#: ... or greyer by this share and more textured by this much: fair hair over
#: dark skin is neither much greyer nor darker than the skin, but a little of both
#: greyer and more textured.
HAIR_GREYISH = 0.18
HAIR_GREYISH_TEXTURE = 0.3
#: Hair is judged this many eye distances (beyond the lips' own margin) away
#: from the lips; a region found is then grown up to them.
LIP_MARGIN = 0.01
#: Scalp hair inside the face outline (a hairline, sideburns, a fringe's ends) is
#: looked for within HAIRLINE_BAND eye distances of the outline's edge, above
#: HAIRLINE_BOTTOM (eyes 0, mouth 1), the eyes and brows grown by HAIRLINE_CLEAR
#: left out.
HAIRLINE_BAND = 0.15
HAIRLINE_BOTTOM = 0.4
HAIRLINE_CLEAR = 0.05
#: Facial hair is looked for at no more than this eye distance (pixels).
HAIR_EYE_PX = 96.0
#: ... on the box of the face below this height (eyes 0, mouth 1), grown by
#: HAIR_BOX_MARGIN eye distances (the blurs' and closings' reach).
HAIR_BOX_TOP = 0.1
HAIR_BOX_MARGIN = 0.1
#: Facial-hair regions smaller than this share of the face's area are dropped
#: (specks of shading; the moustaches found cover 4% and more).
MIN_HAIR_AREA = 0.015
#: Holes a facial-hair region encloses of at most this many eye distances squared are
#: the region's.
HAIR_HOLE = 0.1
#: The philtrum (the upper lip's middle) and the chin's middle: |side| below
#: CORE_SIDE, the chin's from CHIN_CORE down (see :func:`_cores`). A facial-hair
#: region must cover at least CORE_COVER of one of their parts ...
CORE_SIDE = 0.3
CHIN_CORE = 1.2
CORE_COVER = 0.3
#: ... and together at least PART_COVER of each of its three parts (either side
#: of the midline beyond CORE_INNER, and its middle) and CORE_MEAN_COVER of them
#: on average (the parts' edges: a region reaches a little past where it ends,
#: through the features' blur and the closing).
PART_COVER = 0.3
CORE_MEAN_COVER = 0.63
CORE_INNER = 0.12
#: The face's midline over the philtrum (nose base, upper lip's middle) and the
#: chin (lower lip's middle, chin): mesh vertices.
_PHILTRUM_LINE = (topo.NOSE_BASE, 0)
_CHIN_LINE = (17, topo.CHIN)
#: Upper-lip polygon between the nostrils and the outer upper lip.
_UPPER_LIP = (98, 2, 327, 291, 409, 270, 269, 267, 0, 37, 39, 40, 185, 61)


_Axes = tuple[np.ndarray, np.ndarray, np.ndarray, float, float, float]


class _Frame:
    """A face's geometry on one image, computed once: its :func:`_face_axes`
    ``axes``; (H, W) each: height ``t`` (0 on the eye line, 1 on the mouth line,
    along the face's own down axis), side ``s`` (-1..1 across the face outline's
    width), ``midline`` (``s`` less the nose base's: 0 on the face's midline), the
    outline ``face`` (bool) and the feature masks ``feats``
    (:func:`facefuse.fusion.swappers.classic.occlusion.feature_masks`); the mesh's ``skin``
    vertices (:func:`facefuse.fusion.swappers.classic.occlusion.skin_vertices`, given or found)."""

    def __init__(self, lm: np.ndarray, shape: tuple[int, int],
                 skin: np.ndarray | None = None) -> None:
        self._lm, self._shape = lm, shape
        self.axes = _face_axes(lm)
        self.t, self.s = _axes(self.axes, shape)
        self.skin = occ.skin_vertices(lm) if skin is None else skin

    @functools.cached_property
    def midline(self) -> np.ndarray:
        mid, across, _, _, half, centre = self.axes
        nose = (float((self._lm[topo.NOSE_BASE, :2] - mid) @ across) - centre) / half
        out: np.ndarray = self.s - np.float32(nose)
        return out

    @functools.cached_property
    def face(self) -> np.ndarray:
        out: np.ndarray = occ.outline_mask(self._lm, self._shape) > 0.5
        return out

    @functools.cached_property
    def feats(self) -> list[np.ndarray]:
        return occ.feature_masks(self._lm, self._shape)


def _face_axes(lm: np.ndarray) -> _Axes:
    """(mid-eye point, across and down unit vectors (2,), eye-to-mouth height, the
    outline's half-width and its centre's offset along ``across``), pixels."""
    a = lm[list(topo.EYE_IMAGE_LEFT), :2].mean(0)
    b = lm[list(topo.EYE_IMAGE_RIGHT), :2].mean(0)
    across = (b - a) / max(1e-6, float(np.linalg.norm(b - a)))
    down = np.array([-across[1], across[0]])
    mid = 0.5 * (a + b)
    mouth = max(1.0, float((lm[list(topo.MOUTH_CORNERS), :2].mean(0) - mid) @ down))
    proj = (lm[list(topo.FACE_OVAL), :2] - mid) @ across
    half = max(1.0, 0.5 * float(proj.max() - proj.min()))
    return mid, across, down, mouth, half, 0.5 * float(proj.max() + proj.min())


def _axes(axes: _Axes, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-pixel face coordinates (H, W) float32: height ``t`` and side ``s`` (see
    :class:`_Frame`)."""
    mid, across, down, mouth, half, centre = axes
    px = np.arange(shape[1], dtype=np.float32) - np.float32(mid[0])
    py = np.arange(shape[0], dtype=np.float32)[:, None] - np.float32(mid[1])
    t = (px * np.float32(down[0] / mouth) + py * np.float32(down[1] / mouth))
    s = (px * np.float32(across[0] / half) + py * np.float32(across[1] / half)
         - np.float32(centre / half))
    return t, s


def beard_zone(lm: np.ndarray, shape: tuple[int, int], frame: _Frame | None = None) -> np.ndarray:
    """(H, W) bool: where facial hair can be — inside the face outline, below the
    beard line (:data:`BEARD_TOP`), plus the upper lip; not the lips or nostrils."""
    f = _Frame(lm, shape) if frame is None else frame
    zone = f.face & (f.t > BEARD_TOP - BEARD_TOP_RISE * np.minimum(np.abs(f.s), 1) ** 2)
    zone |= _upper_lip(lm, shape) & f.face
    # Hair grows to the lips' edge: only the lips themselves and the nostrils are cut.
    lips = np.zeros(shape, np.uint8)
    cv2.fillPoly(lips, [np.round(lm[list(topo.LIPS_OUTER), :2]).astype(np.int32)], 1)
    out: np.ndarray = zone & (lips == 0) & (f.feats[5] == 0)
    return out


def _upper_lip(lm: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(H, W) bool: the upper lip between the nostrils and the lip's outer edge."""
    lip = np.zeros(shape, np.uint8)
    cv2.fillPoly(lip, [np.round(lm[list(_UPPER_LIP), :2]).astype(np.int32)], 1)
    out: np.ndarray = lip > 0
    return out


def _luma(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = x @ np.array([0.299, 0.587, 0.114], np.float32)
    return out


def hair_features(image: np.ndarray, lm: np.ndarray, frame: _Frame | None = None,
                  top: float = -np.inf, sided: bool = False) -> tuple[
                      np.ndarray, np.ndarray, np.ndarray] | None:
    """(greyness, darkness, texture) (H, W) float32 each, relative to the face's
    upper-face skin (mesh skin vertices between heights ``top`` and
    :data:`UPPER_FACE`; ``frame`` the image's :class:`_Frame`, made when None);
    None when too little of it is in the image. ``sided``: the reference runs
    across the face from the skin of its one side to the other's (see
    :func:`_reference`), so a face lit from one side is judged alike on both.

    greyness: the share of the way from the skin's chromaticity to grey (0 skin,
    1 grey; negative: more saturated); darkness: ``log(skin luma / luma)``;
    texture: ``log`` of the fine structure-tensor energy over the skin's."""
    h, w = image.shape[:2]
    d = eye_distance(lm)
    f = _Frame(lm, (h, w)) if frame is None else frame
    xy = np.round(lm[f.skin, :2]).astype(np.int64)
    ok = (xy[:, 0] >= 0) & (xy[:, 0] < w) & (xy[:, 1] >= 0) & (xy[:, 1] < h)
    xy = xy[ok]
    tv = f.t[xy[:, 1], xy[:, 0]]
    xy = xy[(tv < UPPER_FACE) & (tv >= top)]
    if len(xy) < 12:
        return None
    ys, xs = xy[:, 1], xy[:, 0]
    x = image.astype(np.float32)
    b = cv2.GaussianBlur(x, (0, 0), max(0.7, 0.02 * d))
    luma = _luma(b)
    total = b[..., 0] + b[..., 1] + b[..., 2] + np.float32(3.0)  # (a strided sum is slow)
    r, g = (b[..., 0] + 1.0) / total, (b[..., 1] + 1.0) / total
    # Oriented fine texture: the structure tensor's trace of the high-pass luma.
    fine = _luma(x)
    fine = fine - cv2.GaussianBlur(fine, (0, 0), 1.0)
    gx = cv2.Sobel(fine, cv2.CV_32F, 1, 0, ksize=3)
    gy = cv2.Sobel(fine, cv2.CV_32F, 0, 1, ksize=3)
    energy = np.asarray(cv2.GaussianBlur(gx * gx + gy * gy, (0, 0), max(1.0, 0.03 * d)),
                        np.float32) / np.maximum(luma, np.float32(8.0)) ** 2
    # (OpenCV's log: NumPy's runs ~5x slower on float32 images.)
    log_e = cv2.log(np.maximum(energy, np.float32(1e-12)))
    log_l = cv2.log(luma + np.float32(4.0))
    side = f.midline if sided else None
    skin_r, skin_g, skin_l, skin_e = _reference((r, g, log_l, log_e), ys, xs, side)
    mean_r, mean_g = median(np.stack([r[ys, xs], g[ys, xs]]), axis=1)
    to_grey = np.array([1.0 / 3.0 - mean_r, 1.0 / 3.0 - mean_g])
    span = max(1e-3, float(np.linalg.norm(to_grey)))
    u = to_grey / span
    grey = (r - skin_r) * np.float32(u[0] / span) + (g - skin_g) * np.float32(u[1] / span)
    dark = skin_l - log_l
    texture = log_e - skin_e
    return (np.asarray(grey, np.float32), np.asarray(dark, np.float32),
            np.asarray(texture, np.float32))


def _reference(values: tuple[np.ndarray, ...], ys: np.ndarray, xs: np.ndarray,
               side: np.ndarray | None) -> list[np.ndarray | np.float32]:
    """The skin's reference of each of ``values`` (H, W each): the median over the
    reference pixels (``ys``, ``xs``); with ``side`` (H, W, 0 on the face's
    midline), the medians of each side's pixels, at their median sides, joined
    linearly across the face (held beyond them)."""
    v = np.stack([x[ys, xs] for x in values], 1)
    if side is not None:
        sv = side[ys, xs]
        left, right = sv < 0, sv >= 0
        if left.sum() >= SIDE_VERTICES and right.sum() >= SIDE_VERTICES:
            s0, s1 = float(median(sv[left])), float(median(sv[right]))
            v0, v1 = median(v[left], axis=0), median(v[right], axis=0)
            k = np.clip((side - np.float32(s0)) * np.float32(1.0 / max(1e-3, s1 - s0)), 0, 1)
            return [np.float32(a) + np.float32(b - a) * k for a, b in zip(v0, v1, strict=True)]
    return [np.float32(m) for m in median(v, axis=0)]


def _on_box(image: np.ndarray, lm: np.ndarray, box: tuple[int, int, int, int],
            scale: float, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """``fn`` on the ``box`` (x0, y0, x1, y1) of ``image`` resized by ``scale`` ≤ 1
    (:func:`facefuse.fusion.swappers.classic.occlusion.on_box`), its mask binarised (> 0.5) into an
    (H, W) float32 mask."""
    m = occ.on_box(image, lm, box, fn, scale=scale, min_side=8)
    out: np.ndarray = (m > 0.5).astype(np.float32)
    return out


def facial_hair_mask(image: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """(H, W) float32 in {0, 1}: the beard, moustache and stubble of the face
    ``lm`` in ``image`` (see the module doc); found at no more than
    :data:`HAIR_EYE_PX` (it is a large soft region), on the lower face's box only
    (from height :data:`HAIR_BOX_TOP`, which holds the beard zone and the skin
    reference's cheeks)."""
    lm = np.asarray(lm, np.float64)
    scale = min(1.0, HAIR_EYE_PX / max(1.0, eye_distance(lm)))
    skin = occ.skin_vertices(lm)
    box = _height_box(lm, skin, HAIR_BOX_TOP, np.inf)
    return _on_box(image, lm, box, scale, functools.partial(_facial_hair, skin=skin))


def _height_box(lm: np.ndarray, skin: np.ndarray, top: float, bottom: float
                ) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1): the box of the face outline's and the ``skin`` vertices'
    points between heights ``top`` and ``bottom`` (eyes 0, mouth 1), grown by
    :data:`HAIR_BOX_MARGIN` eye distances (the blurs' and closings' reach)."""
    pts = np.concatenate([lm[list(topo.FACE_OVAL), :2], lm[skin, :2]])
    mid, _, down, mouth, _, _ = _face_axes(lm)
    t = (pts - mid) @ down / mouth
    pts = pts[(t >= top) & (t <= bottom)]
    m = HAIR_BOX_MARGIN * eye_distance(lm)
    return (int(pts[:, 0].min() - m), int(pts[:, 1].min() - m),
            int(np.ceil(pts[:, 0].max() + m)), int(np.ceil(pts[:, 1].max() + m)))


def _hair_pixels(grey: np.ndarray, dark: np.ndarray, texture: np.ndarray,
                 fair: bool = False) -> np.ndarray:
    """(H, W) bool: hair by :func:`hair_features` — greyer than the skin, or darker
    and more textured; with ``fair``, also somewhat greyer and somewhat more
    textured (fair facial hair on dark skin; not used at the hairline, where the
    forehead's own lines would pass it)."""
    out: np.ndarray = (grey > HAIR_GREYER) | ((dark > HAIR_DARKER) & (texture > HAIR_TEXTURE))
    if fair:
        out |= (grey > HAIR_GREYISH) & (texture > HAIR_GREYISH_TEXTURE)
    return out


def _facial_hair(image: np.ndarray, lm: np.ndarray, skin: np.ndarray | None = None) -> np.ndarray:
    """:func:`facial_hair_mask` at the image's own scale (``skin``: the mesh's
    skin vertices, when known)."""
    h, w = image.shape[:2]
    out = np.zeros((h, w), np.float32)
    frame = _Frame(lm, (h, w), skin)
    feats = hair_features(image, lm, frame, top=HAIR_BOX_TOP, sided=True)
    if feats is None:
        return out
    grey, dark, texture = feats
    d = eye_distance(lm)
    full = beard_zone(lm, (h, w), frame)
    # The lips' edge is shaded and lined: hair is judged a little away from it,
    # and a region found reaches it afterwards.
    lips = occ.grow(frame.feats[4], LIP_MARGIN * d)
    zone = full & ~lips
    hairy = _hair_pixels(grey, dark, texture, fair=True)
    binary = (zone & hairy).astype(np.uint8)
    binary = np.asarray(cv2.morphologyEx(binary, cv2.MORPH_CLOSE, occ.disc(0.04 * d)), np.uint8)
    binary = np.asarray(cv2.morphologyEx(binary, cv2.MORPH_OPEN, occ.disc(0.02 * d)), np.uint8)
    binary &= zone.astype(np.uint8)
    n, labels = cv2.connectedComponents(binary, connectivity=8)
    keep = np.zeros(n, bool)
    for core in _cores(lm, frame, zone):
        keep |= _covering(labels, n, core)
    keep[0] = False
    found = keep[labels]
    if found.any():
        found |= occ.grow(found.astype(np.uint8), (LIP_MARGIN + 0.04) * d) & full & ~zone
    # (Judged on what was found, before the nostrils and holes it takes below.)
    if found.sum() < MIN_HAIR_AREA * _face_area(lm):
        return out
    found = _into_nostrils(found, (frame.feats[5] > 0) & frame.face & ~lips, hairy)
    found = _holes_filled(found, zone, HAIR_HOLE * d * d)
    out[found] = 1.0
    return out


def _face_area(lm: np.ndarray) -> float:
    """The face outline's area in pixels (at least 1)."""
    oval = np.asarray(lm, np.float32)[list(topo.FACE_OVAL), :2]
    return max(1.0, float(cv2.contourArea(oval)))


def _holes_filled(found: np.ndarray, zone: np.ndarray, max_area: float) -> np.ndarray:
    """``found`` (H, W bool) with its holes: the pieces of ``zone`` of at most
    ``max_area`` pixels that it encloses, or that it and the zone's own holes (the
    lips, the nostrils) enclose; never one that reaches the zone's outer edge, and
    never the lips or nostrils themselves (they are not in the zone). Sparse stubble
    and the shade of a fold read as skin in places; left out, the fused face showed
    through the hair in patches."""
    gaps = (zone & ~found).astype(np.uint8)
    _, labels, stats, _ = cv2.connectedComponentsWithStats(gaps, connectivity=4)
    fill = stats[:, cv2.CC_STAT_AREA] <= max_area
    # Outside the zone: the pieces of its complement that reach the box's edge.
    m, pieces = cv2.connectedComponents((~zone).astype(np.uint8), connectivity=4)
    edge = np.zeros(m, bool)
    edge[np.unique(_border(pieces))] = True
    edge[0] = False
    beyond = cv2.dilate(edge[pieces].astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
    fill[np.unique(labels[beyond & (gaps > 0)])] = False
    # A gap on the box's own edge (a face the image's border cuts) is not enclosed.
    fill[np.unique(_border(labels))] = False
    fill[0] = False
    out: np.ndarray = found | fill[labels]
    return out


def _border(a: np.ndarray) -> np.ndarray:
    """The values on the edge of a 2-D array (its first and last rows and columns)."""
    out: np.ndarray = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]])
    return out


def _joined(seed: np.ndarray, more: np.ndarray) -> np.ndarray:
    """(H, W) bool: ``seed`` and the pixels of ``more`` 8-connected to it through
    ``more``."""
    n, labels = cv2.connectedComponents((seed | more).astype(np.uint8), connectivity=8)
    keep = np.zeros(n, bool)
    keep[np.unique(labels[seed])] = True
    keep[0] = False
    out: np.ndarray = keep[labels]
    return out


def _into_nostrils(found: np.ndarray, nostrils: np.ndarray, hair: np.ndarray) -> np.ndarray:
    """``found`` (H, W bool facial hair) with the ``hair`` pixels of the ``nostrils``'
    discs that join it: a moustache grows up to the nostrils, whose discs the beard
    zone leaves out only so that dark nostril openings are never found as hair on a
    clean-shaven face. Left out, a moustache lost its top edge under the nose (the
    source's skin showed there, a disc in the hair)."""
    return _joined(found, nostrils & hair)


def _cores(lm: np.ndarray, frame: _Frame, zone: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """The places facial hair grows over, each as three parts ((H, W) bool): one
    side of the face's midline there (beyond :data:`CORE_INNER`), its middle,
    the other side — the midline through the nose base and the upper lip's
    middle, or the lower lip's middle and the chin. They are the philtrum (the
    lower half of the upper lip's skin, within :data:`CORE_SIDE` of the
    midline) and the chin's middle (from :data:`CHIN_CORE` down)."""
    _, _, _, _, half, _ = frame.axes
    # The lower half of the upper lip's skin, above the lip line: a moustache
    # covers it, the shadow under the nose and a smile's folds (beside the
    # mouth) do not.
    lip = zone & _upper_lip(lm, zone.shape)
    if lip.any():
        lip &= frame.t > median(frame.t[lip])
    chin = zone & (frame.t > CHIN_CORE)
    out: list[tuple[np.ndarray, ...]] = []
    for core, (a, b) in ((lip, _PHILTRUM_LINE), (chin, _CHIN_LINE)):
        side = _across_line(lm[a, :2], lm[b, :2], zone.shape) / np.float32(half)
        core = core & (np.abs(side) < CORE_SIDE)
        out.append((core & (side < -CORE_INNER), core & (np.abs(side) <= CORE_INNER),
                    core & (side > CORE_INNER)))
    return out


def _across_line(a: np.ndarray, b: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(H, W) float32: signed distance (pixels) of each pixel from the line through
    points ``a`` and ``b`` (2,)."""
    d = (b - a) / max(1e-6, float(np.linalg.norm(b - a)))
    px = np.arange(shape[1], dtype=np.float32) - np.float32(a[0])
    py = np.arange(shape[0], dtype=np.float32)[:, None] - np.float32(a[1])
    out: np.ndarray = px * np.float32(d[1]) - py * np.float32(d[0])
    return out


def _covering(labels: np.ndarray, n: int, parts: tuple[np.ndarray, ...]) -> np.ndarray:
    """(n,) bool: the regions of ``labels`` that are facial hair over a core given
    as its ``parts`` (one side of the midline, its middle, the other side): those
    that cover :data:`CORE_COVER` of a part, kept only when together they cover
    :data:`PART_COVER` of each part and :data:`CORE_MEAN_COVER` on average (hair
    grows across the midline; a smile fold or a shaded jaw lies to one side, a
    smile's two folds leave much of the middle bare)."""
    keep = np.zeros(n, bool)
    sizes = [int(p.sum()) for p in parts]
    if min(sizes) < 2:
        return keep
    counts = [np.bincount(labels[p], minlength=n) for p in parts]
    cand = np.zeros(n, bool)
    for c, z in zip(counts, sizes, strict=True):
        cand |= c >= CORE_COVER * z
    cand[0] = False
    cover = [float(c[cand].sum()) / z for c, z in zip(counts, sizes, strict=True)]
    if min(cover) >= PART_COVER and sum(cover) >= 3 * CORE_MEAN_COVER:
        keep = cand
    return keep


#: Lens ring around each eye's centre: half-axes (eye distances) of its outer edge;
#: the eye itself (grown by RING_EYE_CLEAR) is cut out.
RING_AXES = (0.36, 0.28)
RING_EYE_CLEAR = 0.03
#: Black-hat radius (eye distances): dark lines thinner than twice this respond.
FRAME_HAT = 0.05
#: A ridge pixel is this much darker (share of the closed luma) than around it.
FRAME_CONTRAST = 0.2
#: A rim winds around its eye by at least this many degrees (in 10-degree bins).
FRAME_MIN_SPAN = 120.0
#: Ridge pieces spanning fewer degrees around an eye than this are specks.
FRAME_PIECE_SPAN = 30.0
#: The eye band examined for glasses: the eyes, brows, temples and nose tip's
#: bounding box grown by this many eye distances.
GLASSES_BOX_MARGIN = 0.15
#: The nose-bridge band: from BRIDGE_RISE eye distances above the inner eye
#: corners' line to BRIDGE_DROP below it; a frame's bridge spans BRIDGE_SPAN of
#: the width between the corners.
BRIDGE_RISE = 0.22
BRIDGE_DROP = 0.05
BRIDGE_SPAN = 0.5
#: ... counted in bins of this many eye distances across.
BRIDGE_BIN = 0.02
#: A fitted rim's centre lies within RIM_CENTRE_SLACK eye distances of the eye's,
#: its half-axes between RIM_AXES. The outer eye corners are about 90 mm apart and
#: common lenses are 48-58 mm wide (half-width 0.27-0.32 eye distances; the
#: synthetic frames fit at 0.28-0.30); an "ellipse" through lid creases, brow and
#: eye bag is wider (0.35-0.40: obama2's, with YuNet's mesh at 80 px, 0.346).
RIM_CENTRE_SLACK = 0.2
RIM_AXES = (0.08, 0.345)
#: The two rims of a pair are twins: their fitted areas within this ratio (a
#: turned head foreshortens the far one by cos(yaw): 1.4 at 45°; the synthetic
#: frames 1.0-1.22; obama2's lid-crease "ellipses" 1.77).
RIM_TWIN_RATIO = 1.6
#: At least RIM_ON_ELLIPSE of a rim's pixels lie within RIM_BAND eye distances of
#: the fitted ellipse.
RIM_ON_ELLIPSE = 0.6
RIM_BAND = 0.04
#: Half-width (eye distances) of the band about a fitted rim in which its dark line is
#: followed under the brows and beside the eyes (where the zone does not look).
RIM_FOLLOW = 0.13
#: Lens reflections: brighter than the skin by this luma ratio and this much greyer.
REFLECTION_BRIGHTER = 1.12
REFLECTION_GREYER = 0.4


def _eye_frames(lm: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per eye: (centre (2,), [across, down] unit axes (2, 2)) of the face."""
    a = lm[list(topo.EYE_IMAGE_LEFT), :2].mean(0)
    b = lm[list(topo.EYE_IMAGE_RIGHT), :2].mean(0)
    across = (b - a) / max(1e-6, float(np.linalg.norm(b - a)))
    axes = np.stack([across, np.array([-across[1], across[0]])])
    return [(a, axes), (b, axes)]


def glasses_zone(lm: np.ndarray, shape: tuple[int, int]
                 ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """(zone (H, W) bool, per-eye rings (H, W) bool, eyes (H, W) bool): where a frame
    can be — the lens rings around the eyes, the nose bridge between them and the
    temples out to the face outline — inside the outline, not on the eyes (``eyes``:
    the eyes and the clearance about them the zone leaves) or brows."""
    d = eye_distance(lm)
    h, w = shape
    face = occ.outline_mask(lm, shape) > 0.5
    feats = occ.feature_masks(lm, shape)
    eyes = occ.grow(np.maximum(feats[0], feats[1]), RING_EYE_CLEAR * d)
    brows = np.maximum(feats[2], feats[3]) > 127
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    rings = []
    band = np.zeros(shape, bool)
    for c, ax in _eye_frames(lm):
        px, py = xx - np.float32(c[0]), yy - np.float32(c[1])
        u = (px * np.float32(ax[0, 0]) + py * np.float32(ax[0, 1])) / np.float32(RING_AXES[0] * d)
        v = (px * np.float32(ax[1, 0]) + py * np.float32(ax[1, 1])) / np.float32(RING_AXES[1] * d)
        rings.append((u * u + v * v <= 1.0) & face & ~eyes & ~brows)
        band |= (np.abs(v) < 0.6) & (np.abs(u) < 3.0)
    zone = (rings[0] | rings[1] | (band & face)) & ~eyes & ~brows
    return zone, rings, eyes


def _span(mask: np.ndarray, centre: np.ndarray, axes: np.ndarray) -> float:
    """Degrees (in 10-degree bins) that the pixels of ``mask`` cover around ``centre``."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return 0.0
    p = np.stack([xs - centre[0], ys - centre[1]], 1) @ axes.T
    bins = ((np.degrees(np.arctan2(p[:, 1], p[:, 0])) + 180.0) // 10).astype(np.int64) % 36
    return 10.0 * float(np.unique(bins).size)


def _bridge(lm: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, float]:
    """(band (H, W) bool, its width in pixels): the nose bridge between the inner
    eye corners, from a little below the eye line up to the brows' lower edge."""
    d = eye_distance(lm)
    a, b = lm[topo.EYE_INNER[0], :2], lm[topo.EYE_INNER[1], :2]
    (_, ax), _ = _eye_frames(lm)
    mid = 0.5 * (a + b)
    h, w = shape
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    px, py = xx - np.float32(mid[0]), yy - np.float32(mid[1])
    u = px * np.float32(ax[0, 0]) + py * np.float32(ax[0, 1])
    v = px * np.float32(ax[1, 0]) + py * np.float32(ax[1, 1])
    half = 0.5 * float(np.linalg.norm(b - a))
    band = (np.abs(u) < half) & (v > -BRIDGE_RISE * d) & (v < BRIDGE_DROP * d)
    return band, 2.0 * half


def _followed(seed: np.ndarray, lines: np.ndarray) -> np.ndarray:
    """(H, W) bool: the pixels of ``lines`` joined to ``seed`` (8-connected through
    ``lines``), the rims' pieces followed where the zone does not look."""
    out: np.ndarray = _joined(seed, lines) & lines
    return out


def _fit_rim(rim: np.ndarray, centre: np.ndarray, d: float) -> tuple[
        tuple[float, float], tuple[float, float], float] | None:
    """The ellipse (cv2 form) through a rim's pixels ((H, W) bool), refitted once
    on the pixels near the first fit; None when it is not a lens around the eye
    ``centre`` or too few of the pixels lie on it (:data:`RIM_ON_ELLIPSE`)."""
    ys, xs = np.nonzero(rim)
    pts = np.stack([xs, ys], 1).astype(np.float32)
    fit = None
    for _ in range(2):
        if len(pts) < 8:
            return None
        fit = cv2.fitEllipse(pts)
        band = np.zeros(rim.shape, np.uint8)
        cv2.ellipse(band, fit, 255, max(1, round(2 * RIM_BAND * d)))
        on = band[ys, xs] > 0
        pts = np.stack([xs[on], ys[on]], 1).astype(np.float32)
    assert fit is not None
    (cx, cy), (a, b), _ = fit
    if np.hypot(cx - centre[0], cy - centre[1]) > RIM_CENTRE_SLACK * d:
        return None
    if not (RIM_AXES[0] * d <= min(a, b) / 2 and max(a, b) / 2 <= RIM_AXES[1] * d):
        return None
    if len(pts) < RIM_ON_ELLIPSE * len(xs):
        return None
    return (float(cx), float(cy)), (float(a), float(b)), float(fit[2])


def glasses_mask(image: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """(H, W) float32 in {0, 1}: the frames (and lens reflections) of the glasses
    the face ``lm`` wears in ``image``, or all 0 (see the module doc). Only the
    band of the eyes, brows and temples is examined."""
    d = eye_distance(lm)
    idx = list(topo.EYE_IMAGE_LEFT + topo.EYE_IMAGE_RIGHT + topo.BROW_IMAGE_LEFT
               + topo.BROW_IMAGE_RIGHT + (topo.FACE_EDGE_IMAGE_LEFT, topo.FACE_EDGE_IMAGE_RIGHT,
                                          topo.NOSE_TIP))
    pts = np.asarray(lm, np.float64)[idx, :2]
    m = GLASSES_BOX_MARGIN * d
    box = (int(pts[:, 0].min() - m), int(pts[:, 1].min() - m),
           int(np.ceil(pts[:, 0].max() + m)), int(np.ceil(pts[:, 1].max() + m)))
    return _on_box(image, lm, box, 1.0, _glasses)


def _crosses_bridge(lm: np.ndarray, on_bridge: np.ndarray, bridge_w: float) -> bool:
    """Whether the ridge pixels ``on_bridge`` (H, W bool) cover at least
    :data:`BRIDGE_SPAN` of the bridge's width ``bridge_w`` (px) along the eye line,
    in bins of :data:`BRIDGE_BIN` eye distances (a thin frame's ridge may be dashed)."""
    (_, ax), _ = _eye_frames(lm)
    ys, xs = np.nonzero(on_bridge)
    if not len(xs):
        return False
    u = xs * ax[0, 0] + ys * ax[0, 1]
    step = max(1.0, BRIDGE_BIN * eye_distance(lm))
    return bool(np.unique(np.floor(u / step)).size * step >= BRIDGE_SPAN * bridge_w)


def _glasses(image: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """:func:`glasses_mask` on the image cropped to the eye band."""
    h, w = image.shape[:2]
    out = np.zeros((h, w), np.float32)
    d = eye_distance(lm)
    bridge, bridge_w = _bridge(lm, (h, w))
    luma = _luma(image.astype(np.float32))
    closed = cv2.morphologyEx(luma, cv2.MORPH_CLOSE, occ.disc(FRAME_HAT * d))
    contrast = (closed - luma) / (closed + 8.0)
    lines = contrast > FRAME_CONTRAST
    # A frame crosses the nose bridge: its ridge (a thin one may be dashed) covers
    # most of the bridge's width. Looked at first on the bridge alone: most faces
    # wear no glasses, and the zone around the eyes is the finder's dearest part.
    if not _crosses_bridge(lm, bridge & lines, bridge_w):
        return out
    zone, rings, eyes = glasses_zone(lm, (h, w))
    ridge = lines & zone
    if not _crosses_bridge(lm, bridge & ridge, bridge_w):
        return out
    n, labels = cv2.connectedComponents(ridge.astype(np.uint8), connectivity=8)
    pieces = np.zeros(n, bool)
    rims = []
    for ring, (c, axes) in zip(rings, _eye_frames(lm), strict=True):
        inside = ridge & ring
        # Pieces of a rim, not specks: each winds a little around the eye.
        for k in np.unique(labels[inside]):
            if k and _span(inside & (labels == k), c, axes) >= FRAME_PIECE_SPAN:
                pieces[k] = True
        rim = inside & pieces[labels]
        if _span(rim, c, axes) < FRAME_MIN_SPAN:
            return out
        fit = _fit_rim(rim, c, d)
        if fit is None:
            return out
        rims.append((fit, rim))
    areas = [a * b for (_, (a, b), _), _ in rims]
    if max(areas) > RIM_TWIN_RATIO * min(areas):
        return out
    # The rims, and what connects to them (the bridge, the temples).
    binary = (ridge & pieces[labels]).astype(np.uint8)
    grown = cv2.dilate(binary, occ.disc(0.02 * d)) > 0
    keep = np.zeros(n, bool)
    keep[np.unique(labels[grown & ridge])] = True
    keep[0] = False
    out[keep[labels]] = 1.0
    # Where the rim runs under a brow or beside an eye the ridge test is blind:
    # the fitted ellipse, as thick as the rim measured, is the frame there too.
    canvas = np.zeros((h, w), np.uint8)
    near = np.zeros((h, w), np.uint8)
    for fit, rim in rims:
        dist = cv2.distanceTransform(rim.astype(np.uint8), cv2.DIST_L2, 3)
        thick = max(1, round(2.0 * float(np.percentile(dist[rim], 90))))
        cv2.ellipse(canvas, fit, 255, thick, cv2.LINE_AA)
        cv2.ellipse(near, fit, 255, max(1, round(2 * RIM_FOLLOW * d)))
    out[canvas > 127] = 1.0
    # Where the zone does not look, the rim's own dark line is followed from its
    # pieces (on a small face the top arc runs on the brow, and the ellipse through
    # the lower arcs overshoots it there); never onto the eyes and their lids.
    out[_followed(binary > 0, lines & ~zone & ~eyes & (near > 0))] = 1.0
    # The rim's anti-aliased edge is the frame's too.
    out = np.asarray(cv2.dilate(out, occ.disc(1.0)), np.float32)
    feats = hair_features(image, lm)
    if feats is not None:
        grey, dark, _ = feats
        lens = rings[0] | rings[1]
        shine = lens & (dark < -np.log(REFLECTION_BRIGHTER)) & (grey > REFLECTION_GREYER)
        out[shine] = 1.0
    return out

def face_occluders(image: np.ndarray, landmarks: np.ndarray, *, scale: float = 1.0,
                   glasses: bool = False, facial_hair: bool = False, hairline: bool = False,
                   rim_grow: float = 0.0, openings: bool = False,
                   colour: bool = True) -> np.ndarray:
    """(H, W) float32: :func:`facefuse.fusion.swappers.classic.occlusion.occluder_mask` together
    with the face's glasses, facial hair and/or scalp hair at its outline
    (``hairline``) as regions, on the same crop and scale
    — except the glasses, always looked for at the image's own resolution (a
    frame is a line a pixel or two wide there; shrunk further it breaks up, and
    whether it is found would hang on a few percent of scale): what of the face is
    not its skin, to be kept on a target and filled on a source. ``rim_grow``:
    see :func:`facefuse.fusion.swappers.classic.occlusion.occluders_on_crop`;
    ``openings``: the glasses and facial hair less the eyes and lips
    (:func:`without_openings`; on a target: what covers an eye or the mouth as a
    whole, sunglasses or a hand, is still found by the occluder rule). Without
    ``colour`` (a black-and-white photo) the occluder rule, whose skin model is a
    colour model, is left out: on grey skin it read the shaded cheeks and brow as
    occluders, kept as the target's blotches."""
    lm = np.asarray(landmarks, np.float64)
    finders: list[Callable[[np.ndarray, np.ndarray], np.ndarray]] = []
    if colour:
        finders.append(functools.partial(occ.occluders_on_crop, rim_grow=rim_grow))
    if facial_hair:
        finders.append(facial_hair_mask if not openings else
                       lambda crop, crop_lm: without_openings(facial_hair_mask(crop, crop_lm),
                                                              crop_lm))
    if hairline:
        finders.append(hairline_mask)

    def union(crop: np.ndarray, crop_lm: np.ndarray) -> np.ndarray:
        out: np.ndarray = np.maximum.reduce(
            [f(crop, crop_lm) for f in finders] or [np.zeros(crop.shape[:2], np.float32)])
        return out

    found = occ.on_face_crop(image, lm, union, scale=scale)
    if glasses:
        # On the image itself, never on the face outline's crop: the eye band's box
        # reaches past the outline at the temples, and cut there, the frames' ridge
        # test saw the crop's edge (obama2 at 80 px: "frames" round both eyes).
        frames = glasses_mask(image, lm)
        np.maximum(found, without_openings(frames, lm) if openings else frames, out=found)
    return found


def hairline_mask(image: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """(H, W) float32 in {0, 1}: the scalp hair of the face ``lm`` in ``image`` that
    lies inside its outline at the upper edge (see the module doc); only the upper
    face's box is examined (the band and the skin the hair is judged against)."""
    lm = np.asarray(lm, np.float64)
    skin = occ.skin_vertices(lm)
    box = _height_box(lm, skin, -np.inf, UPPER_FACE)
    return _on_box(image, lm, box, 1.0, functools.partial(_hairline, skin=skin))


def _hairline(image: np.ndarray, lm: np.ndarray, skin: np.ndarray | None = None
              ) -> np.ndarray:
    """:func:`hairline_mask` on the whole of ``image`` (``skin``: the mesh's skin
    vertices, when known)."""
    h, w = image.shape[:2]
    out = np.zeros((h, w), np.float32)
    frame = _Frame(lm, (h, w), skin)
    feats = hair_features(image, lm, frame, sided=True)
    if feats is None:
        return out
    grey, dark, texture = feats
    d = eye_distance(lm)
    hair = _hair_pixels(grey, dark, texture)
    eyes_brows = np.maximum.reduce(frame.feats[:4])
    hair &= (frame.t < HAIRLINE_BOTTOM) & ~occ.grow(eyes_brows, HAIRLINE_CLEAR * d)
    out[occ.rim_background(hair, frame.face, HAIRLINE_BAND * d)] = 1.0
    return out


def worn_regions(image: np.ndarray, landmarks: np.ndarray, *, glasses: bool,
                 facial_hair: bool, openings: bool = False) -> np.ndarray:
    """(H, W) float32: the face's glasses and/or facial hair as
    :func:`face_occluders` finds them (at scale 1), without the other occluders;
    ``openings``: less the eyes and lips (see :func:`face_occluders`)."""
    lm = np.asarray(landmarks, np.float64)
    found = (facial_hair_regions(image, lm) if facial_hair
             else np.zeros(image.shape[:2], np.float32))
    if glasses:
        np.maximum(found, glasses_mask(image, lm), out=found)
    return without_openings(found, lm) if openings else found


def facial_hair_regions(image: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """(H, W) float32 in {0, 1}: the face's facial hair (:func:`facial_hair_mask`,
    on the face outline's crop)."""
    return occ.on_face_crop(image, np.asarray(landmarks, np.float64), facial_hair_mask)


def without_openings(worn: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """``worn`` (H, W) float32, glasses and facial hair on the image of the mesh
    ``lm``, less the eye openings and the lips (grown a little): a clear lens shows
    the eye behind it and a beard the mouth inside it, so a face keeping its worn
    things keeps only what really covers it."""
    h, w = worn.shape[:2]
    clear = masks.openings_mask(lm, (0, 0, w, h))
    out: np.ndarray = (worn * (1.0 - clear)).astype(np.float32)
    return out
