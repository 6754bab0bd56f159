"""The pixel path's median: numpy's to the bit, on every dtype and axis it meets."""

from __future__ import annotations

import numpy as np
import pytest

from facefuse.imaging.stats import SORT_BELOW, median


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8, np.int64])
@pytest.mark.parametrize("shape", [(1,), (2,), (7,), (300,), (41, 3), (12, 17), (5000,)])
def test_median_is_numpys(dtype: type, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    a: np.ndarray = (rng.random(shape) * 255).astype(dtype)
    for axis in [None, *range(len(shape))]:
        ours, theirs = median(a, axis=axis), np.median(a, axis=axis)
        assert np.asarray(ours).dtype == np.asarray(theirs).dtype
        assert np.array_equal(ours, theirs), (dtype, shape, axis)


def test_small_inputs_are_sorted_and_large_ones_partitioned() -> None:
    """Both sides of the switch give the same answer on the same data."""
    a = np.arange(SORT_BELOW + 2, dtype=np.float32)[::-1].copy()
    assert median(a) == np.median(a)
    assert median(a[:SORT_BELOW]) == np.median(a[:SORT_BELOW])
