"""YuNet face detection (libfacedetection 2023) on ONNX Runtime.

Same shape as the BlazeFace :class:`~facefuse.faces.blazeface.BlazeFaceDetector`,
so the server's micro-batcher drives both alike:

1. :meth:`YuNetDetector.preprocess` letterboxes the image (no distortion,
   black padding) into a ``size``×``size`` RGB tensor of raw 0..255 values;
   images whose long side exceeds ``tile_above`` are also cut into overlapping
   tiles (:func:`~facefuse.faces.detector_base.tile_grid`).
2. The model (built by :mod:`facefuse.toolchain.build.yunet`) returns, per
   anchor of strides 8, 16 and 32, 14 raw regressions and the score
   ``sqrt(sigmoid(cls) * sigmoid(obj))``.
3. :meth:`YuNetDetector.postprocess` decodes them as libfacedetection does
   (prior at ``(col*s, row*s)``; centre ``prior + d*s``; size ``exp(d)*s``;
   landmarks ``prior + d*s``), maps to image pixels, keeps scores ≥ the
   threshold (a face cut by the image frame needs only
   :data:`~facefuse.faces.borders.EDGE_SCORE_THRESHOLD`,
   :mod:`facefuse.faces.borders`), drops tile detections cut by an inner tile
   edge and merges all passes with libfacedetection's greedy NMS (IoU above
   0.45 suppressed).

Keypoints are YuNet's five, in its order: the subject's right eye (on the
image's left), left eye, nose tip, right and left mouth corners. The first
two follow the same convention as BlazeFace's, which is what the mesh ROI
uses.
"""

from __future__ import annotations

import numpy as np

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces.borders import EDGE_SCORE_THRESHOLD, confident, fragments
from facefuse.faces.detector_base import (
    BatchedDetector,
    Candidates,
    Letterbox,
    away_from_inner_edges,
    iou,
)
from facefuse.runtime.registry import LoadedModel

STRIDES = (8, 16, 32)
NUM_KEYPOINTS = 5
#: libfacedetection's NMS overlap threshold.
NMS_IOU = 0.45
#: Model input side (pixels, a multiple of 32): libfacedetection's recommended scale.
INPUT_SIZE = 640
#: Smallest face found reliably, as a fraction of the input side (~10 px at 640).
MIN_FACE_FRACTION = 0.016
#: Raw size regressions are clipped to this before ``exp`` (e**10 strides is far
#: beyond any input), so a stray value cannot overflow.
MAX_LOG_SIZE = 10.0


