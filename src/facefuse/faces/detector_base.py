"""What every face detector shares: letterboxing and tiling an image into model
passes, decoded candidates, their overlap tests, and the batched-detector shape
(:class:`BatchedDetector`: preprocess on the CPU, one stacked model run, postprocess;
or, as the analysis stages drive it, the passes in chunks, their candidates, then one
merge) that BlazeFace (:mod:`facefuse.faces.blazeface`) and YuNet (:mod:`facefuse.faces.yunet`)
both fill in.

Tiling: images whose long side exceeds a detector's ``tile_above`` are *also* cut
into overlapping tiles, each letterboxed like the whole image, so that small faces
in large photos are seen at a useful resolution. The image is shrunk once by the
largest integer factor all passes allow (exact area averaging), and every pass is
cut from that copy, so a 4000-pixel photo costs one fast resize, not one per tile.
Tile detections cut by an inner tile edge are dropped before the passes merge.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from facefuse.faces.rotation import rotate_image, turned_size
from facefuse.faces.types import Detection
from facefuse.imaging.checks import require_rgb
from facefuse.runtime.registry import LoadedModel

#: Tiles overlap by at most / at least this fraction of their side.
MAX_TILE_OVERLAP = 0.4
MIN_TILE_OVERLAP = 0.15
#: Safety factor on the face-size coverage between tile levels.
TILE_SAFETY = 1.2
#: Tile detections closer than this (fraction of tile side) to an inner tile edge are dropped.
TILE_EDGE_MARGIN = 0.01


@dataclass(frozen=True)
class Letterbox:
    """Where a model-input tensor came from.

    The crop ``(x0, y0, width, height)`` of the image (pixels) was resized by
    ``(sx, sy)`` (tensor pixels per image pixel; equal up to rounding) and
    pasted at ``(pad_x, pad_y)`` into the ``size``×``size`` tensor.
    ``inner_edges`` flags (left, top, right, bottom) crop edges that lie inside
    the image (tile borders), where faces may be cut.
    """

    x0: float
    y0: float
    width: float
    height: float
    sx: float
    sy: float
    pad_x: int
    pad_y: int
    size: int
    image_width: int
    image_height: int
    inner_edges: tuple[bool, bool, bool, bool] = (False, False, False, False)

    def to_image(self, points: np.ndarray) -> np.ndarray:
        """Tensor pixel coordinates (..., 2) → image pixels (..., 2) float64."""
        out = np.array(points, dtype=np.float64, copy=True)
        out[..., 0] = (out[..., 0] - self.pad_x) / self.sx + self.x0
        out[..., 1] = (out[..., 1] - self.pad_y) / self.sy + self.y0
        return out

    @property
    def is_tile(self) -> bool:
        return any(self.inner_edges)

    def upscaled(
        self, factor: int, image_width: int, image_height: int,
        inner_edges: tuple[bool, bool, bool, bool],
    ) -> Letterbox:
        """The same tensor described in an image ``factor``× larger (a pyramid level)."""
        return Letterbox(
            x0=self.x0 * factor, y0=self.y0 * factor, width=self.width * factor,
            height=self.height * factor, sx=self.sx / factor, sy=self.sy / factor,
            pad_x=self.pad_x, pad_y=self.pad_y, size=self.size, image_width=image_width,
            image_height=image_height, inner_edges=inner_edges,
        )


def letterbox(
    image: np.ndarray,
    size: int,
    crop: tuple[int, int, int, int] | None = None,
) -> tuple[np.ndarray, Letterbox]:
    """Fit ``image[crop]`` into a ``size``×``size`` black canvas, keeping aspect ratio.

    Args:
        image: RGB uint8 (H, W, 3).
        size: output side in pixels.
        crop: ``(x0, y0, width, height)`` in pixels; the whole image when None.

    Returns:
        (size, size, 3) uint8 canvas, centred, and the :class:`Letterbox` transform.
        Downscaling uses area averaging (no aliasing), upscaling bilinear.
    """
    h_img, w_img = image.shape[:2]
    x0, y0, w, h = crop if crop is not None else (0, 0, w_img, h_img)
    region = image[y0 : y0 + h, x0 : x0 + w]
    scale = size / max(w, h)
    nw = max(1, min(size, round(w * scale)))
    nh = max(1, min(size, round(h * scale)))
    interp = cv2.INTER_AREA if scale < 1.0 else cv2.INTER_LINEAR
    resized = cv2.resize(region, (nw, nh), interpolation=interp)
    pad_x, pad_y = (size - nw) // 2, (size - nh) // 2
    canvas = np.zeros((size, size, 3), np.uint8)
    canvas[pad_y : pad_y + nh, pad_x : pad_x + nw] = resized
    inner = (x0 > 0, y0 > 0, x0 + w < w_img, y0 + h < h_img)
    box = Letterbox(
        x0=x0, y0=y0, width=w, height=h, sx=nw / w, sy=nh / h, pad_x=pad_x, pad_y=pad_y,
        size=size, image_width=w_img, image_height=h_img, inner_edges=inner,
    )
    return canvas, box


def tile_grid(
    width: int, height: int, tile_above: int, min_face_fraction: float = 0.075
) -> list[tuple[int, int, int, int]]:
    """Overlapping square tiles ``(x0, y0, w, h)`` for an image larger than ``tile_above``.

    The whole image (level 0, not returned) finds faces down to
    ``min_face_fraction`` of its long side ``L``. Tile levels ``k = 1..n`` have
    sides ``L / r**k`` with the last one equal to ``tile_above``, so every image
    is searched down to ``min_face_fraction * tile_above`` pixels. Tiles of a
    level overlap by ``o`` of their side, so any face up to ``o * side`` lies
    whole in some tile, and ``o`` is chosen to cover the smallest face the level
    above finds (``o ≥ min_face_fraction * r``, with a safety margin); faces
    cut by a tile border are left to coarser levels. Empty when ``L <=
    tile_above``.
    """
    long_side = max(width, height)
    if long_side <= tile_above:
        return []
    r_max = MAX_TILE_OVERLAP / (TILE_SAFETY * min_face_fraction)
    ratio = long_side / tile_above
    levels = max(1, math.ceil(math.log(ratio) / math.log(r_max) - 1e-9))
    r = ratio ** (1.0 / levels)
    overlap = min(MAX_TILE_OVERLAP, max(MIN_TILE_OVERLAP, TILE_SAFETY * min_face_fraction * r))
    tiles: list[tuple[int, int, int, int]] = []
    for k in range(1, levels + 1):
        t = max(1, math.ceil(long_side / r**k))
        stride = max(1, int(t * (1 - overlap)))
        xs = _starts(width, t, stride)
        ys = _starts(height, t, stride)
        tiles.extend((x, y, min(t, width - x), min(t, height - y)) for y in ys for x in xs)
    return tiles


def _starts(extent: int, tile: int, stride: int) -> list[int]:
    """Tile origins covering [0, extent), evenly spread, the last one flush with the end."""
    if extent <= tile:
        return [0]
    n = math.ceil((extent - tile) / stride) + 1
    return [round(i * (extent - tile) / (n - 1)) for i in range(n)]


@dataclass(frozen=True)
class Shrunk:
    """An image (turned, when :func:`shrink_for` was asked to turn it) shrunk once for a
    set of its passes: ``small``, shrunk ``k``-fold by :func:`shrink_for`'s 2×2 area
    averages (each rounded half up: on average 0.125 grey per halving above the exact
    k×k mean; the turned image itself for ``k`` = 1), and the turned image's (width,
    height)."""

    small: np.ndarray
    k: int
    width: int
    height: int


def shrink_for(image: np.ndarray, size: int,
               crops: Sequence[tuple[int, int, int, int]], quarter_turns: int = 0) -> Shrunk:
    """``image`` turned ``quarter_turns`` × 90° counter-clockwise (as
    :func:`~facefuse.faces.rotation.rotate_image` turns it; ``crops`` are in the
    turned image's pixels), shrunk by the largest power of two every pass of
    ``crops`` can afford, one 2×2 area average at a time (OpenCV's vectorised
    halving: a 1-2 MP photo halved three times costs a third of one 5- to 8-fold
    area average, which OpenCV runs unvectorised); the < k pixels at the turned
    image's right/bottom that do not fill a k×k block are dropped. The letterbox of
    the smallest crop (the one that sets k) then shrinks by less than 2 more.

    Only the shrunk copy is turned: the blocks are averaged on the image as it is,
    on the grid the turned image's top-left corner anchors, so the result is that
    of shrinking the turned image, to the bit, without a turned full-size copy."""
    t = quarter_turns % 4
    h, w = image.shape[:2]
    tw, th = turned_size(w, h, t)
    fits = min(int(min(max(cw, ch) for _, _, cw, ch in crops) // size), tw, th)
    if fits < 2:
        return Shrunk(rotate_image(image, t), 1, tw, th)
    k = 1 << (fits.bit_length() - 1)
    # The turned image's top-left corner is the image's top-right (1 turn), bottom-
    # right (2) or bottom-left (3): the blocks start there, the remainder is dropped
    # at the opposite sides.
    x0 = w % k if t in (1, 2) else 0
    y0 = h % k if t in (2, 3) else 0
    wk, hk = w // k, h // k
    small = image[y0: y0 + hk * k, x0: x0 + wk * k]
    for step in range(k.bit_length() - 1):
        side = k >> (step + 1)
        small = cv2.resize(small, (wk * side, hk * side), interpolation=cv2.INTER_AREA)
    return Shrunk(rotate_image(small, t), k, tw, th)


def letterbox_passes(
    image: np.ndarray | Shrunk, size: int, crops: Sequence[tuple[int, int, int, int]],
) -> list[tuple[np.ndarray, Letterbox]]:
    """Letterbox each crop ``(x0, y0, w, h)`` of ``image`` into a ``size``×``size`` canvas.

    The image is shrunk once (:func:`shrink_for` those crops; or given shrunk for a
    larger set of passes, a :class:`Shrunk`: the passes of a set cut apart are then
    exactly those of the set cut at once) and every pass is cut and fitted from that
    copy. Returns ``(canvas (size, size, 3) uint8, Letterbox)`` per crop, the
    Letterbox mapping canvas pixels to the image's pixels.
    """
    shrunk = image if isinstance(image, Shrunk) else shrink_for(image, size, crops)
    small, k, w, h = shrunk.small, shrunk.k, shrunk.width, shrunk.height
    out: list[tuple[np.ndarray, Letterbox]] = []
    for x0, y0, cw, ch in crops:
        sx0, sy0 = x0 // k, y0 // k
        sx1 = min(small.shape[1], -(-(x0 + cw) // k))
        sy1 = min(small.shape[0], -(-(y0 + ch) // k))
        canvas, box = letterbox(small, size, (sx0, sy0, sx1 - sx0, sy1 - sy0))
        inner = (x0 > 0, y0 > 0, x0 + cw < w, y0 + ch < h)
        out.append((canvas, box.upscaled(k, w, h, inner)))
    return out


@dataclass(frozen=True)
class Candidates:
    """Thresholded, decoded detections of one or more tensors, before NMS.

    ``boxes`` (K, 4) float64 ``x0, y0, x1, y1`` image pixels; ``keypoints``
    (K, 6, 2) float64 image pixels; ``scores`` (K,) float64 in [0, 1].
    """

    boxes: np.ndarray
    keypoints: np.ndarray
    scores: np.ndarray

    @staticmethod
    def empty() -> Candidates:
        return Candidates(np.zeros((0, 4)), np.zeros((0, 6, 2)), np.zeros((0,)))

    @staticmethod
    def concat(items: Sequence[Candidates]) -> Candidates:
        if not items:
            return Candidates.empty()
        return Candidates(
            np.concatenate([c.boxes for c in items]),
            np.concatenate([c.keypoints for c in items]),
            np.concatenate([c.scores for c in items]),
        )


def away_from_inner_edges(boxes: np.ndarray, t: Letterbox) -> np.ndarray:
    """(K,) bool: box does not reach an inner edge of its tile."""
    margin = TILE_EDGE_MARGIN * max(t.width, t.height)
    left, top, right, bottom = t.inner_edges
    ok = np.ones(len(boxes), bool)
    if left:
        ok &= boxes[:, 0] > t.x0 + margin
    if top:
        ok &= boxes[:, 1] > t.y0 + margin
    if right:
        ok &= boxes[:, 2] < t.x0 + t.width - margin
    if bottom:
        ok &= boxes[:, 3] < t.y0 + t.height - margin
    return ok


#: :func:`holds`: a tile that leaves out more than this share of a face box's width on
#: a side cuts the face there, and drops what it finds of it as cut.
HOLD_SLACK = 0.05


def holds(tile: tuple[int, int, int, int], box: np.ndarray) -> bool:
    """Whether ``tile`` (x0, y0, w, h) holds the face ``box`` (x0, y0, x1, y1): the box,
    shrunk by :data:`HOLD_SLACK` of its width on every side, lies inside the tile
    (generous: a tile that holds it is never passed over, one that cuts it runs
    in vain at worst)."""
    tx, ty, tw, th = tile
    s = HOLD_SLACK * float(box[2] - box[0])
    return bool(tx <= box[0] + s and box[2] - s <= tx + tw
                and ty <= box[1] + s and box[3] - s <= ty + th)


def iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one box (4,) against boxes (K, 4), all ``x0, y0, x1, y1``."""
    ix0 = np.maximum(box[0], boxes[:, 0])
    iy0 = np.maximum(box[1], boxes[:, 1])
    ix1 = np.minimum(box[2], boxes[:, 2])
    iy1 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(ix1 - ix0, 0, None) * np.clip(iy1 - iy0, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


#: The most passes of one image whose tensors exist at once (one model call each),
#: unless the detector says otherwise (:attr:`BatchedDetector.pass_chunk`: the batch
#: policy's largest batch). A 39-megapixel photo's every-face scan has 37 passes a
#: quarter turn; built at once, their float32 tensors came to ~170 MB, and the
#: batcher ran two of their batches at once (at 16, VmHWM 842-868 MB against 650 at
#: 8, for 5.8 s a request against 8.3 before the server planned ORT memory).
PASS_CHUNK = 8

#: A crop ``(x0, y0, w, h)`` of an image, pixels.
Crop = tuple[int, int, int, int]
#: One model input: a ``(3, S, S)`` float32 tensor and where it came from.
Pass = tuple[np.ndarray, Letterbox]


class BatchedDetector:
    """A detector whose model runs on stacked tensors: :meth:`preprocess` (CPU) →
    :meth:`run` (one batched model call, which a micro-batcher may share between
    images) → :meth:`postprocess` (CPU); the analysis stages run the same passes
    :meth:`chunks` at a time (:meth:`candidates` of each, :meth:`detections` of all).
    Subclasses say how a letterboxed canvas
    becomes a tensor (:meth:`tensor`), which faces the whole image finds at least
    (:attr:`min_face_fraction`, the tiles' rule), how one tensor's outputs decode
    (:meth:`decode_tensor`) and how the passes of one image merge (:meth:`merge`).
    """

    model: LoadedModel
    #: Passes of one image made and run at a time in the stages (:meth:`chunks`): the
    #: batcher's largest batch where the model runs (make_detector sets it).
    pass_chunk: int = PASS_CHUNK
    #: Raw regression values per anchor.
    regression_width: int
    #: Model input side, pixels.
    size: int
    #: Images whose long side exceeds this (pixels) are also scanned in tiles.
    tile_above: int
    #: The smallest face, as a fraction of the long side, the whole-image pass finds.
    min_face_fraction: float

    def tensor(self, canvas: np.ndarray) -> np.ndarray:
        """A letterboxed RGB uint8 (S, S, 3) canvas → the model's (3, S, S) float32."""
        raise NotImplementedError

    def crops(self, width: int, height: int) -> list[Crop]:
        """The passes of a ``width``×``height`` image: the whole image, then its tiles."""
        return [(0, 0, width, height),
                *tile_grid(width, height, self.tile_above, self.min_face_fraction)]

    def preprocess(self, image: np.ndarray) -> list[Pass]:
        """Model inputs ``(tensor (3, S, S) float32, Letterbox)`` of one RGB uint8 image:
        the whole image, then tiles if it is large."""
        require_rgb(image)
        h, w = image.shape[:2]
        return self._passes(image, self.crops(w, h))

    def shrunk(self, image: np.ndarray, quarter_turns: int = 0) -> Shrunk:
        """``image`` (turned ``quarter_turns`` × 90° counter-clockwise, see
        :func:`shrink_for`) shrunk once for all its passes: the :meth:`chunks` of any
        of its crops (the whole image, :meth:`tile_crops`) are cut from the one copy,
        as :meth:`preprocess` would cut them from the turned image."""
        require_rgb(image)
        h, w = image.shape[:2]
        return shrink_for(image, self.size, self.crops(*turned_size(w, h, quarter_turns)),
                          quarter_turns)

    def tile_crops(self, image: Shrunk, around: Detection | None = None) -> list[Crop]:
        """The tiles of the :meth:`shrunk` image (none for a small image). With
        ``around``, only the tiles that hold that face (:func:`holds`; all of them when
        none does): a tile that holds it in part drops its piece of it as cut
        (:func:`away_from_inner_edges`), so for that face these passes find what all
        the tiles would (measured: the same landmarks on 48 ~2 MP portraits and 160
        transformed sample photos). A face the whole image missed that only a tile
        left out would see is not looked for."""
        tiles = self.crops(image.width, image.height)[1:]
        if around is not None:
            holding = [t for t in tiles if holds(t, around.bbox)]
            tiles = holding or tiles
        return tiles

    def chunks(self, image: Shrunk, crops: Sequence[Crop]) -> Iterator[list[Pass]]:
        """The passes of ``crops`` of the :meth:`shrunk` image, :attr:`pass_chunk` at a
        time, each group made only when the next is asked for: a caller that lets go
        of one group before asking keeps a large photo's passes from all existing at
        once."""
        size = max(1, self.pass_chunk)
        for i in range(0, len(crops), size):
            yield self._passes(image, crops[i:i + size])

    def _passes(self, image: np.ndarray | Shrunk, crops: Sequence[Crop]) -> list[Pass]:
        return [(self.tensor(canvas), box)
                for canvas, box in letterbox_passes(image, self.size, crops)]

    def decode_tensor(
        self, regressors: np.ndarray, scores: np.ndarray, transform: Letterbox
    ) -> Candidates:
        """One tensor's (A, W) regressors and (A,) scores → image-pixel candidates."""
        raise NotImplementedError

    def merge(self, candidates: Candidates) -> Candidates:
        """All passes' candidates of one image → its faces (non-maximum suppression)."""
        raise NotImplementedError

    def run(self, tensors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Model run: (N, 3, S, S) float32 → regressors (N, A, W), scores (N, A, 1)."""
        regressors, scores = self.model.run(np.ascontiguousarray(tensors, dtype=np.float32))[:2]
        return regressors, scores

    def candidates(
        self,
        regressors: np.ndarray,
        scores: np.ndarray,
        transforms: Sequence[Letterbox],
    ) -> Candidates:
        """Raw outputs of some tensors of one image → their candidates, before NMS.

        Args:
            regressors: (N, A, W) float32 (or (A, W) for N = 1).
            scores: (N, A, 1) float32 (or (A, 1)).
            transforms: the Letterbox of each of the N tensors.
        """
        if not transforms:
            return Candidates.empty()
        regs = np.reshape(regressors, (len(transforms), -1, self.regression_width))
        scs = np.reshape(scores, (len(transforms), -1))
        return Candidates.concat([
            self.decode_tensor(r, s, t) for r, s, t in zip(regs, scs, transforms, strict=True)
        ])

    def detections(self, found: Candidates, width: int, height: int) -> list[Detection]:
        """All passes' candidates of one ``width``×``height`` image → its detections,
        best first (:meth:`merge`, then clipped to the image)."""
        return to_detections(self.merge(found), width, height)

    def postprocess(
        self,
        regressors: np.ndarray,
        scores: np.ndarray,
        transform: Letterbox | Sequence[Letterbox],
    ) -> list[Detection]:
        """Raw outputs of all tensors of ONE image → its detections, best first.

        Args:
            regressors: (A, W) or (N, A, W) float32.
            scores: (A, 1) or (N, A, 1) float32.
            transform: the Letterbox of each tensor (one, or a sequence of N).
        """
        transforms = [transform] if isinstance(transform, Letterbox) else list(transform)
        if not transforms:
            return []
        found = self.candidates(regressors, scores, transforms)
        return self.detections(found, transforms[0].image_width, transforms[0].image_height)

    def detect(self, image: np.ndarray) -> list[Detection]:
        """All faces in an RGB uint8 (H, W, 3) image, best score first."""
        items = self.preprocess(image)
        regressors, scores = self.run(np.stack([t for t, _ in items]))
        return self.postprocess(regressors, scores, [b for _, b in items])


def to_detections(c: Candidates, width: int, height: int) -> list[Detection]:
    """Clip boxes to the image, drop boxes left empty, wrap as :class:`Detection`."""
    out: list[Detection] = []
    for box, kps, score in zip(c.boxes, c.keypoints, c.scores, strict=True):
        clipped = np.array(
            [min(max(box[0], 0.0), width), min(max(box[1], 0.0), height),
             min(max(box[2], 0.0), width), min(max(box[3], 0.0), height)],
            dtype=np.float32,
        )
        if clipped[2] - clipped[0] < 1.0 or clipped[3] - clipped[1] < 1.0:
            continue
        out.append(Detection(bbox=clipped, score=float(score), keypoints=kps.astype(np.float32)))
    return out
