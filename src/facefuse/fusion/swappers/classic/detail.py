"""The face layer at the photo's own resolution: a working-scale render plus the
full-resolution detail band.

Large faces are rendered at a reduced working scale (tone, shading, identity
features: the low and mid frequencies) so the cost stops growing with face
size. Upsampling that render alone would blur the face: pores, grain and
stubble live above the working scale's Nyquist frequency. Here the layer is put
back together at full resolution (region pixels, (h, w)):

``layer = T + up(G(F_s − T_s)) + a · (g · D_src − D_tgt + c · clip(D_tgt) − C_tgt)``

- ``T``: the target's own pixels warped onto the fused mesh at full resolution
  (the working-scale maps' displacement upsampled), so a pixel the fusion does
  not move is the target's own, never resampled through the working scale;
- ``F_s − T_s``: what the render changed at the working scale (the fused layer
  minus the target's warped layer there), low-passed by ``G`` (a Gaussian of
  :data:`SPLIT_SIGMA` working pixels) and upsampled: a smooth change;
- ``D_src``, ``D_tgt``: the detail bands (luma minus the same Gaussian at full
  resolution)
  of the source warped at its own resolution and of ``T``;
- ``a`` (h, w): the share of the layer drawn from the direct source sample
  (through a smoothstep);
- ``g``, ``c``: per-face gains that give the result the target's detail energy
  on the face's skin: the source's detail is scaled down where it is sharper
  (``g ≤ 1``), and topped up with the target's own (``c``) where it is softer
  (a smaller or blurrier source), so the face is as crisp as the photo around
  it; the top-up is the target's grain, its finest band clipped to
  :data:`GRAIN_CLIP` robust standard deviations (not its features' edges);
- ``C_tgt``: the target's colour detail above the split (RGB minus luma), which
  the luma bands leave: a dark, cool nostril or mole would stay as a tinted
  ghost under the source's skin.

Where nothing of the source is shown (``a = 0`` and no change at the working
scale) the layer is exactly ``T``; with an unmoved mesh, exactly the target.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import cv2
import numpy as np

from facefuse.imaging.channels import each_channel
from facefuse.imaging.stats import median

#: ITU-R BT.601 luma weights (RGB).
LUMA = np.array([0.299, 0.587, 0.114], np.float32)
#: Where the working-scale render hands over to the full-resolution detail: a
#: Gaussian of this σ in working pixels. The working render's resampling (its
#: decimation, its bilinear warp, its upsampling) softens everything above about
#: a quarter of its sampling rate; this split leaves that band to the detail.
SPLIT_SIGMA = 1.5
#: ... and at least this σ in full-resolution pixels: a face rendered at (or near)
#: its own scale would otherwise carry the source's texture between σ 1.5 and 2
#: px unmatched in the change, sharper than a smooth target (a stubbled 2 MP
#: source into a 60-px face: 1.64x the target's band energy, 1.47x with this).
#: Wider splits smooth it further but cost identity (at 2.5 px the recogniser's
#: similarity to the source fell 0.008 on the 60-px target, at 2 px 0.005).
MIN_SPLIT_PX = 2.0
#: The finest detail band (grain, pores) is matched on its own: below this σ
#: (full-resolution pixels).
FINE_SIGMA = 1.0
#: Share of the mid band's shortfall topped up from the target: that band holds
#: wrinkles and small features (identity: topping it up fully raised the
#: recogniser's similarity of the output to the target by up to 0.04 on the
#: samples), the finest one only grain and pores.
MID_TOP_UP = 0.0
#: The target's grain topped up into the finest band is clipped to this many of its
#: skin's robust standard deviations: pores and grain lie within, a feature's
#: edge (a nostril's rim, a wrinkle's crease) far beyond.
GRAIN_CLIP = 2.5
#: Interpolation of the full-resolution warps (bilinear: the finest band's energy
#: it softens is matched back to the photo's by the detail gains).
INTERPOLATION = cv2.INTER_LINEAR
#: A source map's step to a neighbour this many times its median step is a tear
#: (:func:`map_tears`): no source detail there.
TEAR_STEP = 4.0
#: Fewest measurable skin pixels for the per-face detail gains (else 1 and 0).
MIN_SKIN_PIXELS = 64


@dataclass(frozen=True)
class Scaled:
    """One image's full-resolution crop and its working-scale size.

    ``full``: (H, W, 3) uint8 crop; ``small``: the working (w, h). The working
    copy is ``cv2.resize(full, small, INTER_AREA)``.
    """

    full: np.ndarray
    small: tuple[int, int]

    @functools.cached_property
    def full_luma(self) -> np.ndarray:
        """(H, W) float32 luma of ``full``, computed once (a source's crop, kept in
        its memo, serves every frame of a clip)."""
        return luma(self.full)

    @property
    def ratio(self) -> tuple[float, float]:
        """(x, y) working pixels per full pixel."""
        h, w = self.full.shape[:2]
        return self.small[0] / w, self.small[1] / h

    @property
    def size(self) -> tuple[int, int]:
        """The full (w, h)."""
        return self.full.shape[1], self.full.shape[0]


def luma(rgb: np.ndarray) -> np.ndarray:
    """(H, W) float32 luma of an (H, W, 3) RGB image."""
    out: np.ndarray = cv2.transform(np.asarray(rgb, np.float32), LUMA[None, :])
    return out.reshape(rgb.shape[:2])


def upsample(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Bilinear upsampling to ``size`` = (w, h), pixel centres aligned."""
    out: np.ndarray = cv2.resize(img, size, interpolation=cv2.INTER_LINEAR)
    return out


