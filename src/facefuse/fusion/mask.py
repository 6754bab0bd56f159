"""Blend masks from the face mesh: the feathered face oval, the lips, the eyes.

Masks are float32 in [0, 1] over a region ``(x0, y0, x1, y1)`` of the target
image (pixels, x1/y1 exclusive). Feathering scales with face size; a face cut by
the image border keeps full weight up to the border (the border is not a seam).
"""

from __future__ import annotations

import cv2
import numpy as np

from facefuse.faces import topology as topo
from facefuse.fusion.geometry import eye_distance, openness

Region = tuple[int, int, int, int]

#: Feather width as a fraction of the outer-eye-corner distance.
FEATHER_FRACTION = 0.18
#: Share of the forehead (brow line to the oval's top) that the blend replaces.
FOREHEAD_KEEP = 0.75
#: How far (in feather widths) the blend edge sits inside the face oval: the
#: source's own cheek and jaw shading at its outline stays out of the blend.
OVAL_INSET = 0.5
#: Mouth openness (inner-lip gap / width) above which the target's mouth interior is kept.
MOUTH_OPEN_THRESHOLD = 0.08


def face_region(landmarks: np.ndarray, shape: tuple[int, ...], margin: float) -> Region:
    """Bounding region of the face oval grown by ``margin`` pixels, clipped to the image."""
    pts = landmarks[list(topo.FACE_OVAL), :2]
    h, w = shape[:2]
    x0 = int(max(0, np.floor(pts[:, 0].min() - margin)))
    y0 = int(max(0, np.floor(pts[:, 1].min() - margin)))
    x1 = int(min(w, np.ceil(pts[:, 0].max() + margin) + 1))
    y1 = int(min(h, np.ceil(pts[:, 1].max() + margin) + 1))
    return x0, y0, x1, y1


def union_region(a: Region, b: Region) -> Region:
    return min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])


def feather_px(landmarks: np.ndarray) -> float:
    """Feather width in pixels for this face."""
    return max(2.0, FEATHER_FRACTION * eye_distance(landmarks))


def blend_outline(landmarks: np.ndarray, keep_forehead: float = FOREHEAD_KEEP) -> np.ndarray:
    """The face-oval polygon (K, 2) used for blending, in pixels.

    Oval points above the brows are pulled toward the brow line so only
    ``keep_forehead`` of the forehead height is replaced: a source's fringe or
    hairline (common on foreheads) never lands on the target's skin.
    """
    pts = landmarks[list(topo.FACE_OVAL), :2].astype(np.float64)
    brows = landmarks[list(topo.BROW_IMAGE_LEFT + topo.BROW_IMAGE_RIGHT), :2].astype(np.float64)
    up = landmarks[topo.FOREHEAD, :2] - landmarks[topo.CHIN, :2]
    up = up / max(1e-6, float(np.linalg.norm(up)))
    brow_level = float((brows @ up).max())
    height = pts @ up - brow_level
    above = height > 0
    pts[above] -= np.outer(height[above] * (1.0 - keep_forehead), up)
    return pts


def _draw_points(points: np.ndarray, region: Region, pad: int) -> np.ndarray:
    """Filled anti-aliased polygon (uint8 0/255) of ``points`` (K, 2) on the region
    grown by ``pad`` pixels."""
    x0, y0, x1, y1 = region
    canvas = np.zeros((y1 - y0 + 2 * pad, x1 - x0 + 2 * pad), np.uint8)
    offset = np.array([x0 - pad, y0 - pad], np.float64)
    pts = np.round((points - offset) * 4).astype(np.int32)
    cv2.fillPoly(canvas, [pts], 255, lineType=cv2.LINE_AA, shift=2)
    return canvas


def _draw(
    landmarks: np.ndarray, idx: tuple[int, ...], region: Region, pad: int
) -> np.ndarray:
    """Filled anti-aliased polygon of mesh points ``idx`` (see :func:`_draw_points`)."""
    return _draw_points(landmarks[list(idx), :2], region, pad)


