"""Order statistics for the pixel path.

``numpy.median`` costs ~50 µs whatever its input's size on this path's small
arrays (a face's few hundred skin vertices, an iris's ring, one eye's skin): its
generic machinery, not the work. :func:`median` sorts small inputs instead and
hands large ones to numpy, with numpy's result to the bit.
"""

from __future__ import annotations

import numpy as np

#: Inputs of at most this many elements (along the reduced axis, times the rest)
#: are sorted; larger ones go to ``numpy.median`` (a partition, linear time).
SORT_BELOW = 4096


def median(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """``numpy.median(values, axis)`` for finite inputs: the middle element, or the
    mean of the two middle ones, along ``axis`` (all of ``values`` when None);
    float64 for integer inputs, the input's float type otherwise. An empty input
    gives NaN, as numpy's does (without its warning)."""
    a = np.asarray(values)
    if a.size > SORT_BELOW or a.size == 0:
        out: np.ndarray = np.asarray(np.median(a, axis=axis))
        return out
    if axis is None:
        a = a.reshape(-1)
        axis = 0
    if not np.issubdtype(a.dtype, np.floating):
        a = a.astype(np.float64)
    s = np.sort(a, axis=axis)
    n = s.shape[axis]
    k = n // 2
    hi = np.take(s, k, axis=axis)
    if n % 2:
        return np.asarray(hi)
    lo = np.take(s, k - 1, axis=axis)
    return np.asarray((lo + hi) / s.dtype.type(2))
