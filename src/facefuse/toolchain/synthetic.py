"""Reproducible synthetic variants of the sample photos, for tests and benchmarks.

* :func:`paste_occluder` — an occluder over a face, its pixels taken from another
  real image: a ``"bar"`` (a tilted band across the cheek and mouth) or
  ``"sunglasses"`` (two dark lenses and a bridge over the eyes), textured from
  the donor image away from its face (background, hair, clothes), or a ``"hand"``
  (palm and four fingers over the lower face) textured with the donor's skin. Returns the
  image and the occluder's exact footprint.
* :func:`relight_gradient` — the image lit by a known horizontal gradient across
  the face (a multiplicative ramp in linear gain).

Same inputs → same output: nothing is random but the seeded texture offsets.
"""

from __future__ import annotations

from typing import Literal

import cv2
import numpy as np

from facefuse.faces import topology as topo
from facefuse.fusion.geometry import eye_distance

OccluderKind = Literal["bar", "sunglasses", "hand"]
OCCLUDER_KINDS: tuple[OccluderKind, ...] = ("bar", "sunglasses", "hand")
#: Lens transmission of the synthetic sunglasses (the donor pixels are dimmed by it).
LENS_TRANSMISSION = 0.3


def _footprint(kind: OccluderKind, lm: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Binary (H, W) bool footprint of an occluder over the face ``lm`` (N, 3)."""
    d = eye_distance(lm)
    m = np.zeros(shape, np.uint8)
    eyes = [lm[list(e), :2].mean(0) for e in (topo.EYE_IMAGE_LEFT, topo.EYE_IMAGE_RIGHT)]
    if kind == "bar":
        a = lm[topo.FACE_EDGE_IMAGE_LEFT, :2] + np.array([-0.2 * d, 0.45 * d])
        b = lm[topo.FACE_EDGE_IMAGE_RIGHT, :2] + np.array([0.2 * d, 0.05 * d])
        cv2.line(m, tuple(np.round(a).astype(int)), tuple(np.round(b).astype(int)), 255,
                 max(2, round(0.22 * d)))
    elif kind == "sunglasses":
        for c in eyes:
            cv2.ellipse(m, (round(c[0]), round(c[1])), (round(0.3 * d), round(0.22 * d)),
                        0, 0, 360, 255, -1)
        cv2.line(m, tuple(np.round(eyes[0]).astype(int)), tuple(np.round(eyes[1]).astype(int)),
                 255, max(2, round(0.05 * d)))
    else:  # a hand over the lower face, fingers pointing up-right
        chin = lm[topo.CHIN, :2]
        mouth = lm[list(topo.MOUTH_CORNERS), :2].mean(0)
        palm = chin + np.array([-0.25 * d, 0.1 * d])
        cv2.ellipse(m, (round(palm[0]), round(palm[1])), (round(0.42 * d), round(0.3 * d)),
                    -20, 0, 360, 255, -1)
        for k in range(4):
            base = palm + np.array([(-0.25 + 0.17 * k) * d, -0.15 * d])
            tip = mouth + np.array([(-0.35 + 0.2 * k) * d, (-0.25 + 0.05 * abs(k - 1.5)) * d])
            cv2.line(m, tuple(np.round(base).astype(int)), tuple(np.round(tip).astype(int)), 255,
                     max(2, round(0.13 * d)))
    return m > 127


def _texture(kind: OccluderKind, donor: np.ndarray, donor_lm: np.ndarray | None,
             shape: tuple[int, int], seed: int) -> np.ndarray:
    """An (H, W, 3) uint8 texture from the donor's real pixels."""
    h, w = shape
    rng = np.random.default_rng(seed)
    if kind == "hand" and donor_lm is not None:
        # Skin: a patch of the donor's cheek, scaled up to cover the frame.
        d = eye_distance(donor_lm)
        c = donor_lm[topo.NOSE_TIP, :2] + np.array([-0.45 * d, 0.05 * d])
        r = 0.14 * d
        x0, y0 = int(max(0, c[0] - r)), int(max(0, c[1] - r))
        patch = donor[y0:int(c[1] + r), x0:int(c[0] + r)]
        tex: np.ndarray = cv2.resize(patch, (w, h), interpolation=cv2.INTER_CUBIC)
        return tex
    if donor_lm is not None:
        # Not the donor's face: the larger strip above its forehead or below its chin.
        d = eye_distance(donor_lm)
        top = int(max(0, donor_lm[topo.FOREHEAD, 1] - 0.6 * d))
        bottom = int(min(donor.shape[0], donor_lm[topo.CHIN, 1] + 0.3 * d))
        strips = [donor[:top], donor[bottom:]]
        donor = max(strips, key=lambda a: a.shape[0])
    dh, dw = donor.shape[:2]
    scale = max(h / dh, w / dw, 1.0)
    big = cv2.resize(donor, (int(np.ceil(dw * scale)), int(np.ceil(dh * scale))))
    oy = int(rng.integers(0, big.shape[0] - h + 1))
    ox = int(rng.integers(0, big.shape[1] - w + 1))
    tex = big[oy:oy + h, ox:ox + w]
    if kind == "sunglasses":
        tex = (tex.astype(np.float32) * LENS_TRANSMISSION).astype(np.uint8)
    return np.ascontiguousarray(tex)


def paste_occluder(
    image: np.ndarray,
    landmarks: np.ndarray,
    kind: OccluderKind,
    donor: np.ndarray,
    donor_landmarks: np.ndarray | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``image`` (H, W, 3) uint8 with an occluder over the face ``landmarks`` (N, 3).

    Args:
        kind: ``"bar"``, ``"sunglasses"`` or ``"hand"``.
        donor: (H', W', 3) uint8 RGB of another image whose pixels texture it.
        donor_landmarks: the donor's face mesh (a hand takes its skin from there).
        seed: picks the texture's offset in the donor.
    Returns:
        (the occluded copy, (H, W) bool footprint of the occluder).
    """
    fp = _footprint(kind, np.asarray(landmarks, np.float64), image.shape[:2])
    tex = _texture(kind, donor, donor_landmarks, image.shape[:2], seed)
    out = image.copy()
    out[fp] = tex[fp]
    return out, fp


def relight_gradient(image: np.ndarray, landmarks: np.ndarray, strength: float) -> np.ndarray:
    """``image`` (H, W, 3) uint8 multiplied by ``1 + strength·(x − cx)/d`` (clipped to
    [0.2, 2]): light from the image-right side when ``strength`` > 0. ``cx`` is the
    face centre and ``d`` its outer-eye-corner distance, so a face's two sides differ
    by about ±``strength`` in gain."""
    d = eye_distance(landmarks)
    cx = float(landmarks[topo.NOSE_TIP, 0])
    x = np.arange(image.shape[1], dtype=np.float32)
    gain = np.clip(1.0 + strength * (x - cx) / d, 0.2, 2.0)
    out: np.ndarray = np.clip(image.astype(np.float32) * gain[None, :, None], 0, 255)
    return out.astype(np.uint8)
