"""The classic swapper: dense-mesh geometry, one piecewise-affine remap, tone transfer.

1. Geometry: the source mesh is brought into the target's pose and the target
   mesh moves toward its shape by the shape weight (expression regions rigidly).
2. Texture: both the source and the target image are warped onto that fused
   mesh by one dense map each over the face region (never the whole frame).
3. Tone: the source layer takes the target's low-frequency colour and shading,
   then its sharpness is matched to the target's.
4. The layer is the texture-weighted mix of the two warped images, with the
   target's own mouth interior (teeth, tongue) kept when its mouth is open.
   What the source hides from the fused pose, or lacks beyond its face outline,
   comes from the mirrored other half of the source face
   (:mod:`facefuse.fusion.swappers.classic.symmetry`), else from the target.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import cv2
import numpy as np

from facefuse.faces.types import Face
from facefuse.fusion import mask as masks
from facefuse.fusion.carry import Carried
from facefuse.fusion.geometry import eye_distance, fused_shape
from facefuse.fusion.swappers.base import FaceLayer
from facefuse.fusion.swappers.classic import (
    beard,
    detail,
    eyes,
    light,
    makeup,
    nostrils,
    regions,
    skin_fill,
    specular,
)
from facefuse.fusion.swappers.classic import occlusion as occ
from facefuse.fusion.swappers.classic import symmetry as sym
from facefuse.fusion.swappers.classic.source_prep import (
    UNCACHED,
    SourceCache,
    SourceEntry,
    quantised_scale,
)
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.channels import copy_where, each_channel
from facefuse.imaging.color import is_monochrome, match_sharpness
from facefuse.imaging.pixels import OpenCVPixels, PixelBackend
from facefuse.imaging.warp import delaunay, piecewise_affine_maps

T = TypeVar("T")

#: Lighting-transfer blur as a fraction of the outer-eye-corner distance.
LIGHTING_SIGMA_FRACTION = 0.2
#: Clamp on the lighting transfer's per-pixel, per-channel gain.
LIGHTING_MAX_GAIN = 3.0
MESH_POINTS = 468
#: Share of the target's own eye openings (sclera, iris, catchlights) kept in the
#: layer: the opening and the gaze are expression, and the source's eye squeezed
#: into the target's opening reads as a cloudy, half-shut or wandering eye. The
#: source's iris colour is given to them (see :mod:`facefuse.fusion.swappers.classic.eyes`).
EYE_KEEP = 1.0
#: Share of the target's closed lips kept when the source's mouth is open.
SOURCE_OPEN_LIPS_KEEP = 1.0
#: Growth and feather of the filled source occluders where the source's detail is
#: left out, in feather widths: the occluder's own soft edge (hair strands, a lens
#: rim) must not bleed in through the detail band.
OCCLUDER_GROW = 0.15
#: The source's occluders are found at this eye distance (pixels) when its face
#: is larger: their mask is grown and feathered anyway, and it saves half their
#: cost; smaller, the features would swallow what covers them.
SOURCE_OCCLUDER_EYE_PX = 64.0
#: Exponent on the relighting gains (1 = the full change of lighting).
RELIGHT_STRENGTH = 1.0


#: The source's working eye distance over the target's (at most the working one).
SOURCE_OVERSAMPLE = 1.25

#: Faces whose outer eye corners are further apart than this (pixels) are
#: rendered at a reduced working resolution (the layer is put together at full
#: resolution, :mod:`facefuse.fusion.swappers.classic.detail`): the cost then stops growing with
#: face size. At 80 rather than 96 the fusion stage costs 0.83× at 1.5 MP, with
#: the same detail, degree-1 PSNR, identity and occluder figures.
WORK_EYE_PX = 80.0
#: The working eye distance of a clip's frames rendered with carried findings (the
#: glasses, facial hair and iris colour are still looked for at
#: :data:`WORK_EYE_PX` on the frames they are found on, where the finders' thresholds
#: are tuned): on the 720p bench clip 0.91× a frame's CPU, the same identity
#: (embedding cosine to the source 0.915 at both, to the target 0.889), the same
#: flicker, the frames 0.55 grey levels apart in the face box (99th percentile 4;
#: at 5× the same nose and skin); at 64 the face moved toward the target (0.909).
CLIP_WORK_EYE_PX = 72.0


def _triangles(points: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    w, h = size
    return delaunay(points, (-1, -1, w + 1, h + 1))


def _crop_points(landmarks: np.ndarray, box: tuple[int, int, int, int], scale: float
                 ) -> np.ndarray:
    """``landmarks`` (N, 3) in the pixel frame of the crop ``box`` of an image
    resized by ``scale`` (≤ 1), as :func:`_crop_scaled` gives them."""
    x0, y0, x1, y1 = box
    pts = landmarks.astype(np.float64).copy()
    pts[:, 0] -= x0
    pts[:, 1] -= y0
    if scale >= 1.0:
        return pts
    w, h = x1 - x0, y1 - y0
    sw, sh = _scaled_size((h, w), scale)
    return _to_working(pts, (sw / w, sh / h))


def _source_box(image_shape: tuple[int, ...], landmarks: np.ndarray) -> tuple[int, int, int, int]:
    """The source face's neighbourhood that :func:`_source_crop` reads."""
    return masks.face_region(landmarks, image_shape, 2 * masks.feather_px(landmarks))


