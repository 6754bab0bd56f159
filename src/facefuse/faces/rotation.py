"""Quarter-turn rotations for detecting faces that are not upright.

Detectors are trained on upright faces. When an image yields no face, the
analysis tries it again turned by 90°, 180° and 270° (as other face-swap
tools do) and maps what it finds back into the original image's pixels.

``quarter_turns`` ``k`` means ``np.rot90(image, k)``: the image turned ``k`` ×
90° counter-clockwise. Coordinates are continuous pixels (pixel ``i`` spans
``[i, i+1)``), so the map back is exact: for an original image ``W`` × ``H``,
a point ``(x', y')`` of the turned image is

* ``k = 1``: ``(W - y', x')``
* ``k = 2``: ``(W - x', H - y')``
* ``k = 3``: ``(y', H - x')``
"""

from __future__ import annotations

import numpy as np

from facefuse.faces.types import Detection

#: The order in which orientations are tried: upright, then the image turned
#: 90° clockwise, 90° counter-clockwise and upside down (most photos that come
#: out sideways are off by one quarter turn).
RETRY_TURNS: tuple[int, ...] = (0, 3, 1, 2)


def rotate_image(image: np.ndarray, quarter_turns: int) -> np.ndarray:
    """``image`` (H, W, C) turned ``quarter_turns`` × 90° counter-clockwise (contiguous)."""
    k = quarter_turns % 4
    return image if k == 0 else np.ascontiguousarray(np.rot90(image, k))


def turned_size(width: int, height: int, quarter_turns: int) -> tuple[int, int]:
    """The (width, height) of a ``width`` × ``height`` image turned ``quarter_turns``."""
    return (height, width) if quarter_turns % 2 else (width, height)


def unrotate_points(points: np.ndarray, quarter_turns: int, width: int, height: int) -> np.ndarray:
    """Points (..., 2) of the turned image → the original ``width`` × ``height`` image."""
    p = np.asarray(points, dtype=np.float64)
    x, y = p[..., 0], p[..., 1]
    k = quarter_turns % 4
    if k == 0:
        return p.copy()
    if k == 1:
        out = (width - y, x)
    elif k == 2:
        out = (width - x, height - y)
    else:
        out = (y, height - x)
    return np.stack(out, axis=-1)


def unrotate_detection(det: Detection, quarter_turns: int, width: int, height: int) -> Detection:
    """A detection in the turned image → the same face in the original image.

    The box becomes the bounds of its turned corners; keypoints keep their
    order (so the eye line, and with it the mesh ROI's angle, turns too).
    """
    if quarter_turns % 4 == 0:
        return det
    x0, y0, x1, y1 = (float(v) for v in det.bbox)
    corners = unrotate_points(np.array([[x0, y0], [x1, y1]]), quarter_turns, width, height)
    lo, hi = corners.min(axis=0), corners.max(axis=0)
    return Detection(
        bbox=np.array([lo[0], lo[1], hi[0], hi[1]], dtype=np.float32),
        score=det.score,
        keypoints=unrotate_points(det.keypoints, quarter_turns, width, height).astype(np.float32),
    )


#: A mesh whose face-presence score is below this was probably fitted to a face
#: the detector saw the wrong way up; the mesh is then tried in the other three
#: quarter turns of its ROI and the turn with the best presence is kept. On the
#: sample photos a correctly oriented mesh scores ≥ 0.99 and a wrongly turned one
#: ≤ 0.4 (YuNet reports faces upside down as upright ones with score ~0.85).
REORIENT_BELOW = 0.5
#: The quarter turns of the ROI tried then, in order (upside down first).
REORIENT_TURNS: tuple[int, ...] = (2, 1, 3)


def turned_detection(det: Detection, quarter_turns: int) -> Detection:
    """The same detection with its keypoints turned ``quarter_turns`` × 90° about the
    box centre, so the mesh ROI (levelled on the eye keypoints) turns with them."""
    b = np.asarray(det.bbox, np.float64)
    centre = np.array([(b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0])
    angle = np.pi / 2.0 * (quarter_turns % 4)
    c, s = np.cos(angle), np.sin(angle)
    rel = np.asarray(det.keypoints, np.float64) - centre
    turned = np.stack([c * rel[:, 0] - s * rel[:, 1], s * rel[:, 0] + c * rel[:, 1]], axis=1)
    return Detection(bbox=det.bbox, score=det.score,
                     keypoints=(turned + centre).astype(np.float32))