def yunet_priors(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Anchor points of a ``size``×``size`` input, in the model's output order.

    Returns ``(priors (A, 2) float64 (x, y) tensor pixels, strides (A,) float64)``:
    stride 8, 16, then 32, each row-major over its ``size/s`` grid.
    """
    if size % 32:
        raise InvalidArgumentError(f"YuNet input side must be a multiple of 32, not {size}")
    points: list[np.ndarray] = []
    strides: list[np.ndarray] = []
    for s in STRIDES:
        n = size // s
        ys, xs = np.meshgrid(np.arange(n, dtype=np.float64), np.arange(n, dtype=np.float64),
                             indexing="ij")
        points.append(np.stack([xs.ravel(), ys.ravel()], axis=1) * s)
        strides.append(np.full(n * n, float(s)))
    return np.concatenate(points), np.concatenate(strides)


def decode_yunet(
    regressors: np.ndarray,
    scores: np.ndarray,
    priors: np.ndarray,
    strides: np.ndarray,
    transform: Letterbox,
    score_threshold: float,
    edge_score_threshold: float | None = None,
) -> Candidates:
    """One tensor's raw outputs → image-pixel candidates.

    Args:
        regressors: (A, 14) float32: box (dx, dy, log w, log h), 5 × (dx, dy), in strides.
        scores: (A,) or (A, 1) float32 in [0, 1].
        priors, strides: from :func:`yunet_priors`.
        transform: the Letterbox that produced the tensor.
        score_threshold: keep anchors scoring ≥ this.
        edge_score_threshold: keep anchors whose box is cut by the image frame
            (:func:`~facefuse.faces.borders.cut_by_frame`) scoring ≥ this; None:
            ``score_threshold`` for them too.
    """
    probs = np.reshape(scores, -1).astype(np.float64)
    edge = score_threshold if edge_score_threshold is None else edge_score_threshold
    keep = np.flatnonzero(probs >= min(score_threshold, edge))
    if keep.size == 0:
        return empty_candidates()
    raw = regressors.reshape(-1, 14)[keep].astype(np.float64)
    s = strides[keep][:, None]
    p = priors[keep]
    centre = raw[:, 0:2] * s + p
    half = np.exp(np.minimum(raw[:, 2:4], MAX_LOG_SIZE)) * s / 2.0
    kps = raw[:, 4:].reshape(-1, NUM_KEYPOINTS, 2) * s[:, :, None] + p[:, None, :]
    corners = transform.to_image(np.stack([centre - half, centre + half], axis=1))
    boxes = corners.reshape(-1, 4)
    kps = transform.to_image(kps)
    score = probs[keep]
    if edge < score_threshold:
        ok = confident(score, boxes, transform.image_width, transform.image_height,
                       score_threshold, edge)
        boxes, kps, score = boxes[ok], kps[ok], score[ok]
    if transform.is_tile:
        ok = away_from_inner_edges(boxes, transform)
        boxes, kps, score = boxes[ok], kps[ok], score[ok]
    return Candidates(boxes, kps, score)


def empty_candidates() -> Candidates:
    return Candidates(np.zeros((0, 4)), np.zeros((0, NUM_KEYPOINTS, 2)), np.zeros((0,)))


def greedy_nms(c: Candidates, iou_threshold: float = NMS_IOU) -> Candidates:
    """libfacedetection's NMS: best score first (stable), drop any candidate whose
    IoU with an already kept one exceeds ``iou_threshold``."""
    order = np.argsort(-c.scores, kind="stable")
    kept: list[int] = []
    for i in order:
        if not kept or np.all(iou(c.boxes[i], c.boxes[kept]) <= iou_threshold):
            kept.append(int(i))
    idx = np.asarray(kept, dtype=np.int64)
    return Candidates(c.boxes[idx], c.keypoints[idx], c.scores[idx])


class YuNetDetector(BatchedDetector):
    """YuNet detector over a loaded ONNX model.

    Args:
        model: the ``yunet`` model; input ``[N, 3, S, S]`` float32 RGB 0..255,
            outputs ``regressors`` ``[N, A, 14]`` and ``scores`` ``[N, A, 1]``.
        score_threshold: minimum score in (0, 1).
        edge_score_threshold: minimum score of a detection cut by the image frame,
            in (0, 1); None: the lower of ``score_threshold`` and
            :data:`~facefuse.faces.borders.EDGE_SCORE_THRESHOLD`.
        nms_iou: IoU above which a lower-scoring detection is dropped.
        tile_above: images whose long side exceeds this (pixels) are also
            scanned in overlapping tiles.
        size: model input side in pixels (multiple of 32).
    """

    def __init__(
        self,
        model: LoadedModel,
        *,
        score_threshold: float = 0.5,
        edge_score_threshold: float | None = None,
        nms_iou: float = NMS_IOU,
        tile_above: int = 1280,
        size: int = INPUT_SIZE,
    ) -> None:
        if not 0.0 < score_threshold < 1.0:
            raise InvalidArgumentError("score_threshold must be in (0, 1)")
        if edge_score_threshold is None:
            edge_score_threshold = min(score_threshold, EDGE_SCORE_THRESHOLD)
        if not 0.0 < edge_score_threshold < 1.0:
            raise InvalidArgumentError("edge_score_threshold must be in (0, 1)")
        if not 0.0 < nms_iou < 1.0:
            raise InvalidArgumentError("nms_iou must be in (0, 1)")
        if tile_above < size:
            raise InvalidArgumentError(f"tile_above must be at least the input side {size}")
        self.model = model
        self.regression_width = 14
        self.size = int(size)
        self.priors, self.strides = yunet_priors(self.size)
        self.score_threshold = float(score_threshold)
        self.edge_score_threshold = float(edge_score_threshold)
        self.nms_iou = float(nms_iou)
        self.tile_above = int(tile_above)
        self.min_face_fraction = MIN_FACE_FRACTION

    def tensor(self, canvas: np.ndarray) -> np.ndarray:
        """RGB uint8 (S, S, 3) → float32 (3, S, S), 0..255."""
        return np.ascontiguousarray(canvas.transpose(2, 0, 1), dtype=np.float32)

    def decode_tensor(
        self, regressors: np.ndarray, scores: np.ndarray, transform: Letterbox
    ) -> Candidates:
        """One tensor's (A, 14) regressors and (A,) scores → candidates."""
        return decode_yunet(regressors, scores, self.priors, self.strides, transform,
                            self.score_threshold, self.edge_score_threshold)

    def merge(self, candidates: Candidates) -> Candidates:
        """Greedy NMS, then the border-allowed detections that are pieces of a
        confident face dropped (:func:`~facefuse.faces.borders.fragments`)."""
        kept = greedy_nms(candidates, self.nms_iou)
        ok = ~fragments(kept.boxes, kept.scores, self.score_threshold)
        return Candidates(kept.boxes[ok], kept.keypoints[ok], kept.scores[ok])


def from_settings(model: LoadedModel, settings: Settings) -> YuNetDetector:
    """YuNet over ``model``, with ``settings``' YuNet score threshold and tiling size
    (never below its input side: a smaller tile would only shrink the faces)."""
    return YuNetDetector(model, score_threshold=settings.det_yunet_score_threshold,
                         tile_above=max(settings.det_tile_above, INPUT_SIZE))
