"""Colour and detail matching of a source region to a reference, inside masks.

The fusion engine warps a source face onto a target; before blending, the
warped face should have the target's colour cast and the target's sharpness and
grain, or it looks pasted on. Every function takes (H, W, 3) RGB images —
uint8, or float in the same 0..255 units — and masks that say which pixels to
measure, and returns a new image of ``src``'s kind: uint8 (rounded) for uint8
input, float32 (clipped to 0..255, not rounded) for float input. The whole
``src`` is transformed; the caller blends it in with its own mask.

Methods
-------
* :func:`match_color_lab` — Reinhard et al. (2001) statistics transfer in
  CIE L*a*b* (OpenCV's float conversion: L in 0..100, a/b about −127..127):
  ``out = (x − μ_src)·σ_ref/σ_src + μ_ref`` per channel, with masked (weighted)
  means and standard deviations, the ratio clamped to [1/4, 4], float math,
  clipped to the RGB gamut at the end.
* :func:`match_histogram` — per-RGB-channel CDF matching of masked histograms.
* :func:`match_sharpness` — two measurements on the luma of each image, inside
  the (eroded) mask:

  - noise σ (grey levels), a robust Immerkær estimate: the image is filtered
    with ``[[1,−2,1],[−2,4,−2],[1,−2,1]]``, which cancels smooth gradients and
    multiplies white noise's σ by 6; σ = median(|r|) / (0.6745·6) so that edges
    (a minority of pixels) do not count;
  - detail energy: variance of the 4-neighbour Laplacian minus what noise alone
    gives (the kernel's squared weights sum to 20, so ``20·σ²``).

  If the source has more detail than the reference, it is Gaussian-blurred with
  the σ (found by bisection, at most ``max_blur`` px) that brings its detail
  energy to the reference's. Then, if the reference is noisier than the result,
  monochrome Gaussian grain of ``sqrt(σ_ref² − σ_out²)`` is added (seeded, so
  the output is deterministic). A source softer than its reference is never
  sharpened — only grain is matched.
* :func:`is_monochrome` — whether an image is a black-and-white photo (its
  channels equal but for a JPEG's chroma noise): a fusion into it stays grey.
"""

from __future__ import annotations

from typing import Any, Final

import cv2
import numpy as np
import numpy.typing as npt

from facefuse.errors import InvalidArgumentError
from facefuse.imaging.channels import each_channel
from facefuse.imaging.stats import median

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

#: Fewer measured pixels than this and a function leaves ``src`` unchanged.
MIN_MASK_PIXELS: Final = 16
#: Bounds of the std ratio in :func:`match_color_lab`.
_RATIO_MIN: Final = 0.25
_RATIO_MAX: Final = 4.0
#: Squared weights of the 4-neighbour Laplacian kernel: noise variance gain.
_LAPLACIAN_NOISE_GAIN: Final = 20.0
#: Erosion (px) of the mask before measuring sharpness/noise (3×3 filters + margin).
_MEASURE_ERODE: Final = 3
_MAX_GRAIN: Final = 16.0


# --- validation ------------------------------------------------------------------------