def inside_contour(landmarks: np.ndarray, idx: tuple[int, ...], region: Region) -> np.ndarray:
    """(H, W) bool over ``region``: inside the polygon of mesh points ``idx`` (its
    anti-aliased edge at half coverage), unsoftened."""
    out: np.ndarray = _draw(landmarks, idx, region, 0) > 127
    return out


#: Masks blurred by at least this σ (pixels) are eroded and blurred at half size and
#: upsampled: what survives such a blur survives the decimation.
HALF_SIZE_SIGMA = 4.0


def _soften(canvas: np.ndarray, erode_px: float, sigma: float, pad: int) -> np.ndarray:
    h, w = canvas.shape[0] - 2 * pad, canvas.shape[1] - 2 * pad
    full = canvas.shape[::-1]
    step = 2 if sigma >= HALF_SIZE_SIGMA and min(canvas.shape) >= 32 else 1
    if step > 1:
        canvas = cv2.resize(canvas, ((full[0] + 1) // 2, (full[1] + 1) // 2),
                            interpolation=cv2.INTER_AREA)
        # Box decimation by 2 is itself a blur of about σ 0.5 (full pixels).
        sigma = (sigma * sigma - 0.25) ** 0.5
    m: np.ndarray = canvas.astype(np.float32) / 255.0
    # At half size the radius keeps its fraction, and the new edge is drawn
    # anti-aliased from the distance (a whole-pixel threshold there would move it
    # in steps of two full pixels). A pixel centre at distance d from its nearest
    # opposite one lies d - 0.5 from the edge.
    r = round(erode_px) / step
    # Erode / dilate by a disc of radius r through the Euclidean distance transform:
    # linear in the pixel count whatever the radius (a kernel is O(r²) per pixel).
    if r > 0:
        dist = cv2.distanceTransform((canvas > 127).astype(np.uint8), cv2.DIST_L2, 5)
        m = (np.where(dist > r, m, 0.0) if step == 1 else
             np.clip(dist - r, 0.0, 1.0)).astype(np.float32)
    elif r < 0:
        outside = canvas <= 127
        dist = cv2.distanceTransform(outside.astype(np.uint8), cv2.DIST_L2, 5)
        m = (np.where(dist <= -r, 1.0, m) if step == 1 else
             np.where(outside, np.clip(1.0 - r - dist, 0.0, 1.0), 1.0)).astype(np.float32)
    m = cv2.GaussianBlur(m, (0, 0), sigmaX=sigma / step, sigmaY=sigma / step,
                         borderType=cv2.BORDER_CONSTANT)
    if step > 1:
        m = cv2.resize(m, full, interpolation=cv2.INTER_LINEAR)
    out: np.ndarray = np.clip(m[pad:pad + h, pad:pad + w], 0.0, 1.0).astype(np.float32)
    return out


def _feature_mask(landmarks: np.ndarray, contours: tuple[tuple[int, ...], ...], region: Region,
                  erode_px: float, sigma: float) -> np.ndarray:
    """Soft mask (H, W) float32 over ``region`` of the union of the filled mesh
    ``contours``, grown by ``-erode_px`` and blurred by ``sigma`` (see :func:`_soften`).

    Only the contours' bounding box grown by the growth plus the blur's reach (4 σ)
    is drawn and softened: a feature is a small part of the face region, and
    outside that box the mask is exactly 0.
    """
    pad = int(np.ceil(max(0.0, -erode_px) + 4.0 * sigma)) + 2
    x0, y0, x1, y1 = region
    out = np.zeros((y1 - y0, x1 - x0), np.float32)
    pts = landmarks[[i for idx in contours for i in idx], :2]
    bx0 = max(x0, int(np.floor(pts[:, 0].min())) - pad)
    by0 = max(y0, int(np.floor(pts[:, 1].min())) - pad)
    bx1 = min(x1, int(np.ceil(pts[:, 0].max())) + pad + 1)
    by1 = min(y1, int(np.ceil(pts[:, 1].max())) + pad + 1)
    if bx1 <= bx0 or by1 <= by0:
        return out
    box = (bx0, by0, bx1, by1)
    canvas = np.maximum.reduce([_draw(landmarks, idx, box, pad) for idx in contours])
    out[by0 - y0:by1 - y0, bx0 - x0:bx1 - x0] = _soften(canvas, erode_px, sigma, pad)
    return out


def oval_mask(landmarks: np.ndarray, region: Region, feather: float | None = None,
              keep_forehead: float = FOREHEAD_KEEP) -> np.ndarray:
    """Soft face-oval mask (H, W) float32 over ``region``: 1 inside, 0 outside,
    a ramp of about ``feather`` pixels just inside the oval; ``keep_forehead`` of
    the forehead's height above the brows is inside (:func:`blend_outline`).

    Drawn on a canvas extended past the region, so a face cut by the image border
    keeps full weight up to the border (the border is not a seam).
    """
    f = feather if feather is not None else feather_px(landmarks)
    pad = int(np.ceil(2 * f)) + 2
    canvas = _draw_points(blend_outline(landmarks, keep_forehead), region, pad)
    return _soften(canvas, OVAL_INSET * f, max(0.8, f / 2.5), pad)


def mouth_open(landmarks: np.ndarray) -> bool:
    """Whether the mouth is open (openness > :data:`MOUTH_OPEN_THRESHOLD`)."""
    return openness(landmarks)["mouth"] > MOUTH_OPEN_THRESHOLD


def lips_mask(landmarks: np.ndarray, region: Region, feather: float | None = None) -> np.ndarray:
    """Soft mask (H, W) float32 of the mouth inside its outer-lip contour, open or not."""
    f = feather if feather is not None else feather_px(landmarks)
    return _feature_mask(landmarks, (topo.LIPS_OUTER,), region, -0.1 * f, max(0.6, f / 4.0))


def eyes_mask(landmarks: np.ndarray, region: Region, feather: float | None = None) -> np.ndarray:
    """Soft mask (H, W) float32 of both eye openings (inside the lid contours)."""
    f = feather if feather is not None else feather_px(landmarks)
    return _feature_mask(landmarks, (topo.EYE_IMAGE_LEFT, topo.EYE_IMAGE_RIGHT), region,
                         -0.1 * f, max(0.6, f / 6.0))


def openings_mask(landmarks: np.ndarray, region: Region,
                  feather: float | None = None) -> np.ndarray:
    """Soft mask (H, W) float32 of what of a face a worn thing (a clear lens, a
    beard) never hides: the eye openings (grown by a twentieth of a feather width: a
    lens's lower rim runs close below the lid and stays), the lips shrunk by a fifth
    (a moustache over the upper lip's edge stays on top)."""
    f = feather if feather is not None else feather_px(landmarks)
    sigma = max(0.6, f / 8.0)
    eyes = _feature_mask(landmarks, (topo.EYE_IMAGE_LEFT, topo.EYE_IMAGE_RIGHT), region,
                         -0.05 * f, max(0.6, f / 12.0))
    lips = _feature_mask(landmarks, (topo.LIPS_OUTER,), region, 0.2 * f, sigma)
    out: np.ndarray = np.maximum(eyes, lips)
    return out


def features_mask(landmarks: np.ndarray, region: Region,
                  feather: float | None = None) -> np.ndarray:
    """Soft mask (H, W) float32 of the eyes, the brows and the lips, each grown by a
    quarter feather width: where the face's own features, not its skin, are."""
    f = feather if feather is not None else feather_px(landmarks)
    return _feature_mask(landmarks, (topo.EYE_IMAGE_LEFT, topo.EYE_IMAGE_RIGHT,
                                     topo.BROW_IMAGE_LEFT, topo.BROW_IMAGE_RIGHT,
                                     topo.LIPS_OUTER), region, -0.25 * f, max(0.6, f / 6.0))


def boundary_band(mask: np.ndarray, low: float = 0.05, high: float = 0.95) -> np.ndarray:
    """Boolean (H, W) band where the mask is neither off nor fully on: the seam."""
    return (mask > low) & (mask < high)
