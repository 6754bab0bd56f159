"""Colour transfer (L*a*b* statistics, histograms) and sharpness/grain matching on real photos."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from facefuse.errors import InvalidArgumentError
from facefuse.imaging.color import (
    detail_energy,
    masked_mean_std,
    match_color_lab,
    match_histogram,
    match_sharpness,
    noise_sigma,
    rgb_to_lab,
)


def _ellipse_mask(h: int, w: int) -> np.ndarray:
    m = np.zeros((h, w), np.float32)
    cv2.ellipse(m, (w // 2, h // 2), (w // 3, int(h / 2.4)), 0, 0, 360, 1.0, -1)
    return m


@pytest.fixture(scope="module")
def faces(sample_images: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Face-centred crops of the sample photos (RGB uint8)."""
    return {
        "obama": np.ascontiguousarray(sample_images["obama"][60:400, 330:650]),
        "biden": np.ascontiguousarray(sample_images["biden"][110:530, 390:750]),
        "astronaut": np.ascontiguousarray(sample_images["astronaut"][30:200, 160:290]),
    }


def _lab_stats(rgb: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return masked_mean_std(rgb_to_lab(rgb), mask)


# --- L*a*b* transfer ------------------------------------------------------------------------------


@pytest.mark.parametrize(("src_name", "ref_name"), [("obama", "biden"), ("biden", "astronaut")])
def test_lab_transfer_matches_the_reference_statistics(
    faces: dict[str, np.ndarray], src_name: str, ref_name: str
) -> None:
    src, ref = faces[src_name], faces[ref_name]
    ms, mr = _ellipse_mask(*src.shape[:2]), _ellipse_mask(*ref.shape[:2])
    mu_s, _ = _lab_stats(src, ms)
    mu_r, sd_r = _lab_stats(ref, mr)
    assert np.abs(mu_s - mu_r).max() > 3.0  # the photos really differ

    out = match_color_lab(src, ref, ms, mr)
    assert out.dtype == np.uint8
    assert out.shape == src.shape
    mu_o, sd_o = _lab_stats(out, ms)
    np.testing.assert_allclose(mu_o, mu_r, atol=0.5)
    np.testing.assert_allclose(sd_o, sd_r, rtol=0.03)


def test_lab_strength_is_linear(faces: dict[str, np.ndarray]) -> None:
    src, ref = faces["obama"], faces["biden"]
    ms, mr = _ellipse_mask(*src.shape[:2]), _ellipse_mask(*ref.shape[:2])
    mu_s, _ = _lab_stats(src, ms)
    mu_r, _ = _lab_stats(ref, mr)
    half = match_color_lab(src, ref, ms, mr, strength=0.5)
    mu_h, _ = _lab_stats(half, ms)
    np.testing.assert_allclose(mu_h, 0.5 * (mu_s + mu_r), atol=1.0)
    np.testing.assert_array_equal(match_color_lab(src, ref, ms, mr, strength=0.0), src)


def test_lab_transfer_accepts_float_and_returns_float(faces: dict[str, np.ndarray]) -> None:
    src, ref = faces["obama"], faces["biden"]
    ms, mr = _ellipse_mask(*src.shape[:2]), _ellipse_mask(*ref.shape[:2])
    as_u8 = match_color_lab(src, ref, ms, mr)
    as_f = match_color_lab(src.astype(np.float32), ref.astype(np.float32), ms, mr)
    assert as_f.dtype == np.float32
    assert as_f.min() >= 0.0
    assert as_f.max() <= 255.0
    assert np.abs(np.rint(as_f) - as_u8).max() <= 1


def test_only_masked_pixels_are_measured(faces: dict[str, np.ndarray]) -> None:
    src, ref = faces["obama"], faces["biden"]
    ms, mr = _ellipse_mask(*src.shape[:2]), _ellipse_mask(*ref.shape[:2])
    wrecked = ref.copy()
    wrecked[mr == 0] = (0, 255, 0)  # garbage outside the reference mask
    np.testing.assert_array_equal(
        match_color_lab(src, wrecked, ms, mr), match_color_lab(src, ref, ms, mr)
    )


def test_empty_masks_leave_src_unchanged(faces: dict[str, np.ndarray]) -> None:
    src, ref = faces["obama"], faces["biden"]
    empty = np.zeros(src.shape[:2], np.float32)
    out = match_color_lab(src, ref, empty, _ellipse_mask(*ref.shape[:2]))
    np.testing.assert_array_equal(out, src)
    assert out is not src


# --- histograms -----------------------------------------------------------------------------------


def test_histogram_matching_matches_masked_channel_distributions(
    faces: dict[str, np.ndarray],
) -> None:
    src, ref = faces["obama"], faces["astronaut"]
    ms, mr = _ellipse_mask(*src.shape[:2]), _ellipse_mask(*ref.shape[:2])
    out = match_histogram(src, ref, ms, mr)
    assert out.dtype == np.uint8
    before = np.abs(np.array(masked_mean_std(src, ms)) - np.array(masked_mean_std(ref, mr)))
    after = np.abs(np.array(masked_mean_std(out, ms)) - np.array(masked_mean_std(ref, mr)))
    assert before.max() > 10
    assert after.max() < 2.5
    for c in range(3):  # quartiles agree within a couple of levels
        q_out = np.percentile(out[..., c][ms > 0.5], [25, 50, 75])
        q_ref = np.percentile(ref[..., c][mr > 0.5], [25, 50, 75])
        np.testing.assert_allclose(q_out, q_ref, atol=3)
    as_f = match_histogram(src.astype(np.float32), ref, ms, mr)
    assert as_f.dtype == np.float32
    assert np.abs(as_f - out).max() <= 1.0


# --- sharpness and grain --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def region(sample_images: dict[str, np.ndarray]) -> np.ndarray:
    """A sharp, low-noise 256×256 real photo region."""
    return np.ascontiguousarray(sample_images["astronaut"][50:306, 150:406])


@pytest.mark.parametrize("sigma", [0.8, 1.5, 2.5])
def test_a_sharper_source_is_blurred_to_the_reference(region: np.ndarray, sigma: float) -> None:
    mask = np.ones(region.shape[:2], np.float32)
    ref = cv2.GaussianBlur(region, (0, 0), sigma)
    assert detail_energy(region, mask) > 5 * detail_energy(ref, mask)
    out = match_sharpness(region, ref, mask)
    assert out.dtype == np.uint8
    assert detail_energy(out, mask) == pytest.approx(detail_energy(ref, mask), rel=0.25, abs=2.0)
    # It found (about) the blur that made the reference.
    assert np.abs(out.astype(int) - ref.astype(int)).mean() < 1.0


def test_noise_estimate_on_a_real_photo(region: np.ndarray) -> None:
    mask = np.ones(region.shape[:2], np.float32)
    rng = np.random.default_rng(11)
    base = noise_sigma(region, mask)  # the photo's own grain and fine texture
    assert base < 2.5
    for sigma in (3.0, 6.0, 10.0):
        grey_noise = rng.normal(0, sigma, region.shape[:2])[..., None]  # the same in R, G, B
        noisy = np.clip(region + grey_noise, 0, 255).astype(np.uint8)
        assert noise_sigma(noisy, mask) == pytest.approx(np.hypot(sigma, base), rel=0.12)
        # Independent noise per channel: luma keeps sqrt(0.299² + 0.587² + 0.114²) of it.
        colour_noise = rng.normal(0, sigma, region.shape)
        noisy = np.clip(region + colour_noise, 0, 255).astype(np.uint8)
        assert noise_sigma(noisy, mask) == pytest.approx(np.hypot(0.668 * sigma, base), rel=0.12)


def test_a_soft_source_gets_the_reference_grain(region: np.ndarray) -> None:
    mask = _ellipse_mask(*region.shape[:2])
    soft = cv2.GaussianBlur(region, (0, 0), 2.0)
    rng = np.random.default_rng(3)
    noisy = region.astype(np.float64) + rng.normal(0, 6.0, region.shape[:2])[..., None]
    ref = np.clip(noisy, 0, 255).astype(np.uint8)
    out = match_sharpness(soft, ref, mask, seed=1)
    assert noise_sigma(soft, mask) < 1.0
    assert noise_sigma(out, mask) == pytest.approx(noise_sigma(ref, mask), rel=0.15)
    # Grain only: the low frequencies are the soft source's.
    low = lambda x: cv2.GaussianBlur(x.astype(np.float32), (0, 0), 4.0)  # noqa: E731
    assert np.abs(low(out) - low(soft))[mask > 0.5].mean() < 0.5
    # Deterministic for a seed, different for another.
    np.testing.assert_array_equal(match_sharpness(soft, ref, mask, seed=1), out)
    assert not np.array_equal(match_sharpness(soft, ref, mask, seed=2), out)


def test_matching_sharpness_is_a_no_op_for_equal_images(region: np.ndarray) -> None:
    mask = np.ones(region.shape[:2], np.float32)
    np.testing.assert_array_equal(match_sharpness(region, region, mask), region)


def test_float_layers_as_the_fusion_engine_passes_them(region: np.ndarray) -> None:
    mask = np.ones(region.shape[:2], np.float32)
    src = region.astype(np.float32)
    ref = cv2.GaussianBlur(src, (0, 0), 1.5)
    out = match_sharpness(src, ref, mask)
    assert out.dtype == np.float32
    assert np.abs(out - ref).mean() < 1.0


def test_validation(region: np.ndarray) -> None:
    mask = np.ones(region.shape[:2], np.float32)
    with pytest.raises(InvalidArgumentError, match="same shape"):
        match_sharpness(region, region[:-1], mask)
    with pytest.raises(InvalidArgumentError, match="mask"):
        match_sharpness(region, region, mask[:-1])
    with pytest.raises(InvalidArgumentError, match="strength"):
        match_color_lab(region, region, mask, mask, strength=1.5)
    with pytest.raises(InvalidArgumentError, match="uint8 or float"):
        match_color_lab(region.astype(np.int32), region, mask, mask)
    with pytest.raises(InvalidArgumentError, match="too small"):
        noise_sigma(region, np.zeros_like(mask))
    tiny = np.zeros(region.shape[:2], np.float32)
    tiny[:4, :4] = 1
    np.testing.assert_array_equal(match_sharpness(region, region[::-1].copy(), tiny), region)