def _rgb(name: str, img: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Validate an (H, W, 3) uint8 or float RGB image."""
    if not isinstance(img, np.ndarray) or not (
        img.dtype == np.uint8 or np.issubdtype(img.dtype, np.floating)
    ):
        raise InvalidArgumentError(f"{name} must be a uint8 or float array")
    if img.ndim != 3 or img.shape[2] != 3:
        raise InvalidArgumentError(f"{name} must be (H, W, 3) RGB, not {img.shape}")
    return img


def _unchanged(src: npt.NDArray[Any]) -> npt.NDArray[Any]:
    return src.copy() if src.dtype == np.uint8 else np.clip(src, 0, 255).astype(np.float32)


def _finish(out: npt.NDArray[Any], like: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """0..255 float result → uint8 (rounded) if ``like`` is uint8, else float32."""
    clipped = np.clip(np.asarray(out, dtype=np.float32), 0, 255)
    if like.dtype == np.uint8:
        return np.rint(clipped).astype(np.uint8)
    return clipped


def _weights(name: str, mask: npt.NDArray[Any], shape: tuple[int, ...]) -> F32:
    """Mask → (H, W) float32 weights in [0, 1] (uint8 is read as 0..255)."""
    m = np.asarray(mask)
    if m.ndim == 3 and m.shape[2] == 1:
        m = m[..., 0]
    if m.shape != shape[:2]:
        raise InvalidArgumentError(f"{name} shape {m.shape} does not match image {shape[:2]}")
    if m.dtype == np.uint8:
        return m.astype(np.float32) / np.float32(255.0)
    return np.clip(m.astype(np.float32), 0.0, 1.0)


def _strength(strength: float) -> float:
    s = float(strength)
    if not 0.0 <= s <= 1.0:
        raise InvalidArgumentError(f"strength must be in [0, 1], not {strength}")
    return s


# --- colour --------------------------------------------------------------------------------


def rgb_to_lab(rgb: npt.NDArray[Any]) -> F32:
    """(H, W, 3) RGB (uint8 or float 0..255) → float32 L*a*b* (L 0..100, a/b ≈ ±127), D65."""
    return np.asarray(
        cv2.cvtColor(
            np.clip(rgb.astype(np.float32) * np.float32(1.0 / 255.0), 0.0, 1.0), cv2.COLOR_RGB2Lab
        ),
        dtype=np.float32,
    )


def lab_to_rgb(lab: F32) -> F32:
    """Float32 L*a*b* → (H, W, 3) float32 RGB in 0..255 units (not clipped)."""
    rgb = cv2.cvtColor(lab.astype(np.float32), cv2.COLOR_Lab2RGB)
    return np.asarray(rgb, dtype=np.float32) * np.float32(255.0)


def masked_mean_std(values: npt.NDArray[Any], weights: F32) -> tuple[F64, F64]:
    """Weighted per-channel mean and standard deviation.

    Args:
        values: (H, W, C) any numeric dtype.
        weights: (H, W) float weights ≥ 0 (not all zero).

    Returns:
        Two (C,) float64 arrays.
    """
    w = weights.reshape(-1).astype(np.float64)
    v = values.reshape(w.size, -1).astype(np.float64)
    total = w.sum()
    # einsum, not BLAS: a (N,)·(N, C) product is memory-bound and BLAS threads only add
    # contention. E[x²] − E[x]² in float64 is exact enough for 8-bit-range data.
    mean: F64 = np.einsum("i,ij->j", w, v) / total
    var: F64 = np.einsum("i,ij,ij->j", w, v, v) / total - mean * mean
    return mean, np.sqrt(np.maximum(var, 0.0))


def match_color_lab(
    src: npt.NDArray[Any],
    ref: npt.NDArray[Any],
    mask_src: npt.NDArray[Any],
    mask_ref: npt.NDArray[Any],
    strength: float = 1.0,
) -> npt.NDArray[Any]:
    """Reinhard colour transfer in L*a*b*, statistics measured inside the masks.

    Args:
        src: (H, W, 3) RGB to recolour (uint8, or float 0..255).
        ref: (H', W', 3) RGB whose colours to take (any size).
        mask_src: (H, W) weights of the src pixels to measure (float [0, 1],
            bool, or uint8 0..255).
        mask_ref: (H', W') weights of the ref pixels to measure.
        strength: 0 (src unchanged) .. 1 (full transfer), linear in L*a*b*.

    Returns:
        (H, W, 3) RGB of ``src``'s kind (see module doc): all of ``src``
        transformed, clipped to the RGB gamut. Unchanged (a copy) if a mask has
        fewer than :data:`MIN_MASK_PIXELS` pixels of weight.
    """
    _rgb("src", src)
    _rgb("ref", ref)
    s = _strength(strength)
    ws = _weights("mask_src", mask_src, src.shape)
    wr = _weights("mask_ref", mask_ref, ref.shape)
    if s == 0.0 or ws.sum() < MIN_MASK_PIXELS or wr.sum() < MIN_MASK_PIXELS:
        return _unchanged(src)
    lab_s = rgb_to_lab(src)
    lab_r = rgb_to_lab(ref)
    mu_s, sd_s = masked_mean_std(lab_s, ws)
    mu_r, sd_r = masked_mean_std(lab_r, wr)
    ratio = np.clip(sd_r / np.maximum(sd_s, 1e-6), _RATIO_MIN, _RATIO_MAX)
    # x + s·(T(x) − x) with T(x) = (x − μs)·ratio + μr, as one affine per channel.
    gain = (1.0 - s) + s * ratio
    offset = s * (mu_r - mu_s * ratio)
    out = lab_s * gain.astype(np.float32) + offset.astype(np.float32)
    return _finish(lab_to_rgb(out), src)


def match_histogram(
    src: npt.NDArray[Any],
    ref: npt.NDArray[Any],
    mask_src: npt.NDArray[Any],
    mask_ref: npt.NDArray[Any],
    strength: float = 1.0,
) -> npt.NDArray[Any]:
    """Per-channel (R, G, B) histogram matching, histograms measured inside the masks.

    Each channel value ``v`` of ``src`` goes to the reference value with the
    same (weighted) cumulative frequency; ``strength`` mixes the mapping with
    the identity. Float inputs are binned at integer levels and mapped by
    linear interpolation of the lookup table. Arguments and return as in
    :func:`match_color_lab`.
    """
    _rgb("src", src)
    _rgb("ref", ref)
    s = _strength(strength)
    ws = _weights("mask_src", mask_src, src.shape).reshape(-1)
    wr = _weights("mask_ref", mask_ref, ref.shape).reshape(-1)
    if s == 0.0 or ws.sum() < MIN_MASK_PIXELS or wr.sum() < MIN_MASK_PIXELS:
        return _unchanged(src)
    levels = np.arange(256, dtype=np.float64)
    src_bins = _bins(src)
    ref_bins = _bins(ref)
    out = np.empty(src.shape, dtype=np.float32)
    for c in range(3):
        hs = np.bincount(src_bins[..., c].reshape(-1), weights=ws, minlength=256)
        hr = np.bincount(ref_bins[..., c].reshape(-1), weights=wr, minlength=256)
        # Mid-point CDFs: each level sits at the middle of its probability mass.
        cs = (np.cumsum(hs) - 0.5 * hs) / hs.sum()
        cr = (np.cumsum(hr) - 0.5 * hr) / hr.sum()
        present = hr > 0
        lut = np.interp(cs, cr[present], levels[present])
        lut = levels + s * (lut - levels)
        if src.dtype == np.uint8:
            out[..., c] = lut[src[..., c]]
        else:
            out[..., c] = np.interp(src[..., c], levels, lut)
    return _finish(out, src)


def _bins(img: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    bins: npt.NDArray[np.intp] = np.clip(np.rint(img), 0, 255).astype(np.intp)
    return bins


# --- sharpness and grain ---------------------------------------------------------------------


def _luma(rgb: npt.NDArray[Any]) -> F32:
    """Luma (OpenCV's RGB2GRAY weights) in 0..255 units, float32."""
    return np.asarray(cv2.cvtColor(rgb.astype(np.float32), cv2.COLOR_RGB2GRAY), dtype=np.float32)


def _measure_mask(mask: npt.NDArray[Any], shape: tuple[int, ...]) -> npt.NDArray[np.bool_]:
    binary = (_weights("mask", mask, shape) > 0.5).astype(np.uint8)
    k = 2 * _MEASURE_ERODE + 1
    eroded = cv2.erode(
        binary,
        np.ones((k, k), np.uint8),
        borderType=cv2.BORDER_CONSTANT,
        borderValue=0,
    )
    return np.asarray(eroded, dtype=bool)


_IMMERKAER = np.array([[1, -2, 1], [-2, 4, -2], [1, -2, 1]], dtype=np.float32)


def _on(values: npt.NDArray[Any], where: npt.NDArray[np.bool_],
        sampled: bool) -> npt.NDArray[Any]:
    """``values`` on ``where``; ``sampled``: read on every other row and column only
    (the filter responses are stationary over a face's skin, and a quarter of its
    pixels give the same robust statistics, to well under 1% on the samples, at a
    quarter of the cost of the median's partition), all of ``where`` when that
    quarter has fewer than :data:`MIN_MASK_PIXELS` pixels."""
    if sampled:
        out: npt.NDArray[Any] = values[::2, ::2][where[::2, ::2]]
        if out.size >= MIN_MASK_PIXELS:
            return out
    full: npt.NDArray[Any] = values[where]
    return full


def _noise_sigma_luma(luma: F32, where: npt.NDArray[np.bool_], sampled: bool = False) -> float:
    r = cv2.filter2D(luma, cv2.CV_32F, _IMMERKAER, borderType=cv2.BORDER_REFLECT_101)
    return float(median(np.abs(_on(r, where, sampled)))) / (0.6745 * 6.0)


def _laplacian_var(luma: F32, where: npt.NDArray[np.bool_], sampled: bool = False) -> float:
    lap = cv2.Laplacian(luma, cv2.CV_32F, ksize=1, borderType=cv2.BORDER_REFLECT_101)
    return float(np.var(_on(lap, where, sampled).astype(np.float64)))


def _detail(luma: F32, where: npt.NDArray[np.bool_], sampled: bool = False
            ) -> tuple[float, float]:
    """(detail energy in grey-level² after removing noise, noise σ in grey levels)."""
    sigma = _noise_sigma_luma(luma, where, sampled)
    return (max(0.0, _laplacian_var(luma, where, sampled) - _LAPLACIAN_NOISE_GAIN * sigma**2),
            sigma)


def noise_sigma(rgb: npt.NDArray[Any], mask: npt.NDArray[Any]) -> float:
    """Robust estimate of white-noise σ (grey levels) of the luma inside ``mask``.

    Args:
        rgb: (H, W, 3) RGB, uint8 or float 0..255.
        mask: (H, W) weights; pixels > 0.5, eroded by 3 px, are measured.
    """
    where = _measure_mask(mask, _rgb("rgb", rgb).shape)
    if where.sum() < MIN_MASK_PIXELS:
        raise InvalidArgumentError("the mask is too small to measure noise")
    return _noise_sigma_luma(_luma(rgb), where)


def detail_energy(rgb: npt.NDArray[Any], mask: npt.NDArray[Any]) -> float:
    """Laplacian variance of the luma inside ``mask`` minus its noise part (grey level²).

    Larger is sharper. Same arguments as :func:`noise_sigma`.
    """
    where = _measure_mask(mask, _rgb("rgb", rgb).shape)
    if where.sum() < MIN_MASK_PIXELS:
        raise InvalidArgumentError("the mask is too small to measure sharpness")
    return _detail(_luma(rgb), where)[0]


#: Bisection steps for the blur σ, then a linear reading of the crossing inside the
#: last bracket (max_blur / 2**4 = 0.25 px at the default): the detail energy is
#: smooth in σ: on the sample photos blurred by σ 0.6–3 the σ found is within 0.07 px
#: (median 0.02) of six plain bisection steps.
BLUR_SEARCH_STEPS = 4


def _blur(img: F32, sigma: float) -> F32:
    if sigma <= 0.0:
        return img
    return np.asarray(
        cv2.GaussianBlur(img, (0, 0), sigmaX=sigma, borderType=cv2.BORDER_REFLECT_101),
        dtype=np.float32,
    )


def _reach_box(where: npt.NDArray[np.bool_], reach: float) -> tuple[slice, slice]:
    """The bounding box of ``where``'s True pixels grown by ``reach`` pixels,
    clipped to the image, as (row, column) slices."""
    x, y, w, h = cv2.boundingRect(where.view(np.uint8))
    m = int(np.ceil(reach))
    return (slice(max(0, y - m), min(where.shape[0], y + h + m)),
            slice(max(0, x - m), min(where.shape[1], x + w + m)))


def match_sharpness(
    src: npt.NDArray[Any],
    ref: npt.NDArray[Any],
    mask: npt.NDArray[Any],
    *,
    max_blur: float = 4.0,
    seed: int = 0,
) -> npt.NDArray[Any]:
    """Match ``src``'s detail and grain to ``ref``'s inside ``mask`` (see module doc).

    Args:
        src: (H, W, 3) RGB (uint8 or float 0..255), e.g. the warped source face region.
        ref: (H, W, 3) RGB, the target region it will be blended into.
        mask: (H, W) weights (> 0.5 is measured, after a 3 px erosion).
        max_blur: largest Gaussian σ in pixels applied to ``src``.
        seed: seed of the grain generator (same inputs + seed → same output).

    Returns:
        (H, W, 3) RGB of ``src``'s kind: ``src`` blurred if it was sharper than ``ref``,
        plus grain if ``ref`` is noisier. A copy of ``src`` when the mask has
        fewer than :data:`MIN_MASK_PIXELS` measurable pixels.
    """
    _rgb("src", src)
    _rgb("ref", ref)
    if src.shape != ref.shape:
        raise InvalidArgumentError(f"src {src.shape} and ref {ref.shape} must have the same shape")
    if not max_blur >= 0.0:
        raise InvalidArgumentError(f"max_blur must be >= 0, not {max_blur}")
    where = _measure_mask(mask, src.shape)
    if where.sum() < MIN_MASK_PIXELS:
        return _unchanged(src)
    # Every measurement reads the measured pixels and, through the blur and the 3×3
    # filters, their neighbourhood: on that box alone the figures are the same.
    box = _reach_box(where, 4.0 * max_blur + 3.0)
    where = where[box]
    # Its many measures read a quarter of the skin (see _on).
    target_detail, target_noise = _detail(_luma(ref[box]), where, True)

    out = src.astype(np.float32)
    luma = _luma(src[box])
    detail, _ = _detail(luma, where, True)
    if detail > target_detail * 1.05 and max_blur > 0.0:
        lo, hi = 0.0, float(max_blur)
        d_lo, d_hi = detail, _detail(_blur(luma, hi), where, True)[0]
        if d_hi > target_detail:
            sigma = hi
        else:
            for _ in range(BLUR_SEARCH_STEPS):
                mid = 0.5 * (lo + hi)
                d_mid = _detail(_blur(luma, mid), where, True)[0]
                if d_mid > target_detail:
                    lo, d_lo = mid, d_mid
                else:
                    hi, d_hi = mid, d_mid
            # The detail falls smoothly with σ: read the crossing off the last bracket.
            t = (d_lo - target_detail) / max(d_lo - d_hi, 1e-12)
            sigma = lo + float(np.clip(t, 0.0, 1.0)) * (hi - lo)
        out = _blur(out, sigma)

    current = _noise_sigma_luma(_luma(out[box]), where, True)
    if target_noise > current:
        grain = min(_MAX_GRAIN, float(np.sqrt(target_noise**2 - current**2)))
        rng = np.random.default_rng(seed)
        noise = rng.standard_normal(src.shape[:2], dtype=np.float32) * np.float32(grain)
        out = out + each_channel(noise, out.shape[2])
    return _finish(out, src)


#: Mean |R − G| + |G − B| (grey levels) under which an image is a black-and-white
#: photo (a grey JPEG's chroma noise stays well below it).
MONOCHROME_CHROMA = 2.0


def is_monochrome(rgb: np.ndarray) -> bool:
    """Whether the (H, W, 3) image is a black-and-white photo (read on every fourth
    pixel of every fourth row)."""
    sample = np.asarray(rgb[::4, ::4], np.int16)
    chroma = (np.abs(sample[..., 0] - sample[..., 1])
              + np.abs(sample[..., 1] - sample[..., 2]))
    return bool(chroma.size) and float(chroma.mean()) < MONOCHROME_CHROMA
