"""Blending a foreground into a background under a soft mask.

All three functions work on region images (crop, blend, paste back), never on a
whole frame unless that is the region.

* :func:`alpha_blend` — ``bg + m·(fg − bg)`` per pixel (:func:`alpha_blend_into`:
  the same, in place).
* :func:`laplacian_blend` — Burt & Adelson multi-band blending: each band of a
  Laplacian pyramid is blended with the mask's Gaussian pyramid at the same
  scale, so low frequencies (colour, shading) mix over a wide zone and fine
  detail over a narrow one. Written as ``bg + collapse(G(m) · L(fg − bg))``,
  which equals the textbook ``collapse(G(m)·L(fg) + (1 − G(m))·L(bg))`` by
  linearity, needs one pyramid instead of two and returns ``bg`` bit-exactly
  where the blended difference is zero.
* :func:`poisson_blend` — gradient-domain (Pérez et al.) cloning through
  :func:`cv2.seamlessClone`, wrapped so masks may touch the patch border and
  patches may hang over the background's edge.

dtypes: when ``fg`` and ``bg`` are both uint8 the result is uint8 (rounded,
clipped); otherwise float32 in the inputs' units (not clipped).
"""

from __future__ import annotations

import math
from typing import Any, Final

import cv2
import numpy as np
import numpy.typing as npt

from facefuse.errors import InvalidArgumentError
from facefuse.imaging.channels import each_channel

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]

#: Coarsest level of an automatic pyramid is at least this many pixels on its short side.
_TOP_LEVEL_MIN_SIDE: Final = 8
_MAX_LEVELS: Final = 8
#: Border added around patches for :func:`poisson_blend`, in pixels.
_POISSON_MARGIN: Final = 2


def _mask_f32(mask: npt.NDArray[Any], shape: tuple[int, ...]) -> F32:
    m = np.asarray(mask)
    if m.ndim == 3 and m.shape[2] == 1:
        m = m[..., 0]
    if m.shape != shape[:2]:
        raise InvalidArgumentError(f"mask shape {m.shape} does not match image shape {shape[:2]}")
    if m.dtype == np.uint8:
        return m.astype(np.float32) * np.float32(1.0 / 255.0)
    if m.dtype == np.bool_:
        return m.astype(np.float32)
    return np.clip(m.astype(np.float32), 0.0, 1.0)


def _check_pair(fg: npt.NDArray[Any], bg: npt.NDArray[Any]) -> None:
    if fg.shape != bg.shape:
        raise InvalidArgumentError(f"fg {fg.shape} and bg {bg.shape} must have the same shape")
    if fg.ndim not in (2, 3) or fg.shape[0] == 0 or fg.shape[1] == 0:
        raise InvalidArgumentError(f"images must be (H, W) or (H, W, C), not {fg.shape}")


def _finish(out: F32, fg: npt.NDArray[Any], bg: npt.NDArray[Any]) -> npt.NDArray[Any]:
    if fg.dtype == np.uint8 and bg.dtype == np.uint8:
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out


def _expand(m: F32, like: npt.NDArray[Any]) -> F32:
    """The (H, W) mask ``m`` in each channel of ``like`` (H, W[, C])."""
    return each_channel(m, like.shape[2]) if like.ndim == 3 else m


def alpha_blend(
    fg: npt.NDArray[Any], bg: npt.NDArray[Any], mask: npt.NDArray[Any]
) -> npt.NDArray[Any]:
    """Per-pixel ``bg + m·(fg − bg)``.

    Args:
        fg, bg: (H, W) or (H, W, C), uint8 or float, same shape.
        mask: (H, W) or (H, W, 1) weights of ``fg``: float in [0, 1] (clipped),
            bool, or uint8 0..255.

    Returns:
        Same shape; uint8 if both inputs are uint8 (``bg`` exactly where m = 0,
        ``fg`` exactly where m = 1), else float32.
    """
    out: F32 = bg.astype(np.float32)
    alpha_blend_into(fg, out, mask)
    return _finish(out, fg, bg)


def alpha_blend_into(fg: npt.NDArray[Any], bg: F32, mask: npt.NDArray[Any]) -> None:
    """:func:`alpha_blend` written into ``bg``, a float32 image (or view) the caller
    gives up: ``bg += m·(fg − bg)``, the same float32 sums to the bit, without a
    copy of ``bg`` or of the result beside it. ``fg``: uint8 or float, ``mask`` as
    for :func:`alpha_blend`."""
    _check_pair(fg, bg)
    if bg.dtype != np.float32:
        raise InvalidArgumentError(f"bg must be float32, not {bg.dtype}")
    m = _expand(_mask_f32(mask, fg.shape), fg)
    change = np.subtract(fg, bg, dtype=np.float32)
    change *= m
    bg += change


