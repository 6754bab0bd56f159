"""Measurements of fusion trials on synthetic variants (tests, bench/fuse_quality.py).

The variants come from :mod:`facefuse.toolchain.synthetic` (occluders pasted from
another photo's real pixels, a known lighting gradient) and the trials from
:mod:`facefuse.toolchain.trials`: occluder survival and leak, the lighting gradient
a fusion leaves, and the skin-tone step (ΔE) across the blend edge. Images are RGB
uint8 (H, W, 3), landmarks (478, 3) pixels.
"""

from __future__ import annotations

import cv2
import numpy as np

from facefuse.faces import topology as topo
from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.swappers.classic.occlusion import fit_skin_model, skin_probability
from facefuse.imaging.color import rgb_to_lab

#: A kept occluder pixel may differ from its original by at most this (grey levels, any channel).
SURVIVAL_TOLERANCE = 8
#: An output pixel counts as leaked occluder when it differs from the clean run by more.
LEAK_THRESHOLD = 25
#: Window (eye distances) of the local colour range a leaked pixel must fall outside.
LEAK_WINDOW = 0.03


def face_outline_mask(landmarks: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(H, W) bool: inside the mesh's face oval."""
    m = np.zeros(shape[:2], np.uint8)
    pts = np.round(landmarks[list(topo.FACE_OVAL), :2]).astype(np.int32)
    cv2.fillPoly(m, [pts], 1)
    return m > 0


def occluder_survival(output: np.ndarray, occluded_target: np.ndarray, footprint: np.ndarray,
                      target_landmarks: np.ndarray) -> float:
    """Share of the occluder's pixels inside the target's face oval that the fusion
    left unchanged (within :data:`SURVIVAL_TOLERANCE`). Images (H, W, 3) uint8,
    ``footprint`` (H, W) bool."""
    where = footprint & face_outline_mask(target_landmarks, output.shape)
    if not where.any():
        return 1.0
    diff = np.abs(output.astype(np.int16) - occluded_target.astype(np.int16)).max(-1)
    return float((diff[where] <= SURVIVAL_TOLERANCE).mean())


#: σ (pixels) of the blur a hair's fine detail is measured above (:func:`hair_kept`).
HAIR_DETAIL_SIGMA = 2.0


def hair_kept(output: np.ndarray, occluded_target: np.ndarray, footprint: np.ndarray,
              target_landmarks: np.ndarray) -> float:
    """How much of a target's facial hair the output keeps strand for strand: the
    correlation, over the hair's footprint inside the face oval, of the output's
    fine luma detail (the luma less its Gaussian blur of :data:`HAIR_DETAIL_SIGMA`
    pixels) with the occluded target's. 1: every strand where it was, with its
    contrast; about 0: the hair gone (the source's skin shows). The hair is laid over
    the fused skin, not kept as the target's pixels, so the skin between strands may
    change: pixel equality (:func:`occluder_survival`) does not apply. Images (H, W, 3)
    uint8, ``footprint`` (H, W) bool."""
    where = footprint & face_outline_mask(target_landmarks, output.shape)
    if int(where.sum()) < 2:
        return 1.0

    def fine(img: np.ndarray) -> np.ndarray:
        y = img.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
        out: np.ndarray = (y - cv2.GaussianBlur(y, (0, 0), HAIR_DETAIL_SIGMA))[where]
        return out

    a, b = fine(output), fine(occluded_target)
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else 0.0


def occluder_leak(output_occluded: np.ndarray, output_clean: np.ndarray, target: np.ndarray,
                  footprint: np.ndarray, source_landmarks: np.ndarray,
                  target_landmarks: np.ndarray) -> float:
    """Share of a source occluder that reached the output.

    A leaked pixel is one that is neither what fusing the clean source gives nor
    the target's own: outside both images' local colour ranges (per-channel min
    and max over a window of :data:`LEAK_WINDOW` eye distances, widened by
    :data:`LEAK_THRESHOLD`), so a rejected occluder showing the target's skin,
    or a feature moved a little by the fused geometry, does not count. Counted
    over the occluder's area inside the source's face oval, scaled to the target
    face's size; capped at 1. Images (H, W, 3) uint8, ``footprint`` (H', W') bool
    in the source's frame.
    """
    inside = footprint & face_outline_mask(source_landmarks, footprint.shape)
    area = float(inside.sum())
    if area == 0:
        return 0.0
    d_t = eye_distance(target_landmarks)
    scale = d_t / max(1e-6, eye_distance(source_landmarks))
    k = cv2.getStructuringElement(cv2.MORPH_RECT, (2 * round(LEAK_WINDOW * d_t) + 1,) * 2)
    out = output_occluded.astype(np.int16)

    def outside_range(ref: np.ndarray) -> np.ndarray:
        lo = cv2.erode(ref, k).astype(np.int16) - LEAK_THRESHOLD
        hi = cv2.dilate(ref, k).astype(np.int16) + LEAK_THRESHOLD
        res = np.asarray(((out < lo) | (out > hi)).any(-1))
        return res

    leaked = outside_range(output_clean) & outside_range(target)
    return min(1.0, float(leaked.sum()) / (area * scale**2))


def gradient_slope(image: np.ndarray, reference: np.ndarray, where: np.ndarray,
                   landmarks: np.ndarray) -> float:
    """Horizontal slope of log(luma(image) / luma(reference)) over ``where`` (bool),
    per eye distance: how much more one side of the face is lit than the other."""
    d = eye_distance(landmarks)
    cx = float(landmarks[topo.NOSE_TIP, 0])
    ys, xs = np.nonzero(where)
    if len(xs) < 10:
        return 0.0

    def luma(img: np.ndarray) -> np.ndarray:
        v = img[ys, xs].astype(np.float64)
        out: np.ndarray = 0.299 * v[:, 0] + 0.587 * v[:, 1] + 0.114 * v[:, 2] + 1.0
        return out

    r = np.log(luma(image) / luma(reference))
    u = (xs - cx) / d
    a = np.c_[u, np.ones_like(u)]
    slope = np.linalg.lstsq(a, r, rcond=None)[0][0]
    return float(slope)


def boundary_delta_e(output: np.ndarray, target: np.ndarray, mask: np.ndarray,
                     region: tuple[int, int, int, int], target_landmarks: np.ndarray,
                     sectors: int = 8) -> float:
    """Median over angular sectors around the face of the CIE76 ΔE (L*a*b*
    distance) between the fused skin just inside the blend edge (output) and the
    target's skin just outside it. Both rings are ``0.15 ×`` eye distance wide;
    the outer ring counts only the target's skin (its skin model)."""
    x0, y0, x1, y1 = region
    out_r, tgt_r = output[y0:y1, x0:x1], target[y0:y1, x0:x1]
    lm = target_landmarks - np.array([x0, y0, 0.0])
    width = max(2.0, 0.15 * eye_distance(lm))
    inner = mask >= 0.9
    outer = mask <= 0.05
    ring_in = inner & (cv2.distanceTransform(inner.astype(np.uint8), cv2.DIST_L2, 5) <= width)
    ring_out = outer & (cv2.distanceTransform(outer.astype(np.uint8), cv2.DIST_L2, 5) <= width)
    model = fit_skin_model(tgt_r, lm)
    if model is not None:
        ring_out &= skin_probability(tgt_r, model, 1.0) > 0.5
    lab_o, lab_t = rgb_to_lab(out_r), rgb_to_lab(tgt_r)
    h, w = mask.shape
    cx, cy = lm[topo.NOSE_TIP, 0], lm[topo.NOSE_TIP, 1]
    yy, xx = np.mgrid[0:h, 0:w]
    sector = ((np.arctan2(yy - cy, xx - cx) + np.pi) / (2 * np.pi) * sectors).astype(int) % sectors
    des = []
    for k in range(sectors):
        a, b = ring_in & (sector == k), ring_out & (sector == k)
        if a.sum() >= 20 and b.sum() >= 20:
            des.append(float(np.linalg.norm(lab_o[a].mean(0) - lab_t[b].mean(0))))
    return float(np.median(des)) if des else float("nan")
