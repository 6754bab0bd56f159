"""BlazeFace face detection (MediaPipe full-range / short-range) on ONNX Runtime.

Pipeline, as in MediaPipe's ``face_detection`` graphs:

1. :meth:`BlazeFaceDetector.preprocess` letterboxes the image (no distortion) into
   the square model input, RGB scaled to [-1, 1], and large images into tiles too
   (:mod:`facefuse.faces.detector_base`: the letterboxing and tiling every
   detector shares).
2. The model returns per-anchor box/keypoint regressions and score logits.
3. :meth:`BlazeFaceDetector.postprocess` decodes them against the SSD anchors,
   applies sigmoid (logits clipped to ±80) and the score threshold, maps
   everything to image pixels, drops tile detections cut by an inner tile
   edge and merges all passes with MediaPipe's *weighted* non-maximum
   suppression.

The model run is separate from pre/post-processing so a micro-batcher can
stack tensors of many images into one ``[N, 3, S, S]`` run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces.detector_base import (
    BatchedDetector,
    Candidates,
    Letterbox,
    away_from_inner_edges,
    iou,
)
from facefuse.runtime.registry import LoadedModel

Variant = Literal["full", "short"]

#: Raw score logits are clipped to ±this before the sigmoid (MediaPipe uses 100,
#: which overflows float32 in exp; 80 is safe).
RAW_SCORE_LIMIT = 80.0
NUM_KEYPOINTS = 6


@dataclass(frozen=True)
class AnchorOptions:
    """The subset of MediaPipe's ``SsdAnchorsCalculatorOptions`` BlazeFace uses
    (``fixed_anchor_size: true``, so anchors only have centres)."""

    input_size: int
    strides: tuple[int, ...]
    anchor_offset: float = 0.5
    interpolated_scale_aspect_ratio: float = 1.0


#: face_detection_full_range_common.pbtxt: 1 layer, stride 4 → 48×48×1 = 2304 anchors.
FULL_RANGE = AnchorOptions(192, (4,), interpolated_scale_aspect_ratio=0.0)


#: face_detection_short_range_common.pbtxt: strides 8/16 → 16×16×2 + 8×8×6 = 896 anchors.
SHORT_RANGE = AnchorOptions(128, (8, 16, 16, 16), interpolated_scale_aspect_ratio=1.0)
ANCHOR_OPTIONS: dict[str, AnchorOptions] = {"full": FULL_RANGE, "short": SHORT_RANGE}

#: Smallest face the model finds reliably, as a fraction of the input side
#: (measured on the sample portraits: ~14 px of 192 full-range, ~20 px of 128 short-range).
MIN_FACE_FRACTION: dict[str, float] = {"full": 0.075, "short": 0.16}


def ssd_anchors(opts: AnchorOptions) -> np.ndarray:
    """Anchor centres like MediaPipe's ``SsdAnchorsCalculator`` (fixed size).

    Returns (A, 2) float32 ``(x, y)`` in [0, 1] of the model input, in the order
    the model emits its regressions. Layers with equal strides share one
    feature map; each contributes 2 anchors when
    ``interpolated_scale_aspect_ratio == 1`` (aspect 1 + interpolated scale),
    else 1.
    """
    anchors: list[np.ndarray] = []
    layer = 0
    n = len(opts.strides)
    while layer < n:
        last = layer
        repeats = 0
        while last < n and opts.strides[last] == opts.strides[layer]:
            repeats += 2 if opts.interpolated_scale_aspect_ratio == 1.0 else 1
            last += 1
        fm = opts.input_size // opts.strides[layer]
        centres = (np.arange(fm, dtype=np.float64) + opts.anchor_offset) / fm
        ys, xs = np.meshgrid(centres, centres, indexing="ij")
        grid = np.stack([xs.ravel(), ys.ravel()], axis=1)
        anchors.append(np.repeat(grid, repeats, axis=0))
        layer = last
    return np.concatenate(anchors).astype(np.float32)


def to_tensor(canvas: np.ndarray) -> np.ndarray:
    """RGB uint8 (S, S, 3) → float32 (3, S, S) in [-1, 1]."""
    return np.ascontiguousarray(canvas.transpose(2, 0, 1), dtype=np.float32) / 127.5 - 1.0


def sigmoid_scores(raw: np.ndarray) -> np.ndarray:
    """Logits → probabilities, logits clipped to ±:data:`RAW_SCORE_LIMIT` first."""
    clipped = np.clip(raw.astype(np.float64), -RAW_SCORE_LIMIT, RAW_SCORE_LIMIT)
    return 1.0 / (1.0 + np.exp(-clipped))


def decode(
    regressors: np.ndarray,
    scores: np.ndarray,
    anchors: np.ndarray,
    transform: Letterbox,
    score_threshold: float,
) -> Candidates:
    """Decode one tensor's raw outputs into image-pixel candidates.

    Args:
        regressors: (A, 16) float32 raw model output: box centre offset (x, y),
            box (w, h) and 6 keypoint offsets, in model-input pixels.
        scores: (A,) or (A, 1) float32 logits.
        anchors: (A, 2) anchor centres in [0, 1].
        transform: the :class:`Letterbox` that produced the tensor.
        score_threshold: keep anchors with probability ≥ this.
    """
    probs = sigmoid_scores(np.reshape(scores, -1))
    keep = np.flatnonzero(probs >= score_threshold)
    if keep.size == 0:
        return Candidates.empty()
    size = float(transform.size)
    raw = regressors.reshape(-1, 16)[keep].astype(np.float64).reshape(-1, 8, 2)
    anchor_px = anchors[keep].astype(np.float64)[:, None, :] * size
    centre = raw[:, 0] + anchor_px[:, 0]
    half = raw[:, 1] / 2.0
    kps = raw[:, 2:] + anchor_px
    corners = np.stack([centre - half, centre + half], axis=1)  # (K, 2, 2)
    valid = np.all(corners[:, 1] > corners[:, 0], axis=1)
    corners, kps, p = corners[valid], kps[valid], probs[keep][valid]
    corners = transform.to_image(corners)
    kps = transform.to_image(kps)
    boxes = corners.reshape(-1, 4)
    if transform.is_tile:
        ok = away_from_inner_edges(boxes, transform)
        boxes, kps, p = boxes[ok], kps[ok], p[ok]
    return Candidates(boxes, kps, p)


def weighted_nms(c: Candidates, iou_threshold: float) -> Candidates:
    """MediaPipe's weighted non-maximum suppression.

    Repeatedly take the best-scoring remaining candidate, gather every remaining
    candidate whose IoU with it exceeds ``iou_threshold`` (itself included),
    and emit their score-weighted mean box and keypoints with the best score.
    """
    order = np.argsort(-c.scores, kind="stable")
    boxes, kps, scores = c.boxes[order], c.keypoints[order], c.scores[order]
    out_b: list[np.ndarray] = []
    out_k: list[np.ndarray] = []
    out_s: list[float] = []
    remaining = np.arange(len(scores))
    while remaining.size:
        top = remaining[0]
        overlap = iou(boxes[top], boxes[remaining]) > iou_threshold
        overlap[0] = True
        group = remaining[overlap]
        w = scores[group]
        total = w.sum()
        out_b.append((boxes[group] * w[:, None]).sum(0) / total)
        out_k.append((kps[group] * w[:, None, None]).sum(0) / total)
        out_s.append(float(scores[top]))
        remaining = remaining[~overlap]
    if not out_s:
        return Candidates.empty()
    return Candidates(np.stack(out_b), np.stack(out_k), np.asarray(out_s))


class BlazeFaceDetector(BatchedDetector):
    """BlazeFace detector over a loaded ONNX model.

    Args:
        model: the ``blazeface_full`` or ``blazeface_short`` model; input
            ``[N, 3, S, S]`` float32 in [-1, 1], outputs ``regressors``
            ``[N, A, 16]`` and ``scores`` ``[N, A, 1]``.
        score_threshold: minimum face probability in (0, 1).
        nms_iou: IoU above which detections are merged.
        tile_above: images whose long side exceeds this (pixels) are also
            scanned in overlapping tiles.
        variant: ``"full"`` (192×192, any distance) or ``"short"`` (128×128, selfies).
    """

    def __init__(
        self,
        model: LoadedModel,
        *,
        score_threshold: float = 0.5,
        nms_iou: float = 0.3,
        tile_above: int = 1280,
        variant: Variant = "full",
    ) -> None:
        if variant not in ANCHOR_OPTIONS:
            raise InvalidArgumentError(f"detector variant must be full|short, not {variant!r}")
        if not 0.0 < score_threshold < 1.0:
            raise InvalidArgumentError("score_threshold must be in (0, 1)")
        if not 0.0 < nms_iou < 1.0:
            raise InvalidArgumentError("nms_iou must be in (0, 1)")
        if tile_above < 64:
            raise InvalidArgumentError("tile_above must be at least 64 pixels")
        self.model = model
        self.regression_width = 16
        self.variant: Variant = variant
        self.options = ANCHOR_OPTIONS[variant]
        self.size = self.options.input_size
        model_size = tuple(model.spec.preprocessing.size)
        if model_size != (self.size, self.size):
            raise InvalidArgumentError(
                f"model {model.spec.name!r} takes {model_size}, but the {variant!r} detector "
                f"needs {self.size}x{self.size}"
            )
        self.anchors = ssd_anchors(self.options)
        self.score_threshold = float(score_threshold)
        self.nms_iou = float(nms_iou)
        self.tile_above = int(tile_above)
        self.min_face_fraction = MIN_FACE_FRACTION[variant]

    def tensor(self, canvas: np.ndarray) -> np.ndarray:
        """RGB uint8 (S, S, 3) → float32 (3, S, S) in [-1, 1]."""
        return to_tensor(canvas)

    def decode_tensor(
        self, regressors: np.ndarray, scores: np.ndarray, transform: Letterbox
    ) -> Candidates:
        """One tensor's (A, 16) regressors and (A,) score logits → candidates."""
        return decode(regressors, scores, self.anchors, transform, self.score_threshold)

    def merge(self, candidates: Candidates) -> Candidates:
        return weighted_nms(candidates, self.nms_iou)


def full_range(model: LoadedModel, settings: Settings) -> BlazeFaceDetector:
    """BlazeFace full-range (any distance) over ``model``, with ``settings``' score
    threshold, NMS overlap and tiling size."""
    return BlazeFaceDetector(model, score_threshold=settings.det_score_threshold,
                             nms_iou=settings.det_nms_iou,
                             tile_above=settings.det_tile_above, variant="full")


def short_range(model: LoadedModel, settings: Settings) -> BlazeFaceDetector:
    """BlazeFace short-range (selfies) over ``model``, with ``settings``' score
    threshold, NMS overlap and tiling size."""
    return BlazeFaceDetector(model, score_threshold=settings.det_score_threshold,
                             nms_iou=settings.det_nms_iou,
                             tile_above=settings.det_tile_above, variant="short")