def _crop_scaled(
    image: np.ndarray, landmarks: np.ndarray, box: tuple[int, int, int, int], scale: float
) -> tuple[detail.Scaled, np.ndarray, np.ndarray]:
    """The ``box`` of ``image`` at full resolution and resized by ``scale`` (≤ 1):
    ``(crop, small (h, w, 3) uint8, landmarks (N, 3) in the small crop's pixel
    frame)``."""
    x0, y0, x1, y1 = box
    # A copy, never a view: the crop may be kept (the source memo) after ``image``.
    full = np.array(image[y0:y1, x0:x1], order="C")
    crop = detail.Scaled(full, _scaled_size(full.shape, scale))
    pts = _crop_points(landmarks, box, scale)
    if scale >= 1.0:
        return crop, full, pts
    small = cv2.resize(full, crop.small, interpolation=cv2.INTER_AREA)
    return crop, np.ascontiguousarray(small), pts


def _without_highlights(crop: detail.Scaled, small: np.ndarray, landmarks: np.ndarray
                        ) -> tuple[detail.Scaled, np.ndarray]:
    """The source crop and its working copy with the skin's specular highlights
    taken out (:mod:`facefuse.fusion.swappers.classic.specular`), found at the working scale and
    applied at both."""
    small, weight, mean = specular.suppress(small, landmarks)
    if mean is None:
        return crop, small
    if crop.small == crop.size:
        return detail.Scaled(small, crop.small), small
    full = crop.full
    window = detail.nonzero_window(weight, crop.ratio, crop.size)
    if window is not None:
        # Highlights are a small part of the face: only their window is touched.
        x0, y0, x1, y1 = window
        full = crop.full.copy()
        full[y0:y1, x0:x1] = specular.apply(
            full[y0:y1, x0:x1], detail.upsample_window(weight, crop.ratio, window),
            detail.upsample_window(mean, crop.ratio, window))
    return detail.Scaled(full, crop.small), small


def _source_crop(image: np.ndarray, landmarks: np.ndarray, scale: float, relit: bool
                 ) -> tuple[detail.Scaled, np.ndarray, np.ndarray, np.ndarray]:
    """The source face's neighbourhood as :func:`_crop_scaled` gives it, with its
    highlights taken out when the layer is ``relit``, and its working copy as it was
    (where its occluders are looked for: a lens's reflections are part of what
    shows a pair of glasses)."""
    crop, small, local = _crop_scaled(image, landmarks, _source_box(image.shape, landmarks),
                                      scale)
    seen = small
    if relit:
        crop, small = _without_highlights(crop, small, local)
    return crop, small, local, seen


#: How far :func:`_crisp`'s growth and feather reach beyond the occluder, rows.
_CRISP_REACH = 4


#: σ of the smoothing of a kept occluder's mask upsampled from the working scale,
#: in working pixels.
KEEP_SMOOTH = 0.6
#: A target whose forehead (brow line to the oval's top) is covered over more than
#: this share (a fringe, curls) is blended only over :data:`FRINGE_FOREHEAD` of its
#: forehead's height: the strands the occluder rule misses between the ones it
#: finds turned see-through over the source's forehead, and the found ones were cut
#: out with an edge. (None of it cost the samples' identity: the astronaut's fringe
#: took her forehead, and degree 100 was nearer the source on 11 of 14 pairs.)
FRINGE_SHARE = 0.1
FRINGE_FOREHEAD = 0.3


def _forehead_share(tgt_occ: np.ndarray | None, dst: np.ndarray,
                    frame: masks.Region) -> float:
    """The share of the forehead the blend replaces (``keep_forehead`` of
    :func:`facefuse.fusion.mask.oval_mask`): less where the target's occluders
    ``tgt_occ`` (h, w) cover its forehead (see :data:`FRINGE_SHARE`)."""
    if tgt_occ is None or not tgt_occ.any():
        return masks.FOREHEAD_KEEP
    band = ((masks.oval_mask(dst, frame, 1.0, 1.0) > 0.5)
            & (masks.oval_mask(dst, frame, 1.0, 0.0) < 0.5))
    if not band.any() or float((tgt_occ[band] > 0.5).mean()) <= FRINGE_SHARE:
        return masks.FOREHEAD_KEEP
    return FRINGE_FOREHEAD


def _crisp(kept: np.ndarray) -> np.ndarray:
    """(H, W) float32: the (H, W) bool occluder mask grown by a pixel and feathered
    (σ 0.5), worked out only over the rows of its bounding box and what that reaches
    (0 beyond, as over the whole mask). Whole rows: OpenCV's blur of a row cut at
    another column sums in another order, a last-bit difference."""
    out = np.zeros(kept.shape, np.float32)
    _, y, w, h = cv2.boundingRect(kept.view(np.uint8))
    if w and h:
        r = _CRISP_REACH
        rows = np.s_[max(0, y - r):y + h + r]
        out[rows] = occ.soften(kept[rows].astype(np.float32), 1.0, 0.5)
    return out


def _to_working(points: np.ndarray, ratio: tuple[float, float]) -> np.ndarray:
    """Points (N, 3) in a crop's full pixel frame → its working frame, ``ratio`` =
    (x, y) working pixels per full pixel (pixel centres aligned: x ↔ (x + 0.5)·s −
    0.5; depth scaled by the mean ratio)."""
    sx, sy = ratio
    out = points.astype(np.float64).copy()
    out[:, 0] = (out[:, 0] + 0.5) * sx - 0.5
    out[:, 1] = (out[:, 1] + 0.5) * sy - 0.5
    out[:, 2] *= 0.5 * (sx + sy)
    return out


