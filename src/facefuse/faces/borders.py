"""Faces cut by the frame: which detections the image border excuses a lower score.

A face partly outside the photo shows the detector less of itself, and its score
falls with the part that is missing: on the sample photos cut at a corner by a
third of their size on both axes, YuNet scores many of them 0.3–0.8, below the
0.8 it asks of a whole face. So a detection whose box reaches past the image
border is kept at :data:`EDGE_SCORE_THRESHOLD`, every other one at the
detector's own threshold. 0.65, not lower: the cat of the face-free set, its
face cut by the right edge, scores 0.61 in a turned retry; at 0.65 no
face-free photo gains a detection (BENCHMARKS.md, "edge_recall").

A box "reaches past the border" when the model's regressed box (before it is
clipped to the image) extends outside it: the model places the unseen part of
the face there. A detection whose centre lies outside the image (more than half
of it unseen) gets no such allowance.
"""

from __future__ import annotations

import numpy as np

#: The score a detection cut by the image frame needs (see the module docstring).
EDGE_SCORE_THRESHOLD = 0.65


def cut_by_frame(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """(K,) bool: the box (K, 4) ``x0, y0, x1, y1`` image pixels reaches past the
    border of a ``width``×``height`` image while its centre lies inside it."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    cx, cy = (b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2
    outside = (b[:, 0] < 0) | (b[:, 1] < 0) | (b[:, 2] > width) | (b[:, 3] > height)
    centred = (cx > 0) & (cx < width) & (cy > 0) & (cy < height)
    result: np.ndarray = outside & centred
    return result


def confident(
    scores: np.ndarray, boxes: np.ndarray, width: float, height: float,
    threshold: float, edge_threshold: float,
) -> np.ndarray:
    """(K,) bool: the detection scores at least ``threshold``, or at least
    ``edge_threshold`` and is :func:`cut_by_frame`."""
    s = np.asarray(scores, np.float64).reshape(-1)
    result: np.ndarray = (s >= threshold) | (
        (s >= edge_threshold) & cut_by_frame(boxes, width, height))
    return result


#: A detection kept only by the border allowance is dropped as a piece of another
#: face when at least this fraction of its own box lies inside a confident detection.
FRAGMENT_OVERLAP = 0.2


def fragments(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """(K,) bool: detection scoring under ``threshold`` (kept only because the frame
    cuts it) whose box (K, 4) lies by :data:`FRAGMENT_OVERLAP` of its area or more
    inside the box of a detection scoring ``threshold`` or more: a part of that
    face (an eye and brow at the top edge), not another face."""
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    s = np.asarray(scores, np.float64).reshape(-1)
    strong = b[s >= threshold]
    weak = np.flatnonzero(s < threshold)
    out = np.zeros(len(b), bool)
    if not len(strong) or not len(weak):
        return out
    w, t = b[weak][:, None, :], strong[None, :, :]
    iw = np.minimum(w[..., 2], t[..., 2]) - np.maximum(w[..., 0], t[..., 0])
    ih = np.minimum(w[..., 3], t[..., 3]) - np.maximum(w[..., 1], t[..., 1])
    inter = np.clip(iw, 0, None) * np.clip(ih, 0, None)
    area = np.maximum((w[..., 2] - w[..., 0]) * (w[..., 3] - w[..., 1]), 1e-9)
    out[weak] = (inter / area).max(axis=1) >= FRAGMENT_OVERLAP
    return out
