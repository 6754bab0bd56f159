"""The target's nostril openings: kept, as its eye openings and open mouth are.

A nostril opening is a cavity in the target's pose and light, not skin: seen from
below (a raised chin, a low camera) the openings are large and dark, and a
source seen from further above has no pixels for them — fused, the nose of a
face seen from below came out as a smooth, flat wedge. The openings are read on
the target's own pixels warped onto the fused mesh (:func:`openings`): inside an
ellipse along each nostril (from the nose base to the wing, raised towards the
tip), the pixels much darker than the nose's own skin around the ellipses. They
are kept as far as the target is seen from further below than the source
(:func:`pose_share`) and shows more of them (:func:`lacking`): between two faces
in about the same pose the nostrils are the source's, its nose's shape (keeping
them anyway cost up to 0.034 of the recogniser's similarity to the source).
"""

from __future__ import annotations

import cv2
import numpy as np

from facefuse.fusion.geometry import eye_distance, head_pose
from facefuse.fusion.swappers.classic.detail import LUMA
from facefuse.imaging.stats import median

__all__ = ["area", "lacking", "openings", "pose_share", "soften"]

#: The nose base and each wing's base (mesh points): a nostril lies between.
NOSTRIL_PAIRS = ((2, 98), (2, 327))
#: The nose tip (mesh point): seen from below, the openings lie above the line
#: from the base to the wing, towards it.
NOSE_TIP = 1
#: The ellipse a nostril is looked for in, in eye distances: its centre raised
#: this far from the pair's midpoint towards :data:`NOSE_TIP`, reaching this far
#: past either point of the pair, and this far to either side of their line. (A
#: disc about the midpoint held only the middle of a long slit: the opening was
#: kept as a dot, the rest of it came from the source.)
NOSTRIL_RAISE = 0.04
NOSTRIL_REACH = 0.04
NOSTRIL_RADIUS = 0.07
#: The nose skin the openings are judged against: a ring this much wider than the
#: ellipses (eye distances), outside them.
SKIN_RING = 0.06
#: An opening's pixels are darker than this share of the ring's median luma, fully
#: below the lower share (a ramp between).
DARK = (0.35, 0.55)
#: The target seen from further below than the source by this much (degrees of
#: pitch) starts keeping its openings; by the second, keeps them all.
PITCH_RAMP = (8.0, 16.0)


def openings(image: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """(h, w) float32 in [0, 1]: how much each pixel of ``image`` (h, w, 3) float32
    or uint8, with the face's ``landmarks`` (N, 3) in its frame, is a nostril
    opening (the darkness ramp :data:`DARK` inside the ellipses); all 0 when the
    nose's skin is not in the frame."""
    h, w = image.shape[:2]
    out = np.zeros((h, w), np.float32)
    lm = np.asarray(landmarks, np.float64)
    d = eye_distance(lm)
    ellipses = np.zeros((h, w), np.uint8)
    ring = np.zeros((h, w), np.uint8)
    up = lm[NOSE_TIP, :2] - lm[NOSTRIL_PAIRS[0][0], :2]
    up /= max(1e-6, float(np.linalg.norm(up)))
    grown = SKIN_RING * d
    for a, b in NOSTRIL_PAIRS:
        axis = lm[b, :2] - lm[a, :2]
        c = 0.5 * (lm[a, :2] + lm[b, :2]) + NOSTRIL_RAISE * d * up
        centre = (round(float(c[0])), round(float(c[1])))
        angle = float(np.degrees(np.arctan2(axis[1], axis[0])))
        half = 0.5 * float(np.linalg.norm(axis)) + NOSTRIL_REACH * d
        cv2.ellipse(ring, centre, (max(2, round(half + grown)),
                                   max(2, round(NOSTRIL_RADIUS * d + grown))), angle, 0, 360, 1, -1)
        cv2.ellipse(ellipses, centre, (max(1, round(half)), max(1, round(NOSTRIL_RADIUS * d))),
                    angle, 0, 360, 1, -1)
    ring &= 1 - ellipses
    if int(ring.sum()) < 8 or not ellipses.any():
        return out
    # Only the rings' box is read (the ellipses lie inside it).
    x, y, bw, bh = cv2.boundingRect(ring | ellipses)
    box = (slice(y, y + bh), slice(x, x + bw))
    luma = np.asarray(image[box], np.float32) @ LUMA
    skin = float(median(luma[ring[box] > 0]))
    if skin <= 0.0:
        return out
    lo, hi = DARK
    out[box] = np.clip((hi - luma / skin) / (hi - lo), 0.0, 1.0) * ellipses[box]
    return out


def soften(holes: np.ndarray, feather: float) -> np.ndarray:
    """An :func:`openings` mask (h, w) feathered by a sixth of ``feather`` pixels
    (its edge pixels taken whole), within a pixel of where it was."""
    if not holes.any():
        return holes
    near = cv2.dilate((holes > 0).astype(np.uint8), np.ones((3, 3), np.uint8)) > 0
    blurred = cv2.GaussianBlur(holes, (0, 0), max(0.5, feather / 6.0))
    out: np.ndarray = (np.clip(blurred * 1.5, 0.0, 1.0) * near).astype(np.float32)
    return out


def area(holes: np.ndarray, landmarks: np.ndarray) -> float:
    """An :func:`openings` mask's area in squared eye distances of ``landmarks``."""
    return float(holes.sum()) / max(1.0, eye_distance(np.asarray(landmarks, np.float64))) ** 2


def pose_share(target_lm: np.ndarray, source_lm: np.ndarray) -> float:
    """0..1: how far the target (landmarks (N, 3)) is seen from further below than
    the source, on :data:`PITCH_RAMP`."""
    below = head_pose(source_lm)[1] - head_pose(target_lm)[1]
    lo, hi = PITCH_RAMP
    return float(np.clip((below - lo) / (hi - lo), 0.0, 1.0))


def lacking(target_area: float, source_area: float) -> float:
    """0..1: the share of the target's openings (:func:`area`) the source lacks (all
    when it shows none, none when it shows as much)."""
    if target_area <= 0.0:
        return 0.0
    return float(np.clip(1.0 - source_area / target_area, 0.0, 1.0))
