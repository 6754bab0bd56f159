"""The per-channel helpers give exactly what NumPy's broadcasting forms give."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.imaging.channels import copy_where, each_channel


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_each_channel_is_the_broadcast(rng: np.random.Generator, channels: int) -> None:
    weight = rng.random((37, 29), dtype=np.float32)
    image = rng.random((37, 29, channels), dtype=np.float32) * 255
    spread = each_channel(weight, channels)
    assert spread.shape == (37, 29, channels) and spread.dtype == np.float32
    np.testing.assert_array_equal(image * spread, image * weight[..., None])
    np.testing.assert_array_equal(image / np.maximum(spread, 1e-3),
                                  image / np.maximum(weight, 1e-3)[..., None])


def test_each_channel_of_a_view_and_of_bools(rng: np.random.Generator) -> None:
    big = rng.random((50, 60), dtype=np.float32)
    view = big[5:40:2, 3:50]  # not contiguous
    np.testing.assert_array_equal(each_channel(view)[..., 2], view)
    mask = big > 0.5
    spread = each_channel(mask)
    assert spread.dtype == np.bool_ and spread.shape == (50, 60, 3)
    assert all((spread[..., c] == mask).all() for c in range(3))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_copy_where_writes_in_place(rng: np.random.Generator, dtype: type) -> None:
    src: np.ndarray = (rng.random((40, 30, 3)) * 200).astype(dtype)
    where = rng.random((40, 30)) > 0.4
    expected: np.ndarray = np.zeros((40, 30, 3), dtype)
    np.copyto(expected, src, where=where[..., None])
    dst: np.ndarray = np.zeros((40, 30, 3), dtype)
    copy_where(dst, src, where)
    np.testing.assert_array_equal(dst, expected)
    # Into a view of a larger image: only the view's pixels change.
    canvas: np.ndarray = np.full((50, 40, 3), 7, dtype)
    copy_where(canvas[4:44, 6:36], src, where)
    np.testing.assert_array_equal(canvas[4:44, 6:36], np.where(where[..., None], src, 7))
    assert (canvas[:4] == 7).all() and (canvas[:, :6] == 7).all()


def test_copy_where_across_dtypes(rng: np.random.Generator) -> None:
    src = (rng.random((20, 10, 3)) * 255).astype(np.uint8)
    dst = np.zeros((20, 10, 3), np.float32)
    where = rng.random((20, 10)) > 0.5
    copy_where(dst, src, where)
    np.testing.assert_array_equal(dst, np.where(where[..., None], src.astype(np.float32), 0))


def test_copy_where_into_a_column_strided_view(rng: np.random.Generator) -> None:
    """A view OpenCV cannot write into (every other column) takes NumPy's path."""
    src = (rng.random((12, 8, 3)) * 255).astype(np.uint8)
    where = rng.random((12, 8)) > 0.5
    canvas = np.zeros((12, 16, 3), np.uint8)
    copy_where(canvas[:, ::2], src, where)
    np.testing.assert_array_equal(canvas[:, ::2], np.where(where[..., None], src, 0))
    assert (canvas[:, 1::2] == 0).all()