def _scaled_size(shape: tuple[int, ...], scale: float) -> tuple[int, int]:
    """The working (w, h) of an image of ``shape`` (h, w, ...) at ``scale``."""
    h, w = shape[:2]
    if scale >= 1.0:
        return w, h
    return max(1, round(w * scale)), max(1, round(h * scale))


#: Per-vertex fields (the relighting gains) are splatted on a grid this many times
#: coarser than the working resolution and upsampled: they are smooth.
FIELD_STEP = 4
#: Splat radius (Gaussian σ) of the vertex fields, as a fraction of the eye distance:
#: about the mesh's vertex spacing.
FIELD_SIGMA_FRACTION = 0.08


def _vertex_field(values: np.ndarray, points: np.ndarray, size: tuple[int, int],
                  sigma: float) -> np.ndarray:
    """Per-vertex RGB ``values`` (N, 3) at ``points`` (N, 2) spread into a smooth
    (h, w, 3) float32 image of ``size`` = (w, h): normalised Gaussian splatting
    (σ = ``sigma`` pixels) on a coarse grid, so the cost is a few small blurs."""
    w, h = size
    gw, gh = max(2, -(-w // FIELD_STEP)), max(2, -(-h // FIELD_STEP))
    ix = np.clip(np.rint(points[:, 0] / FIELD_STEP).astype(int), 0, gw - 1)
    iy = np.clip(np.rint(points[:, 1] / FIELD_STEP).astype(int), 0, gh - 1)
    num: np.ndarray = np.zeros((gh, gw, 3), np.float32)
    den: np.ndarray = np.zeros((gh, gw), np.float32)
    np.add.at(num, (iy, ix), values.astype(np.float32))
    np.add.at(den, (iy, ix), 1.0)
    s = max(0.7, sigma / FIELD_STEP)
    num = cv2.GaussianBlur(num, (0, 0), s, borderType=cv2.BORDER_REPLICATE)
    den = cv2.GaussianBlur(den, (0, 0), s, borderType=cv2.BORDER_REPLICATE)
    field = num / each_channel(np.maximum(den, 1e-3))
    field[den < 1e-3] = 1.0
    out: np.ndarray = cv2.resize(field, (w, h), interpolation=cv2.INTER_LINEAR)
    return out


#: Threads for the renders' source sides (see :class:`ClassicSwapper`): none by
#: default, like the ``render_side_threads`` setting (on 2 cores they cost CPU).
SIDE_THREADS = 0


#: Every classic swapper of the process, for :func:`_after_fork`.
_SWAPPERS: weakref.WeakSet[ClassicSwapper] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: every swapper without the parent's threads and locks (its
    source memo, whose lock may have been held too, starts empty)."""
    for swapper in list(_SWAPPERS):
        swapper._reset_side()
        if swapper.sources is not None:
            swapper.sources = SourceCache()


os.register_at_fork(after_in_child=_after_fork)


class _Inline(Executor):
    """An executor that runs each call at once, in the caller's thread."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except BaseException as e:  # handed to result(), as a pool would
            done.set_exception(e)
        return done


def _target_occluders(image: np.ndarray, landmarks: np.ndarray, options: FuseOptions
                      ) -> tuple[np.ndarray, np.ndarray | None]:
    """The target's occluders kept as they are (its glasses, a hand, hair over the
    face, less the eye openings and the lips) and, apart, its facial hair (or None
    when not looked for): the beard is laid over the fused face as the photo's
    shading of it (:func:`beard.lay_over`), never kept as the target's pixels."""
    kept = regions.face_occluders(image, landmarks, glasses=options.glasses, openings=True,
                                  colour=not is_monochrome(image))
    if not options.finds_facial_hair(source=False):
        return kept, None
    hair = regions.facial_hair_regions(image, landmarks)
    # (What the occluder rule finds over it, a hand or a microphone, stays kept.)
    hair *= 1.0 - kept
    return kept, hair if hair.any() else None


def _occluders(image: np.ndarray, landmarks: np.ndarray, options: FuseOptions,
               scale: float = 1.0, rim_grow: float = 0.0, source: bool = False) -> np.ndarray:
    """The face's occluders (see :func:`facefuse.fusion.swappers.classic.regions.face_occluders`),
    glasses and facial hair as the options ask for the ``source`` or the target,
    and the ``source``'s scalp hair inside its outline (never carried over)."""
    return regions.face_occluders(image, landmarks, scale=scale, glasses=options.glasses,
                                  facial_hair=options.finds_facial_hair(source=source),
                                  hairline=source, rim_grow=rim_grow, openings=not source)


@dataclass(frozen=True)
class _Source:
    """The source's side of a render, all in its working crop's frame: ``crop`` its
    full-resolution neighbourhood; ``image`` (h, w, 3) uint8 the working copy;
    ``landmarks`` (N, 3); ``occluders`` (h, w) float32 or None, found as its memo
    key ``occluders_key`` says (None: not looked for); ``outline`` (h, w) the face
    outline mask."""

    crop: detail.Scaled
    image: np.ndarray
    landmarks: np.ndarray
    occluders: np.ndarray | None
    outline: np.ndarray
    occluders_key: Hashable = None


def _cleaned(small: np.ndarray, local: np.ndarray, occluders: np.ndarray,
             outline: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The source's working image (h, w, 3) uint8 with its ``occluders`` filled from
    the skin inside its ``outline`` (:func:`skin_fill.fill_from_skin`), and the
    occluders (h, w) float32 with what was still dark after that fill
    (:func:`skin_fill.dark_residue`: a lens's lower rim, a strand the finders
    left), filled too."""
    d = eye_distance(local)
    readable = occ.readable_skin(small, local, outline)
    filled = skin_fill.fill_from_skin(small, skin_fill.covered(occluders, d), readable, d)
    h, w = small.shape[:2]
    features = np.maximum(masks.features_mask(local, (0, 0, w, h)), _nostrils(local, (h, w)))
    residue = skin_fill.dark_residue(small, filled, outline * (1.0 - occluders), features, d)
    if not residue.any():
        return filled, occluders
    more = np.maximum(occluders, residue)
    return skin_fill.fill_from_skin(small, skin_fill.covered(more, d), readable, d), more


def _nostrils(lm: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """(H, W) float32: the nose's underside, the wings to the base (mesh points)
    and the tip, where the nostrils' own darkness is."""
    out = np.zeros(shape, np.uint8)
    pts = np.round(lm[[98, 1, 327, 2], :2]).astype(np.int32)
    cv2.fillConvexPoly(out, cv2.convexHull(pts), 1)
    return out.astype(np.float32)


def _source_side(image: np.ndarray, landmarks: np.ndarray, scale: float, relit: bool,
                 options: FuseOptions, prep: SourceEntry) -> _Source:
    """What the render needs of the source alone (memoised in ``prep``, whose key
    holds ``scale`` and ``relit``), at ``scale``; its highlights out when ``relit``."""
    crop, small, local, seen = prep.get("crop",
                                        lambda: _source_crop(image, landmarks, scale, relit))
    occluders, key = None, None
    if options.reject_source_occluders and options.texture_weight > 0.0:
        key = ("occluders", options.glasses, options.finds_facial_hair(source=True))
        occluders = prep.get(
            key,
            lambda: _occluders(
                seen, local, options,
                scale=min(1.0, SOURCE_OCCLUDER_EYE_PX / eye_distance(local)),
                rim_grow=occ.SOURCE_RIM_GROW, source=True))
    outline = prep.get("outline", lambda: occ.outline_mask(local, small.shape))
    if occluders is not None and occluders.any():
        # What covers the source is filled from its own skin before anything is
        # warped (never shown as the target's pixels: that brought the target back).
        small, occluders = prep.get(("clean", key),
                                    lambda: _cleaned(small, local, occluders, outline))
    return _Source(crop, small, local, occluders, outline, key)


@dataclass(frozen=True)
class _Geometry:
    """The fused mesh over the target's working image: its ``triangles`` (T, 3), the
    symmetric fill's plan (or None), the remap ``maps`` of the target's, the
    source's and (with a fill) the mirrored points and fill weights, and ``valid``
    (h, w) bool inside the mesh; ``shared``: the triangles serve other frames of a
    clip too (the source's work on them is worth keeping in its memo)."""

    triangles: np.ndarray
    fill: sym.FillPlan | None
    maps: list[tuple[np.ndarray, np.ndarray]]
    valid: np.ndarray
    shared: bool = False


def _geometry(src_lm: np.ndarray, tgt_lm: np.ndarray, dst: np.ndarray, shape: tuple[int, ...],
              options: FuseOptions, carried: Carried | None = None) -> _Geometry:
    """The mesh geometry of a render over a target working image of ``shape``: the
    source's, the target's and the fused landmarks (N, 3) in their working frames
    (``carried``: a clip's findings, whose frames share the triangulation)."""
    h, w = shape[:2]
    mesh_dst = dst[:MESH_POINTS, :2]
    tris = (_triangles(mesh_dst, (w, h)) if carried is None
            else carried.triangles_for(mesh_dst, lambda pts: _triangles(pts, (w, h))))
    fill = (sym.plan_fill(src_lm, dst, tris)
            if options.symmetric_fill and options.texture_weight > 0 else None)
    # In a clip the fill is used wherever the direct sample is short of fully shown:
    # the gain gate could switch it on and off between frames (a face turning past
    # the bound), and the switch would show.
    if fill is not None and not (fill.needed if carried is None else fill.partial):
        fill = None
    point_sets = [tgt_lm[:MESH_POINTS, :2], src_lm[:MESH_POINTS, :2]]
    if fill is not None:
        point_sets += [fill.mirrored_points, fill.weight_points()]
    maps, valid = piecewise_affine_maps(point_sets, mesh_dst, tris, (0, 0, w, h))
    return _Geometry(tris, fill, maps, valid, carried is not None and tris is carried.triangles)


@dataclass
class _Work:
    """A face rendered at the working scale, (h, w) = the target working image.

    ``face`` (h, w, 3) float32 layer; ``mask`` (h, w) blend mask; ``keep`` the
    target's occluders (h, w) float32 binary or None; ``beyond`` (when evaluating)
    the share of the face's pixels with colour from beyond the source's face
    outline; ``target_layer`` (h, w, 3) the target warped onto the fused mesh;
    ``target_maps``/``source_maps`` the remap coordinates of the target's and the
    source's working images; ``valid`` (h, w) bool inside the mesh; ``direct``
    (h, w) the layer's share of the direct source sample; ``skin`` (h, w) where
    the skin's tone and detail are measured; ``features`` (h, w) the fused mesh's
    eyes, brows and lips (:func:`facefuse.fusion.mask.features_mask`), when the
    render drew them;
    ``own`` (h, w) in [0, 1] what is kept of the target's own eye openings and mouth.
    """

    face: np.ndarray
    mask: np.ndarray
    keep: np.ndarray | None
    beyond: float | None
    target_layer: np.ndarray
    target_maps: tuple[np.ndarray, np.ndarray]
    source_maps: tuple[np.ndarray, np.ndarray]
    valid: np.ndarray
    direct: np.ndarray
    skin: np.ndarray
    features: np.ndarray | None = None
    own: np.ndarray | None = None


class ClassicSwapper:
    """The default swapper; needs only the analysis models.

    ``pixels``: where the remaps and the lighting transfer run (default OpenCV).
    ``cache_sources``: keep the source-side work per source image
    (:mod:`facefuse.fusion.swappers.classic.source_prep`; a clip's frames share it).
    ``side_threads``: threads that run renders' source sides beside their target
    sides (0: in the calling thread). The two halves are independent, and much of
    each is NumPy/OpenCV work that releases the GIL, so with idle cores beyond
    OpenCV's own threads the stage is shorter. When every side thread is busy
    (many renders at once) the source side runs in the caller, so no render waits
    in a queue behind others.
    """

    name = "classic"

    def __init__(self, work_eye_px: float = WORK_EYE_PX,
                 pixels: PixelBackend | None = None, *, cache_sources: bool = True,
                 side_threads: int = SIDE_THREADS,
                 clip_eye_px: float = CLIP_WORK_EYE_PX) -> None:
        self.work_eye_px = work_eye_px
        self.clip_eye_px = clip_eye_px
        self.pixels: PixelBackend = pixels or OpenCVPixels()
        self.sources = SourceCache() if cache_sources else None
        self.side_threads = side_threads
        self._reset_side()
        _SWAPPERS.add(self)

    @property
    def needs_source_embedding(self) -> bool:
        """No: the render works on the meshes and the pixels alone."""
        return False

    @property
    def fork_safe(self) -> bool:
        """With OpenCV's pixels only: the ONNX pixel backend runs ONNX Runtime
        sessions, which do not survive a fork."""
        return isinstance(self.pixels, OpenCVPixels)

    def _reset_side(self) -> None:
        """No side threads and a fresh lock: at start, and in a forked child (threads
        do not survive a fork; a lock held by one of them at the fork would stay
        held)."""
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._side_busy = 0

    def _submit_side(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """``fn(*args)`` on a free side thread, or at once in the caller when none is
        free. The pool is made on first use."""
        with self._pool_lock:
            free = self._side_busy < self.side_threads
            if free:
                self._side_busy += 1
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.side_threads, "facefuse-source")
                pool = self._pool
        if not free:
            return _Inline().submit(fn, *args)
        try:
            done = pool.submit(fn, *args)
        except RuntimeError:  # the interpreter is shutting down: no new threads
            self._side_done()
            return _Inline().submit(fn, *args)
        done.add_done_callback(lambda _: self._side_done())
        return done

    def close(self) -> None:
        """Let the side threads go (a later render starts them again)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)

    def _side_done(self) -> None:
        with self._pool_lock:
            self._side_busy -= 1

    def render(
        self,
        source_rgb: np.ndarray,
        source_face: Face,
        target_rgb: np.ndarray,
        target_face: Face,
        options: FuseOptions,
        carried: Carried | None = None,
    ) -> FaceLayer:
        assert source_face.landmarks is not None
        assert target_face.landmarks is not None
        src_lm = source_face.landmarks.astype(np.float64)
        tgt_lm = target_face.landmarks.astype(np.float64)
        dst = fused_shape(src_lm, tgt_lm, options.shape_weight)
        feather = masks.feather_px(tgt_lm)
        region = masks.union_region(
            masks.face_region(tgt_lm, target_rgb.shape, 2 * feather),
            masks.face_region(dst, target_rgb.shape, 2 * feather),
        )
        x0, y0, x1, y1 = region
        # A clip's frame with carried findings renders at its own working scale.
        eye_px = (self.work_eye_px if carried is None
                  else carried.work_eye_px or self.clip_eye_px)
        scale = min(1.0, eye_px / max(1.0, eye_distance(tgt_lm)))
        # Everything in _layer runs in the region's frame at the working scale.
        region_rgb = np.ascontiguousarray(target_rgb[y0:y1, x0:x1])
        frame = detail.Scaled(region_rgb, _scaled_size(region_rgb.shape, scale))
        tgt_img = frame.full
        if scale < 1.0:
            tgt_img = cv2.resize(frame.full, frame.small, interpolation=cv2.INTER_AREA)
        origin = np.array([x0, y0, 0.0])
        tgt_local = _to_working(tgt_lm - origin, frame.ratio)
        dst_local = _to_working(dst - origin, frame.ratio)
        # The source is read at about the target face's working resolution (a
        # little finer, for the parts a turned target stretches): a much finer source
        # squeezed by the warp would alias into a texture sharper than the photo's.
        src_eye = min(eye_px, SOURCE_OVERSAMPLE * eye_distance(tgt_lm) * scale)
        # (On a grid 2 % apart, so that a clip's frames share the source-side work.)
        src_scale = quantised_scale(min(1.0, src_eye / max(1.0, eye_distance(src_lm))))
        relit = options.relight and options.texture_weight > 0.0
        prep = (UNCACHED if self.sources is None
                else self.sources.entry(source_rgb, src_lm, src_scale, relit))
        # The source's side (its crop, highlights, occluders, outline) needs only the
        # source: it runs beside the target's side (occluders, triangles, maps).
        side = self._submit_side(_source_side, source_rgb, src_lm, src_scale, relit, options,
                                 prep)
        try:
            src_box = _source_box(source_rgb.shape, src_lm)
            src_local = _crop_points(src_lm, src_box, src_scale)
            tgt_img = np.ascontiguousarray(tgt_img)
            tgt_occ = tgt_hair = None
            if options.keep_target_occluders and carried is None:
                tgt_occ, tgt_hair = _target_occluders(tgt_img, tgt_local, options)
            elif carried is not None and options.keep_target_occluders:
                # What moves on its own is found here; glasses and facial hair come
                # from the frame they were found on, moved with the face.
                tgt_occ = regions.face_occluders(tgt_img, tgt_local,
                                                 colour=not is_monochrome(tgt_img))
                worn = carried.mask_onto(tgt_lm, (x0, y0), frame.ratio, frame.small)
                if worn is not None:
                    np.maximum(tgt_occ, worn, out=tgt_occ)
                tgt_hair = carried.hair_onto(tgt_lm, (x0, y0), frame.ratio, frame.small)
                if tgt_hair is not None:
                    tgt_hair *= 1.0 - tgt_occ
            geometry = _geometry(src_local, tgt_local, dst_local, tgt_img.shape, options,
                                 carried)
        except BaseException:
            side.exception()  # the source side finishes; the target side's error is raised
            raise
        source = side.result()
        src_crop = source.crop
        work = self._layer(source, tgt_img, tgt_local, dst_local, feather * frame.ratio[0],
                           options, prep, tgt_occ, geometry, tgt_hair)
        face, mask, keep = work.face, work.mask, work.keep
        if scale < 1.0 or options.texture_weight > 0.0:
            # Every face, at the working scale or its own: the layer's change is
            # low-passed and the detail bands come from the source at its own
            # resolution, matched to the photo (rendered at its own scale, a small
            # face otherwise kept only the working render's softened detail).
            # The detail's energy is the skin's: the features' own edges are left out.
            h, w = tgt_img.shape[:2]
            features = (work.features if work.features is not None else
                        masks.features_mask(dst_local, (0, 0, w, h)))
            skin = work.skin * (1.0 - features)
            face = detail.full_resolution_layer(
                frame, work.target_maps, src_crop, work.source_maps, work.valid, work.face,
                work.target_layer, work.direct, skin, work.own)
        if scale < 1.0:
            mask = cv2.resize(mask, frame.size, interpolation=cv2.INTER_LINEAR)
        if options.texture_weight > 0.0:
            # The irises are read at full resolution, each face in its own image
            # (the source's once per source, in its memo).
            src_iris = prep.get("iris", lambda: eyes.iris_colour(
                src_crop.full, _crop_points(src_lm, src_box, 1.0)))
            # (A carried colour is missing when the eyes were shut on its frame.)
            tgt_iris = (carried.iris if carried is not None and carried.iris is not None
                        else eyes.iris_colour(frame.full, tgt_lm - origin))
            iris = eyes.iris_gains(src_iris, tgt_iris)
            eyes.recolour_irises(face, dst - origin, iris, options.texture_weight, feather)
        if tgt_hair is not None:
            beard.lay_over(face, frame, tgt_img, tgt_local, tgt_hair, work.face,
                           dst - origin, feather, options.texture_weight)
        if keep is not None:
            # At full size the occluder's outline is re-drawn crisp (one pixel of
            # growth covers its anti-aliased edge): its pixels must come back exactly.
            if scale < 1.0:
                keep = cv2.resize(keep, frame.size, interpolation=cv2.INTER_LINEAR)
                # (Smoothed over a working pixel first: cut at the threshold, the
                # working pixels' squares showed as a stair-stepped edge on a hair
                # curl over a 400-px face's forehead.)
                keep = cv2.GaussianBlur(keep, (0, 0), KEEP_SMOOTH / min(frame.ratio))
            keep = _crisp(keep > 0.25)
        if is_monochrome(frame.full):
            # A black-and-white photo stays so: the source's colour is not brought in.
            face[...] = (face @ detail.LUMA)[..., None]
        return FaceLayer(region, face, mask, dst, keep, work.beyond)

    def _layer(
        self,
        source: _Source,
        tgt_img: np.ndarray,
        tgt_lm: np.ndarray,
        dst: np.ndarray,
        feather: float,
        options: FuseOptions,
        prep: SourceEntry,
        tgt_occ: np.ndarray | None,
        geometry: _Geometry,
        tgt_hair: np.ndarray | None = None,
    ) -> _Work:
        """The working-scale render over the whole of ``tgt_img`` (see :class:`_Work`);
        all coordinates in the frames of the given images. ``prep``: the memo of this
        source's work (what depends on the source alone is kept there); ``tgt_occ``
        the target's occluders (or None) and ``geometry`` the mesh's maps."""
        src_img, src_lm, src_occ, outline = source.image, source.landmarks, source.occluders, \
            source.outline
        h, w = tgt_img.shape[:2]
        frame = (0, 0, w, h)
        mesh_dst = dst[:MESH_POINTS, :2]
        tris, fill, maps, valid = geometry.triangles, geometry.fill, geometry.maps, geometry.valid
        w_tex = options.texture_weight
        relight = options.relight and w_tex > 0.0
        (mx_t, my_t), (mx_s, my_s) = maps[:2]
        outside = ~valid
        # Outside the mesh the maps are undefined: use the target's own pixels there,
        # so coarse pyramid levels of the blend never see invented content.
        target_layer = self.pixels.remap(tgt_img, mx_t, my_t)
        copy_where(target_layer, tgt_img, outside)
        mask = masks.oval_mask(dst, frame, feather, _forehead_share(tgt_occ, dst, frame)
                               ) * valid.astype(np.float32)
        if tgt_occ is not None:
            tgt_occ = tgt_occ if tgt_occ.any() else None
        if tgt_occ is not None:
            mask *= 1.0 - occ.soften(tgt_occ, 1.0, 0.5)
        if w_tex <= 0.0:
            return _Work(target_layer, mask, tgt_occ, 0.0 if options.evaluate else None,
                         target_layer, (mx_t, my_t), (mx_s, my_s), valid,
                         np.zeros(mask.shape, np.float32), mask)
        source_layer = self.pixels.remap(src_img, mx_s, my_s)
        # The source's own colours (before its relighting and tone match): its dark
        # pixels keep their hue (light.keep_dark_hue).
        raw = source_layer.copy()
        gains = None
        # The source's work on the fused mesh's triangles, memoised under them when
        # a clip's frames share their triangulation (fusion.carry).
        # (The source's occluders they read are named by their own memo key.)
        on_tris: Hashable = None
        tri_memo = UNCACHED
        if geometry.shared:
            on_tris, tri_memo = (tris.tobytes(), source.occluders_key), prep
        if relight:
            src_light = tri_memo.get(("light", on_tris), lambda: light.source_lighting(
                src_img, src_lm[:MESH_POINTS], tris, src_occ))
            gains = light.layer_gains(src_img, src_lm, tgt_img, tgt_lm, dst[:MESH_POINTS], tris,
                                      src_occ, tgt_occ, src_light)
            source_layer *= self._gain_field(gains, mesh_dst, dst, (w, h))
        samples = [(mx_s, my_s)]
        reject = None
        # Where the source was covered (and is filled): no source detail there.
        uncovered = self._uncovered(src_occ, mx_s, my_s, feather)
        if src_occ is not None or options.symmetric_fill:
            # Nothing from beyond the source's face outline (its background, hair
            # or collar where the mesh's edge overshoots): crisp, not grown. (Also
            # where the fill is on but not needed: a frontal source onto a turned
            # target reads past its outline there.)
            crisp = prep.get("crisp", lambda: sym.outline_field(outline))
            keep = inside = sym.sample_field(crisp, mx_s, my_s)
            if fill is not None:
                # Hidden or foreshortened parts from the source's other half, in
                # the source's lighting of the side they are drawn on.
                (mx_m, my_m), (vis_d, vis_m) = maps[2], maps[3]
                samples.append((mx_m, my_m))
                soft = prep.get("soft", lambda: sym.outline_field(
                    outline, sym.RAMP * eye_distance(src_lm)))
                mirror_ok = vis_m * sym.sample_field(crisp, mx_m, my_m)
                d, m = sym.combine(vis_d * inside, vis_d * sym.sample_field(soft, mx_s, my_s),
                                   mirror_ok, vis_m * sym.sample_field(soft, mx_m, my_m))
                mirror_layer = self.pixels.remap(src_img, mx_m, my_m)
                mirror_raw = mirror_layer.copy()
                tone = tri_memo.get(("side_tone", on_tris), lambda: sym.side_tone(
                    src_img, src_lm, tris, eye_distance(src_lm), src_occ, outline,
                    prep.get("tone", lambda: sym.tone_colours(
                        src_img, src_lm, eye_distance(src_lm), outline))))
                mirror_layer *= self._gain_field(tone if gains is None else tone * gains,
                                                 mesh_dst, dst, (w, h))
                source_layer = sym.mix(source_layer, d, mirror_layer, m)
                raw = sym.mix(raw, d, mirror_raw, m)
                keep = d + m
            reject = 1.0 - keep
        copy_where(source_layer, target_layer, outside)
        copy_where(raw, target_layer, outside)
        skin = (mask > 0.5).astype(np.float32)
        if reject is not None:
            skin *= 1.0 - reject
        if tgt_hair is not None:
            # The target's beard is not its skin's light (it is laid over after).
            skin *= 1.0 - tgt_hair
        sigma = max(2.0, LIGHTING_SIGMA_FRACTION * eye_distance(dst))
        source_layer = self.pixels.lighting(source_layer, target_layer, skin, sigma,
                                            LIGHTING_MAX_GAIN)
        light.keep_dark_hue(source_layer, raw, skin)
        # Lipstick is the photo's: the lips take the target's own colour.
        makeup.take_photo_colours(source_layer, target_layer, dst, feather)
        source_layer = match_sharpness(source_layer, target_layer, skin)
        alpha = np.full(mask.shape, w_tex, np.float32)
        if reject is not None:
            alpha *= 1.0 - reject
        # What is kept of the target's own features (its open mouth, its eye
        # and nostril openings): 1 - own is the share of the layer they leave to the render.
        aperture = masks.eyes_mask(dst, frame, feather)
        left = 1.0 - EYE_KEEP * aperture
        # Its nostril openings are cavities in its pose and light, too: kept as far
        # as it is seen from further below than the source, which shows less.
        below = nostrils.pose_share(tgt_lm, src_lm)
        if below > 0.0:
            holes = nostrils.openings(target_layer, dst)
            shown = prep.get("nostrils", lambda: nostrils.area(
                nostrils.openings(src_img, src_lm), src_lm))
            keep_holes = below * nostrils.lacking(nostrils.area(holes, dst), shown)
            if keep_holes > 0.0:
                left *= 1.0 - np.float32(keep_holes) * nostrils.soften(holes, feather)
        if masks.mouth_open(dst):
            left *= 1.0 - masks.lips_mask(dst, frame, feather)
        elif masks.mouth_open(src_lm):
            # The source's lips were parted: squeezed shut they would carry its teeth
            # and inner lips into a closed mouth. The target's closed lips stay.
            left *= 1.0 - SOURCE_OPEN_LIPS_KEEP * masks.lips_mask(dst, frame, feather)
        alpha *= left
        features = None
        if relight:
            # The target's own highlights are the scene's light on its face: kept.
            # They are looked for on its skin: the outline without the features.
            features = masks.features_mask(dst, frame)
            face_skin = occ.outline_mask(dst, target_layer.shape) * (1.0 - features)
            alpha *= 1.0 - specular.highlights(target_layer, dst, face_skin)
        # target + alpha * (source - target), in place.
        source_layer -= target_layer
        source_layer *= each_channel(alpha)
        source_layer += target_layer
        beyond = None
        if options.evaluate:
            weights = [alpha] if fill is None else [alpha * d, alpha * m]
            beyond = sym.outside_share(
                [(wt, x, y) for wt, (x, y) in zip(weights, samples, strict=True)],
                outline, mask > 0)
        direct = alpha if fill is None else alpha * np.where(keep > 0, d / np.maximum(keep, 1e-6),
                                                               0.0).astype(np.float32)
        if uncovered is not None:
            # Over the fill the source has no detail of its own: the photo's stays.
            direct = direct * uncovered
        return _Work(source_layer, mask, tgt_occ, beyond, target_layer, (mx_t, my_t),
                     (mx_s, my_s), valid, direct, skin, features, 1.0 - left)

    def carry(self, target_rgb: np.ndarray, target_face: Face, options: FuseOptions,
              source_face: Face | None = None) -> Carried:
        """The target face's glasses and facial hair (as the options ask for them),
        found at the working scale, its iris colour and (given the face fused into
        it) the fused mesh's triangulation: for the next frames of a clip
        (:mod:`facefuse.fusion.carry`)."""
        assert target_face.landmarks is not None
        lm = target_face.landmarks.astype(np.float64)
        box = masks.face_region(lm, target_rgb.shape, 2 * masks.feather_px(lm))
        scale = min(1.0, self.work_eye_px / max(1.0, eye_distance(lm)))
        hair = options.finds_facial_hair(source=False)
        mask, ratio, beard = None, (1.0, 1.0), None
        if options.keep_target_occluders and (options.glasses or hair):
            crop, small, local = _crop_scaled(target_rgb, lm, box, scale)
            ratio = crop.ratio
            mask = regions.worn_regions(small, local, glasses=options.glasses,
                                        facial_hair=False, openings=True)
            if hair:
                beard = regions.facial_hair_regions(small, local)
                beard = beard if beard.any() else None
        iris = eyes.iris_colour(target_rgb, lm) if options.texture_weight > 0.0 else None
        h, w = target_rgb.shape[:2]
        cut = box[0] <= 0 or box[1] <= 0 or box[2] >= w or box[3] >= h
        tris = None
        if source_face is not None and source_face.landmarks is not None:
            dst = fused_shape(source_face.landmarks.astype(np.float64), lm, options.shape_weight)
            tris = delaunay(dst[:MESH_POINTS, :2])
            tris.flags.writeable = False
        return Carried(mask, box, ratio, lm[:MESH_POINTS, :2].copy(), iris, cut, tris, beard)

    @staticmethod
    def _gain_field(gains: np.ndarray, mesh_dst: np.ndarray, dst: np.ndarray,
                    size: tuple[int, int]) -> np.ndarray:
        """The per-vertex relighting gains (468, 3) as a smooth (h, w, 3) field."""
        return _vertex_field(gains**RELIGHT_STRENGTH, mesh_dst, size,
                             FIELD_SIGMA_FRACTION * eye_distance(dst))

    @staticmethod
    def _uncovered(src_occ: np.ndarray | None, mx: np.ndarray, my: np.ndarray,
                   feather: float) -> np.ndarray | None:
        """(h, w) float32 in [0, 1]: 1 where the source sampled at (mx, my) is off
        its occluders, grown and feathered (their soft edges must not bleed in);
        None without an occluder mask."""
        if src_occ is None:
            return None
        warped = cv2.remap(src_occ, mx, my, cv2.INTER_LINEAR,
                           borderMode=cv2.BORDER_CONSTANT, borderValue=1.0)
        grow = OCCLUDER_GROW * feather
        out: np.ndarray = 1.0 - occ.soften(warped, grow, grow)
        return out