def auto_levels(height: int, width: int) -> int:
    """Pyramid depth for a region: halve until the short side would drop under 8 px.

    0 for regions under 16 px (then :func:`laplacian_blend` is an alpha blend),
    at most 8.
    """
    short = max(1, min(height, width))
    return max(0, min(_MAX_LEVELS, math.floor(math.log2(short / _TOP_LEVEL_MIN_SIDE))))


def laplacian_blend(
    fg: npt.NDArray[Any],
    bg: npt.NDArray[Any],
    mask: npt.NDArray[Any],
    levels: int | None = None,
    *,
    overwrite_fg: bool = False,
) -> npt.NDArray[Any]:
    """Multi-band (Burt–Adelson) blend of two same-size region images.

    Args:
        fg, bg: (H, W) or (H, W, C) (C ≤ 4), uint8 or float, same shape.
        mask: (H, W) or (H, W, 1) weights of ``fg`` (float in [0, 1], bool, or
            uint8 0..255); feathering it first is not needed, the pyramid does it.
        levels: number of pyramid reductions; None picks :func:`auto_levels`.
            0 is a plain alpha blend. Capped so the coarsest level keeps ≥ 1 px.
        overwrite_fg: ``fg`` is the caller's to give up: a float32 one holds the
            difference to ``bg`` (no full-size copy beside it).

    Returns:
        Same shape; uint8 when both inputs are uint8, else float32. With a mask
        of all zeros the result is ``bg`` exactly; with all ones, ``fg`` (uint8:
        exactly; float: to rounding error). Because every pyramid kernel is
        non-negative, blending two flat colours never overshoots their range.
    """
    _check_pair(fg, bg)
    if fg.ndim == 3 and fg.shape[2] > 4:
        raise InvalidArgumentError(f"at most 4 channels, not {fg.shape[2]}")
    h, w = fg.shape[:2]
    cap = math.floor(math.log2(min(h, w)))
    if levels is None:
        n = auto_levels(h, w)
    else:
        if isinstance(levels, bool) or not isinstance(levels, int) or levels < 0:
            raise InvalidArgumentError(f"levels must be a non-negative int, not {levels!r}")
        n = min(levels, cap)
    m = _mask_f32(mask, fg.shape)
    into = fg if overwrite_fg and fg.dtype == np.float32 and fg.flags.writeable else None
    diff = np.subtract(fg, bg, out=into, dtype=np.float32)
    if n == 0 or not np.any(m):
        out0: F32 = bg.astype(np.float32) + _expand(m, fg) * diff
        return _finish(out0, fg, bg)
    squeeze = fg.ndim == 3 and fg.shape[2] == 1  # OpenCV would drop that axis
    d2 = diff[..., 0] if squeeze else diff
    del diff  # (the pyramid holds its finest level: freed with it)
    acc = _pyramid_blend(d2, m, n)
    del d2
    # bg + acc, summed into acc (no float copy of bg beside it: the same sums).
    out: F32 = acc[..., None] if squeeze else acc
    np.add(out, bg, out=out, dtype=np.float32)
    return _finish(out, fg, bg)


def _pyramid_blend(diff: F32, mask: F32, n: int) -> F32:
    """``collapse(G(mask) · L(diff))`` with ``n`` reductions; diff (H, W[, C]) float32."""
    gauss_d: list[F32] = [diff]
    del diff  # (the list holds it, and lets go of each level once it is used)
    gauss_m: list[F32] = [mask]
    for _ in range(n):
        gauss_d.append(_f32(cv2.pyrDown(gauss_d[-1])))
        gauss_m.append(_f32(cv2.pyrDown(gauss_m[-1])))
    # Coarsest band first, then add each finer band while expanding (in place: at
    # the finest levels every temporary is a full-size float image).
    acc: F32 = _expand(gauss_m.pop(), gauss_d[n]) * gauss_d[n]
    for k in range(n - 1, -1, -1):
        size = (gauss_d[k].shape[1], gauss_d[k].shape[0])
        band = _f32(cv2.pyrUp(gauss_d.pop(), dstsize=size))
        np.subtract(gauss_d[k], band, out=band)
        band *= _expand(gauss_m.pop(), band)
        acc = _f32(cv2.pyrUp(acc, dstsize=size))
        acc += band
        del band
    return acc


