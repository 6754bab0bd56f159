"""Temporal smoothing that steadies what is still and follows what moves.

:class:`OneEuroFilter` is Casiez, Roussel and Vogel's 1€ filter (CHI 2012), over
arrays: a low-pass whose cut-off rises with the signal's speed, so a still face
loses its jitter (cut-off ``min_cutoff`` Hz) while a turning head is followed
without lag (cut-off ``min_cutoff + beta × speed``). Speeds are divided by a
caller-given ``scale`` (the face's size, pixels) so one tuning fits a face of
60 px and one of 600 px.

:class:`ToneStabiliser` steadies the fused face's overall colour between
frames: whatever renderer made the layer, its mean colour under the mask goes
through a 1€ filter and the layer is scaled to the filtered colour (bounded
gains), so the per-frame colour and lighting fit does not flicker, while a real
lighting change in the clip (fast, large) passes through.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["OneEuroFilter", "ToneStabiliser"]


def _alpha(cutoff: np.ndarray | float, dt: float) -> np.ndarray:
    tau = 1.0 / (2.0 * math.pi * np.asarray(cutoff, np.float64))
    out: np.ndarray = 1.0 / (1.0 + tau / dt)
    return out


@dataclass
class OneEuroFilter:
    """The 1€ filter over arrays of any shape (each element filtered on its own).

    Attributes:
        min_cutoff: cut-off at rest, Hz (lower: steadier still faces).
        beta: how fast the cut-off rises with speed, per (scale units / s).
        d_cutoff: cut-off of the speed estimate, Hz.
    """

    min_cutoff: float = 1.0
    beta: float = 0.5
    d_cutoff: float = 1.0
    _x: np.ndarray | None = field(default=None, repr=False)
    _dx: np.ndarray | None = field(default=None, repr=False)
    _t: float | None = field(default=None, repr=False)

    def reset(self) -> None:
        """Forget the past (a cut: the next value passes through)."""
        self._x = self._dx = None
        self._t = None

    def __call__(self, x: np.ndarray, t: float, scale: float = 1.0) -> np.ndarray:
        """The filtered ``x`` (float64, ``x``'s shape) at time ``t`` seconds.

        ``scale``: the size speeds are measured in (e.g. a face's width, pixels).
        A repeated or earlier ``t`` returns the last value unchanged.
        """
        x = np.asarray(x, np.float64)
        if self._x is None or self._t is None or self._x.shape != x.shape:
            self._x, self._dx, self._t = x.copy(), np.zeros_like(x), t
            return x.copy()
        dt = t - self._t
        if dt <= 0:
            return self._x.copy()
        assert self._dx is not None
        dx = (x - self._x) / dt
        a_d = _alpha(self.d_cutoff, dt)
        self._dx = self._dx + a_d * (dx - self._dx)
        speed = np.abs(self._dx) / max(scale, 1e-6)
        a = _alpha(self.min_cutoff + self.beta * speed, dt)
        self._x = self._x + a * (x - self._x)
        self._t = t
        return self._x.copy()


#: Bounds on the colour gain the stabiliser applies per channel.
GAIN_RANGE = (0.85, 1.18)


@dataclass
class ToneStabiliser:
    """Steadies a rendered layer's mean colour over time (see the module docstring).

    The tone is filtered in units of grey levels (scale 255), with a high ``beta``:
    a change of a tenth of the range within a frame passes almost unfiltered.
    """

    filter: OneEuroFilter = field(
        default_factory=lambda: OneEuroFilter(min_cutoff=0.6, beta=20.0, d_cutoff=1.0))

    def reset(self) -> None:
        self.filter.reset()

    def __call__(self, face: np.ndarray, mask: np.ndarray, t: float) -> np.ndarray:
        """``face`` (h, w, 3) float32 0..255 scaled so its mask-weighted mean colour
        follows the filtered one; ``mask`` (h, w) float32 in [0, 1]. Returns a new
        array (the input is not changed)."""
        # The mean colour from every other pixel in each direction (the same mean, a
        # quarter of the work).
        w = np.asarray(mask, np.float32)[::2, ::2]
        total = float(w.sum())
        if total < 1.0:
            return face
        sub = np.asarray(face, np.float32)[::2, ::2]
        mean = np.einsum("hw,hwc->c", w, sub) / total
        target = self.filter(mean, t, scale=255.0)
        gain = np.clip(target / np.maximum(mean, 1.0), *GAIN_RANGE).astype(np.float32)
        out: np.ndarray = np.asarray(face, np.float32) * gain
        return out
