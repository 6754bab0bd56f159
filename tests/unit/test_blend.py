"""Alpha, multi-band (Laplacian pyramid) and Poisson blending."""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from facefuse.errors import InvalidArgumentError
from facefuse.imaging.blend import (
    alpha_blend,
    alpha_blend_into,
    auto_levels,
    laplacian_blend,
    poisson_blend,
)


@pytest.fixture(scope="module")
def pair(sample_images: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Two different real 180×150 regions (fg from one photo, bg from another)."""
    fg = np.ascontiguousarray(sample_images["obama"][200:380, 300:450])
    bg = np.ascontiguousarray(sample_images["biden"][300:480, 400:550])
    return fg, bg


def _ellipse_mask(h: int, w: int) -> np.ndarray:
    m = np.zeros((h, w), np.float32)
    cv2.ellipse(m, (w // 2, h // 2), (w // 3, h // 3), 0, 0, 360, 1.0, -1)
    return m


# --- constant masks ----------------------------------------------------------------------------


@pytest.mark.parametrize("blend", [laplacian_blend, alpha_blend])
def test_all_zeros_is_bg_and_all_ones_is_fg_exactly(
    pair: tuple[np.ndarray, np.ndarray], blend: Callable[..., np.ndarray]
) -> None:
    fg, bg = pair
    zeros = np.zeros(fg.shape[:2], np.float32)
    ones = np.ones(fg.shape[:2], np.float32)
    out0 = blend(fg, bg, zeros)
    out1 = blend(fg, bg, ones)
    assert out0.dtype == np.uint8
    np.testing.assert_array_equal(out0, bg)
    np.testing.assert_array_equal(out1, fg)


def test_float_inputs_stay_float(pair: tuple[np.ndarray, np.ndarray]) -> None:
    fg, bg = (a.astype(np.float32) for a in pair)
    zeros = np.zeros(fg.shape[:2], np.float32)
    out0 = laplacian_blend(fg, bg, zeros)
    assert out0.dtype == np.float32
    np.testing.assert_array_equal(out0, bg)  # bit-exact, even in float
    out1 = laplacian_blend(fg, bg, np.ones(fg.shape[:2], np.float32))
    np.testing.assert_allclose(out1, fg, atol=1e-3)


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(1, 90),
    w=st.integers(1, 90),
    channels=st.sampled_from([None, 1, 3, 4]),
    levels=st.one_of(st.none(), st.integers(0, 9)),
    seed=st.integers(0, 2**32 - 1),
)
def test_constant_masks_on_any_shape(
    h: int, w: int, channels: int | None, levels: int | None, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    shape = (h, w) if channels is None else (h, w, channels)
    fg = rng.integers(0, 256, shape, dtype=np.uint8)
    bg = rng.integers(0, 256, shape, dtype=np.uint8)
    np.testing.assert_array_equal(laplacian_blend(fg, bg, np.zeros((h, w)), levels), bg)
    np.testing.assert_array_equal(laplacian_blend(fg, bg, np.ones((h, w)), levels), fg)
    mixed = laplacian_blend(fg, bg, rng.uniform(0, 1, (h, w)), levels)
    assert mixed.shape == shape
    assert mixed.dtype == np.uint8


# --- the seam ------------------------------------------------------------------------------------


def test_step_mask_between_flat_colours_is_smooth_without_overshoot() -> None:
    a = np.array([200, 40, 90], np.uint8)
    b = np.array([20, 220, 90], np.uint8)
    h, w = 64, 128
    fg = np.broadcast_to(a, (h, w, 3)).copy()
    bg = np.broadcast_to(b, (h, w, 3)).copy()
    mask = np.zeros((h, w), np.float32)
    mask[:, : w // 2] = 1.0
    out = laplacian_blend(fg, bg, mask).astype(int)
    lo = np.minimum(a, b).astype(int)
    hi = np.maximum(a, b).astype(int)
    assert np.all(out >= lo - 1)
    assert np.all(out <= hi + 1)
    assert np.all(out[:, :, 2] == 90)  # the shared channel stays put
    assert np.ptp(out, axis=0).max() <= 1  # every row the same
    row = out[h // 2, :, 0]
    assert row[0] == 200
    assert row[-1] == 20
    assert np.all(np.diff(row) <= 1)  # monotone from fg to bg (within rounding)
    jump = int(np.abs(np.diff(row)).max())
    assert jump < 180 / 4  # a transition, not a seam: the step is spread over many pixels
    transition = np.count_nonzero((row < 199) & (row > 21))
    assert transition >= 8
    # The plain alpha blend of the same inputs is the hard seam this avoids.
    hard = alpha_blend(fg, bg, mask)[h // 2, :, 0].astype(int)
    assert np.abs(np.diff(hard)).max() == 180


def test_multiband_keeps_detail_sharp_and_blends_colour_wide(
    pair: tuple[np.ndarray, np.ndarray],
) -> None:
    fg, bg = pair
    mask = _ellipse_mask(*fg.shape[:2])
    out = laplacian_blend(fg, bg, mask).astype(np.float32)
    inside = cv2.erode(mask, np.ones((25, 25), np.uint8)) > 0.5
    outside = cv2.dilate(mask, np.ones((25, 25), np.uint8)) < 0.5
    # Well inside the mask the fine detail is fg's, well outside it is bg's.
    hp = lambda x: x - cv2.GaussianBlur(x, (0, 0), 2.0)  # noqa: E731
    err_in = np.abs(hp(out) - hp(fg.astype(np.float32)))[inside].mean()
    err_out = np.abs(hp(out) - hp(bg.astype(np.float32)))[outside].mean()
    assert err_in < 1.0
    assert err_out < 1.0


def test_auto_levels() -> None:
    assert auto_levels(8, 500) == 0
    assert auto_levels(16, 16) == 1
    assert auto_levels(64, 64) == 3
    assert auto_levels(256, 300) == 5
    assert auto_levels(5000, 5000) == 8


def test_argument_validation(pair: tuple[np.ndarray, np.ndarray]) -> None:
    fg, bg = pair
    m = np.ones(fg.shape[:2])
    with pytest.raises(InvalidArgumentError, match="same shape"):
        laplacian_blend(fg, bg[:-1], m)
    with pytest.raises(InvalidArgumentError, match="mask"):
        laplacian_blend(fg, bg, m[:-1])
    with pytest.raises(InvalidArgumentError, match="levels"):
        laplacian_blend(fg, bg, m, levels=-1)
    with pytest.raises(InvalidArgumentError, match="mask"):
        alpha_blend(fg, bg, m[:, :-1])


def test_uint8_and_bool_masks(pair: tuple[np.ndarray, np.ndarray]) -> None:
    fg, bg = pair
    m = _ellipse_mask(*fg.shape[:2])
    ref = alpha_blend(fg, bg, m)
    np.testing.assert_array_equal(alpha_blend(fg, bg, (m * 255).astype(np.uint8)), ref)
    np.testing.assert_array_equal(alpha_blend(fg, bg, m > 0.5), ref)
    np.testing.assert_array_equal(alpha_blend(fg, bg, m[..., None]), ref)


# --- Poisson -------------------------------------------------------------------------------------


def test_poisson_removes_a_constant_offset(sample_images: dict[str, np.ndarray]) -> None:
    """Gradient-domain cloning keeps fg's gradients and bg's boundary: fg = bg + 30 → bg."""
    bg = sample_images["astronaut"]
    region = bg[100:220, 150:270].astype(np.int16)
    fg = np.clip(region + 30, 0, 255).astype(np.uint8)
    mask = _ellipse_mask(120, 120)
    out = poisson_blend(fg, bg, mask, center=(150 + 60, 100 + 60))
    inner = cv2.erode(mask, np.ones((9, 9), np.uint8)) > 0.5
    d_bg = np.abs(out[100:220, 150:270].astype(int) - region)[inner].mean()
    d_fg = np.abs(out[100:220, 150:270].astype(int) - fg.astype(int))[inner].mean()
    assert d_bg < 5.0
    assert d_fg > 20.0
    # Outside the mask's bounding box the background is untouched.
    untouched = np.ones(bg.shape[:2], bool)
    untouched[100:220, 150:270] = False
    np.testing.assert_array_equal(out[untouched], bg[untouched])


def test_poisson_placement_is_exact(sample_images: dict[str, np.ndarray]) -> None:
    bg = sample_images["astronaut"]
    fg = bg[60:141, 200:301].copy()  # odd sizes: 81×101
    mask = np.zeros(fg.shape[:2], np.float32)
    mask[10:70, 15:90] = 1.0
    good = poisson_blend(fg, bg, mask, center=(200 + 101 / 2, 60 + 81 / 2))
    assert np.abs(good.astype(int) - bg.astype(int)).max() <= 2
    off = poisson_blend(fg, bg, mask, center=(200 + 101 / 2 + 2, 60 + 81 / 2))
    assert np.abs(off.astype(int) - bg.astype(int)).max() > 20


def test_poisson_mask_touching_the_border_and_patch_past_the_edge(
    sample_images: dict[str, np.ndarray],
) -> None:
    bg = sample_images["astronaut"]
    padded = cv2.copyMakeBorder(bg, 40, 40, 40, 40, cv2.BORDER_REFLECT_101)
    # A full-ones patch covering the top-left corner and hanging 40 px past it.
    fg = np.clip(padded[0:140, 0:140].astype(int) + 25, 0, 255).astype(np.uint8)
    out = poisson_blend(fg, bg, np.ones((140, 140), np.float32), center=(-40 + 70, -40 + 70))
    assert out.shape == bg.shape
    corner = np.abs(out[:100, :100].astype(int) - bg[:100, :100].astype(int))
    assert corner.mean() < 3.0  # offset removed right up to the image edge
    np.testing.assert_array_equal(out[:, 110:], bg[:, 110:])
    # Aligned same-size use, full mask touching every border.
    same = poisson_blend(bg, bg, np.ones(bg.shape[:2]))
    assert np.abs(same.astype(int) - bg.astype(int)).max() <= 2


def test_poisson_accepts_float_and_handles_empty_masks(
    pair: tuple[np.ndarray, np.ndarray],
) -> None:
    fg, bg = pair
    empty = poisson_blend(fg, bg, np.zeros(fg.shape[:2]))
    np.testing.assert_array_equal(empty, bg)
    off_image = poisson_blend(fg, bg, np.ones(fg.shape[:2]), center=(-500, -500))
    np.testing.assert_array_equal(off_image, bg)
    m = _ellipse_mask(*fg.shape[:2])
    as_float = poisson_blend(fg.astype(np.float32), bg.astype(np.float32), m)
    np.testing.assert_array_equal(as_float, poisson_blend(fg, bg, m))
    with pytest.raises(InvalidArgumentError, match="same shape"):
        poisson_blend(fg[:-1], bg, m[:-1])


def test_overwriting_fg_gives_the_same_blend(pair: tuple[np.ndarray, np.ndarray]) -> None:
    """``overwrite_fg`` works the difference out in a float32 ``fg`` itself: the same
    pixels as the copy (a uint8 ``fg`` is left alone)."""
    fg, bg = pair
    rng = np.random.default_rng(5)
    mask = rng.uniform(0, 1, fg.shape[:2]).astype(np.float32)
    f32 = fg.astype(np.float32) + np.float32(0.25)
    expected = laplacian_blend(f32, bg, mask)
    given = f32.copy()
    np.testing.assert_array_equal(laplacian_blend(given, bg, mask, overwrite_fg=True), expected)
    assert not np.array_equal(given, f32)  # it held the difference
    u8 = fg.copy()
    np.testing.assert_array_equal(laplacian_blend(u8, bg, mask, overwrite_fg=True),
                                  laplacian_blend(fg, bg, mask))
    np.testing.assert_array_equal(u8, fg)


@pytest.mark.parametrize("mask_kind", ["float", "uint8", "bool"])
def test_alpha_blend_into_writes_the_blend_in_place(pair: tuple[np.ndarray, np.ndarray],
                                                   mask_kind: str) -> None:
    """Written into a float32 background (a view of a larger image too): the float32
    ``bg + m·(fg − bg)`` to the bit, with a uint8 or a float foreground, the mask's
    weights as :func:`alpha_blend` documents them; nothing outside the view moves.
    :func:`alpha_blend` itself is this on a float32 copy of its background."""
    fg, bg = pair
    rng = np.random.default_rng(9)
    m = rng.uniform(-0.2, 1.2, fg.shape[:2]).astype(np.float32)
    u8 = (np.clip(m, 0, 1) * 255).astype(np.uint8)
    masks: dict[str, tuple[np.ndarray, np.ndarray]] = {
        "float": (m, np.clip(m, 0, 1)),
        "bool": (m > 0.5, (m > 0.5).astype(np.float32)),
        "uint8": (u8, u8.astype(np.float32) * np.float32(1 / 255))}
    mask, weight = masks[mask_kind]
    w3 = np.repeat(weight[..., None], 3, axis=2)
    base = bg.astype(np.float32) * np.float32(1.01) - np.float32(0.3)
    for front in (fg, fg.astype(np.float32) + np.float32(0.7)):
        expected = base + w3 * (front.astype(np.float32) - base)
        big = np.zeros((base.shape[0] + 4, base.shape[1] + 6, 3), np.float32)
        into = big[2:-2, 3:-3]
        into[:] = base
        alpha_blend_into(front, into, mask)
        np.testing.assert_array_equal(into, expected)
        assert not big[:2].any() and not big[:, :3].any()
        np.testing.assert_array_equal(alpha_blend(front, base, mask), expected)
    with pytest.raises(InvalidArgumentError, match="float32"):
        alpha_blend_into(fg, bg.copy(), m)