def nonzero_window(small: np.ndarray, ratio: tuple[float, float],
                   size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """The full-resolution window (x0, y0, x1, y1) outside which :func:`upsample` of
    ``small`` (h, w) to ``size`` = (w, h) is exactly 0 (``ratio``: small pixels per
    full pixel, x and y); None when ``small`` is 0 everywhere."""
    x, y, w, h = cv2.boundingRect((small != 0).view(np.uint8))
    if w == 0 or h == 0:
        return None
    sx, sy = ratio
    # A full pixel X samples the small grid at (X + 0.5)·s − 0.5 and reads its two
    # neighbours: it is 0 unless that point is within one small pixel of the box.
    x0 = max(0, int(np.floor((x - 0.5) / sx - 0.5)))
    y0 = max(0, int(np.floor((y - 0.5) / sy - 0.5)))
    x1 = min(size[0], int(np.ceil((x + w + 0.5) / sx - 0.5)) + 1)
    y1 = min(size[1], int(np.ceil((y + h + 0.5) / sy - 0.5)) + 1)
    return x0, y0, x1, y1


def upsample_window(img: np.ndarray, ratio: tuple[float, float],
                    window: tuple[int, int, int, int]) -> np.ndarray:
    """:func:`upsample` of ``img`` over one full-resolution ``window`` (x0, y0, x1,
    y1) only (``ratio``: small pixels per full pixel), pixel centres aligned."""
    sx, sy = ratio
    x0, y0, x1, y1 = window
    m = np.array([[sx, 0.0, (x0 + 0.5) * sx - 0.5], [0.0, sy, (y0 + 0.5) * sy - 0.5]])
    out: np.ndarray = cv2.warpAffine(img, m, (x1 - x0, y1 - y0),
                                     flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                                     borderMode=cv2.BORDER_REPLICATE)
    return out


def low_pass(img: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian low-pass (σ = ``sigma`` pixels) of an (H, W[, C]) float32 image; from
    σ 2 on, computed at half size (what survives such a blur survives the
    decimation) and upsampled."""
    h, w = img.shape[:2]
    if sigma < 2.0 or min(h, w) < 16:
        out: np.ndarray = cv2.GaussianBlur(img, (0, 0), sigma,
                                           borderType=cv2.BORDER_REFLECT_101)
        return out
    half = cv2.resize(img, ((w + 1) // 2, (h + 1) // 2), interpolation=cv2.INTER_AREA)
    # Box decimation by 2 is itself a blur of about σ 0.5 (full pixels).
    blurred = cv2.GaussianBlur(half, (0, 0), (sigma * sigma - 0.25) ** 0.5 / 2,
                               borderType=cv2.BORDER_REFLECT_101)
    return upsample(blurred, (w, h))


def full_maps(map_x: np.ndarray, map_y: np.ndarray, valid: np.ndarray, frame: Scaled,
              source: Scaled, window: tuple[int, int, int, int]
              ) -> tuple[np.ndarray, np.ndarray]:
    """Working-scale remap coordinates (h, w) into ``source``'s working image, taken to
    the full-resolution grid of ``frame`` and into ``source``'s full crop, over
    ``window`` (x0, y0, x1, y1) of that grid.

    The displacement from the identity is what is upsampled (the identity itself
    is exact at every scale), so where the map is the identity (``~valid``: off
    the mesh) the full map is exactly the identity too.
    """
    sx, sy = frame.ratio
    qx, qy = source.ratio
    h, w = map_x.shape
    gx = (np.arange(w, dtype=np.float32)[None, :] + 0.5) / sx - 0.5
    gy = (np.arange(h, dtype=np.float32)[:, None] + 0.5) / sy - 0.5
    # The working coordinate in full source pixels minus this pixel's full position.
    dx = np.where(valid, (map_x + 0.5) / qx - 0.5 - gx, 0.0).astype(np.float32)
    dy = np.where(valid, (map_y + 0.5) / qy - 0.5 - gy, 0.0).astype(np.float32)
    x0, y0, x1, y1 = window
    fx = np.arange(x0, x1, dtype=np.float32)[None, :]
    fy = np.arange(y0, y1, dtype=np.float32)[:, None]
    return (fx + upsample_window(dx, frame.ratio, window),
            fy + upsample_window(dy, frame.ratio, window))


def map_tears(map_x: np.ndarray, map_y: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """(h, w) bool: the pixels of a remap (coordinates (h, w) float32, defined on
    ``valid``) on either side of a jump — a step to a neighbour more than
    :data:`TEAR_STEP` times the map's median step (a fold of the fused mesh, the
    source squeezed into a few pixels there). Upsampled, the map runs across such a
    jump through source pixels that belong to neither side: isolated bright and
    dark dots of its detail (a face seen from below, its nose wing fused from a
    frontal source)."""
    out = np.zeros(map_x.shape, bool)
    steps = []
    for axis in (0, 1):
        # (OpenCV's magnitude: NumPy's overflow-safe hypot runs ~20x slower.)
        d = cv2.magnitude(np.diff(map_x, axis=axis), np.diff(map_y, axis=axis))
        both = valid[1:, :] & valid[:-1, :] if axis == 0 else valid[:, 1:] & valid[:, :-1]
        steps.append((d, both))
    known = np.concatenate([d[b] for d, b in steps])
    if known.size == 0:
        return out
    limit = TEAR_STEP * max(float(median(known)), 1e-3)
    for axis, (d, both) in enumerate(steps):
        jump = both & (d > limit)
        if axis == 0:
            out[1:, :] |= jump
            out[:-1, :] |= jump
        else:
            out[:, 1:] |= jump
            out[:, :-1] |= jump
    return out


def _padded(window: tuple[int, int, int, int], pad: int, size: tuple[int, int]
            ) -> tuple[int, int, int, int]:
    """``window`` (x0, y0, x1, y1) grown by ``pad`` px within ``size`` (w, h), its
    origin on even pixels and, short of the region's edge, its width and height
    even: the detail's half-size low-passes and every-other-pixel statistics then
    pair the same pixels as over the whole region (exactly when its sides are even)."""
    x0, y0, x1, y1 = window
    x0, y0 = max(0, x0 - pad), max(0, y0 - pad)
    x0, y0 = x0 - x0 % 2, y0 - y0 % 2
    x1, y1 = min(size[0], x1 + pad), min(size[1], y1 + pad)
    x1 += (x1 - x0) % 2 if x1 < size[0] else 0
    y1 += (y1 - y0) % 2 if y1 < size[1] else 0
    return x0, y0, x1, y1


def detail_gains(e_src: float, e_tgt: float, e_ref: float) -> tuple[float, float]:
    """Gains ``(g, c)`` on a source and a target detail band of energies ``e_src`` and
    ``e_tgt`` (mean squares) so that ``g·D_src + c·D_tgt`` has the energy ``e_ref``
    (the target photo's own): ``g = min(1, √(e_ref/e_src))`` and ``c`` tops up what
    the source lacks, ``c = √(max(0, e_ref − g²·e_src) / e_tgt)`` (the two bands are
    uncorrelated, so their energies add)."""
    if e_ref <= 1e-6:
        return 0.0, 0.0
    g = 1.0 if e_src <= e_ref else float(np.sqrt(e_ref / e_src))
    c = float(np.sqrt(max(0.0, e_ref - g * g * e_src) / max(e_tgt, 1e-6)))
    return g, c


def _sample(band: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``band`` on ``where``, read on every other row and column (the bands are
    stationary over the skin: a quarter of the pixels give the same figures to
    well under 1%)."""
    out: np.ndarray = band[::2, ::2][where[::2, ::2]]
    return out


def _energy(band: np.ndarray, where: np.ndarray) -> float:
    """Mean square of ``band`` on ``where`` (see :func:`_sample`)."""
    sample = _sample(band, where)
    return float(np.dot(sample, sample)) / float(max(1, sample.size))


def full_resolution_layer(
    target: Scaled,
    target_maps: tuple[np.ndarray, np.ndarray],
    source: Scaled,
    source_maps: tuple[np.ndarray, np.ndarray],
    valid: np.ndarray,
    fused_small: np.ndarray,
    target_small: np.ndarray,
    direct_small: np.ndarray,
    skin_small: np.ndarray,
    own_small: np.ndarray | None = None,
) -> np.ndarray:
    """The face layer (H, W, 3) float32 at ``target``'s full resolution (see module doc).

    Args:
        target: the target's face region (full crop and working size).
        target_maps, source_maps: the working-scale remap coordinates (h, w) of the
            target's and the source's working images onto the fused mesh.
        source: the source's face neighbourhood (full crop and working size).
        valid: (h, w) bool, inside the mesh (the maps are defined there).
        fused_small: (h, w, 3) float32, the working-scale face layer.
        target_small: (h, w, 3) float32, the target warped at the working scale (the
            layer where nothing of the source is shown).
        direct_small: (h, w) float32 in [0, 1], the layer's share of the direct
            source sample.
        skin_small: (h, w) float32, where the detail energies are measured (> 0.5).
        own_small: (h, w) float32 in [0, 1] or None, what is kept of the target's
            own features (its eye openings, its open mouth): the low-passed change
            of the skin around them does not bleed into them.
    """
    size = target.size
    # Off the mesh the maps are the identity: the target's own pixels, not resampled.
    warped = target.full.copy()
    moved = nonzero_window(valid.astype(np.float32), target.ratio, size)
    if moved is not None:
        x0, y0, x1, y1 = moved
        mx, my = full_maps(*target_maps, valid, target, target, moved)
        warped[y0:y1, x0:x1] = cv2.remap(target.full, mx, my, INTERPOLATION,
                                         borderMode=cv2.BORDER_REFLECT_101)
        del mx, my  # (full-size maps: let go before the detail's own buffers)
    layer: np.ndarray = warped.astype(np.float32)
    split_small = max(SPLIT_SIGMA, MIN_SPLIT_PX * min(target.ratio))
    change = low_pass(np.subtract(fused_small, target_small, dtype=np.float32), split_small)
    if own_small is not None:
        # (At the working scale: the kept features' masks are feathered, smooth.)
        change *= each_channel(1.0 - own_small)
    layer += upsample(change, size)
    del change
    # Off the mesh's inner part the source maps are undefined: no source detail
    # within a working pixel of the mesh's edge, nor of where the source map tears.
    inner = cv2.erode((valid & ~map_tears(*source_maps, valid)).astype(np.uint8),
                      np.ones((3, 3), np.uint8)).astype(np.float32)
    direct = np.asarray(direct_small, np.float32) * inner
    skin = np.asarray(skin_small, np.float32) * inner
    shown = nonzero_window(np.maximum(direct, skin), target.ratio, size)
    if shown is None or not direct.any():
        return layer
    split = split_small / min(target.ratio)
    # The detail bands are computed only where the source is shown or the skin read.
    box = _padded(shown, int(np.ceil(3.0 * split)), size)
    x0, y0, x1, y1 = box
    where = upsample_window(skin, target.ratio, box) > 0.5
    if int(where.sum()) < MIN_SKIN_PIXELS:
        return layer
    a = upsample_window(direct, target.ratio, box)
    sx, sy = full_maps(*source_maps, valid, target, source, box)
    src_y = cv2.remap(source.full_luma, sx, sy, INTERPOLATION,
                      borderMode=cv2.BORDER_REFLECT_101)
    del sx, sy
    warped_box = warped[y0:y1, x0:x1]
    tgt_y = luma(warped_box)
    detail = _matched_detail(src_y, tgt_y, luma(target.full[y0:y1, x0:x1]), where, split)
    del src_y
    # Smoothstep on the share: the feathered edges of what is kept from the target
    # (its lips, its eyes) take no source detail (teeth, lashes) half-way in.
    share = a * a * (3.0 - 2.0 * a)
    detail *= share
    out = layer[y0:y1, x0:x1]
    out += each_channel(detail)
    # The detail bands are luma: the target's colour above the split (a nostril's,
    # a mole's) would stay as a tinted ghost of it. Where the source is shown it goes.
    colour = warped_box.astype(np.float32)
    colour -= each_channel(tgt_y)  # (in place: one region-sized float image less)
    # (One Gaussian of the two bands' combined σ: the same low-pass as their cascade,
    # at half size.)
    colour -= low_pass(colour, float(np.hypot(FINE_SIGMA, split)))
    colour *= each_channel(share)
    out -= colour
    return layer


def _matched_detail(src_y: np.ndarray, tgt_y: np.ndarray, ref_y: np.ndarray,
                    where: np.ndarray, sigma: float) -> np.ndarray:
    """(H, W) float32: the change of the detail band, ``g·D_src − D_tgt +
    c·clip(D_tgt)`` (the top-up only in the finest band), matched band by band
    (above :data:`FINE_SIGMA` and from there to ``sigma``) to the energy of the
    unwarped target ``ref_y`` on ``where``: the warps' interpolation softens both
    warped images, the photo's own grain is the goal. ``src_y`` and ``ref_y`` are
    the caller's to give up: their bands are worked out in them."""
    out = np.zeros(src_y.shape, np.float32)
    lo = [src_y, tgt_y, ref_y]
    owned = False  # (tgt_y stays the caller's; the blurs are ours)
    for s, top_up in ((FINE_SIGMA, 1.0), (sigma, MID_TOP_UP)):
        # One image at a time, each band in place of what it is taken from (the same
        # sums as x - blur(x) in a new array).
        ref = lo.pop()
        b_ref = low_pass(ref, s)
        e_ref = _energy(np.subtract(ref, b_ref, out=ref), where)
        del ref
        tgt = lo.pop()
        b_tgt = low_pass(tgt, s)
        d_tgt = np.subtract(tgt, b_tgt, out=tgt if owned else None)
        del tgt
        src = lo.pop()
        b_src = low_pass(src, s)
        d_src = np.subtract(src, b_src, out=src)
        del src
        # The top-up is the target's grain, not its features' edges (a nostril's
        # rim would come back as a ghost outline): clipped to its skin's spread,
        # and its gain set on the clipped band's own energy.
        grain = None
        if top_up > 0.0:
            spread = GRAIN_CLIP * _spread(d_tgt, where)
            grain = np.clip(d_tgt, -spread, spread)
        g, c = detail_gains(_energy(d_src, where),
                            _energy(d_tgt if grain is None else grain, where), e_ref)
        d_src *= np.float32(g)
        d_src -= d_tgt
        del d_tgt
        if grain is not None and c > 0.0:
            grain *= np.float32(c * top_up)
            d_src += grain
        del grain
        out += d_src
        del d_src
        lo, owned = [b_src, b_tgt, b_ref], True
    return out


def _spread(band: np.ndarray, where: np.ndarray) -> float:
    """Robust standard deviation (1.4826 × the median absolute value) of a
    zero-mean band on ``where`` (see :func:`_sample`)."""
    sample = np.abs(_sample(band, where))
    return 1.4826 * float(median(sample)) if sample.size else 0.0