def _to_u8(name: str, img: npt.NDArray[Any]) -> U8:
    if img.dtype == np.uint8:
        return img
    if not np.issubdtype(img.dtype, np.floating):
        raise InvalidArgumentError(f"{name} must be uint8 or float, not {img.dtype}")
    out: U8 = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return out


def _f32(a: npt.NDArray[Any]) -> F32:
    return np.asarray(a, dtype=np.float32)


def poisson_blend(
    fg: npt.NDArray[Any],
    bg: npt.NDArray[Any],
    mask: npt.NDArray[Any],
    center: tuple[float, float] | None = None,
    *,
    mixed: bool = False,
) -> U8:
    """Seamless (Poisson) cloning of ``fg`` into ``bg`` with :func:`cv2.seamlessClone`.

    Args:
        fg: (h, w, 3) patch, uint8 or float 0..255 (rounded and clipped to uint8).
        bg: (H, W, 3) background, uint8 or float 0..255 (not modified).
        mask: (h, w) region of ``fg`` to clone: pixels with weight > 0.5
            (float/bool) or > 127 (uint8). OpenCV erodes it by 3 px internally
            before taking source gradients.
        center: ``(cx, cy)`` background pixel where the patch centre lands: the
            patch's top-left pixel goes to ``(floor(cx - w/2 + 0.5), floor(cy - h/2 + 0.5))``.
            None: ``fg`` and ``bg`` are aligned (same size, top-left at 0, 0).
        mixed: use ``cv2.MIXED_CLONE`` (keep the stronger of both gradients).

    Returns:
        (H, W, 3) uint8: ``bg`` with the cloned region. Pixels outside the
        mask's bounding box are ``bg``'s exactly; inside the box but outside the
        mask the solution follows ``bg``'s gradients, so it stays close to ``bg``
        (the Poisson solve spans the whole box, as in OpenCV).

    Masks touching the patch border and patches reaching past the background's
    edge are handled by padding (OpenCV would drop the mask's outer ring or
    raise): the patch is padded by 2 px (mask 0) and the background by
    reflection, then the result is cropped back.
    """
    fg = _to_u8("fg", fg)
    bg = _to_u8("bg", bg)
    if fg.ndim != 3 or fg.shape[2] != 3 or bg.ndim != 3 or bg.shape[2] != 3:
        raise InvalidArgumentError(
            f"poisson_blend needs (H, W, 3) images, not {fg.shape}, {bg.shape}"
        )
    h, w = fg.shape[:2]
    H, W = bg.shape[:2]
    binary = _mask_f32(mask, fg.shape) > 0.5
    if center is None:
        if fg.shape != bg.shape:
            raise InvalidArgumentError("without a center, fg and bg must have the same shape")
        ox, oy = 0, 0
    else:
        ox = math.floor(float(center[0]) - w / 2 + 0.5)
        oy = math.floor(float(center[1]) - h / 2 + 0.5)
    # Drop the part of the mask that lands outside the background entirely.
    ys, xs = np.nonzero(binary)
    inside = (xs + ox >= 0) & (xs + ox < W) & (ys + oy >= 0) & (ys + oy < H)
    if not np.any(inside):
        return bg.copy()

    margin = _POISSON_MARGIN
    fg_p = cv2.copyMakeBorder(fg, margin, margin, margin, margin, cv2.BORDER_REFLECT_101)
    mask_p = np.zeros((h + 2 * margin, w + 2 * margin), dtype=np.uint8)
    mask_p[margin : margin + h, margin : margin + w][binary] = 255
    # Background padding so the whole padded patch lies inside it.
    pad = margin + 1 + max(0, -ox, -oy, ox + w - W, oy + h - H)
    bg_p = cv2.copyMakeBorder(bg, pad, pad, pad, pad, cv2.BORDER_REFLECT_101)
    # seamlessClone centres the mask's bounding box on `p`: roi = p - size // 2.
    bx, by, bw, bh = cv2.boundingRect(mask_p)
    tlx = ox + pad - margin + bx
    tly = oy + pad - margin + by
    p = (tlx + bw // 2, tly + bh // 2)
    flag = cv2.MIXED_CLONE if mixed else cv2.NORMAL_CLONE
    cloned = cv2.seamlessClone(fg_p, bg_p, mask_p, p, flag)
    out: U8 = np.ascontiguousarray(cloned[pad : pad + H, pad : pad + W])
    return out
