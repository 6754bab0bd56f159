"""Mesh geometry for fusion: rigid alignment, fused shape, head pose, openness.

All landmark arrays are (N, 3) float in image pixels (x right, y down, z depth
in the same scale, as the face mesh returns them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from facefuse.faces import topology as topo
from facefuse.faces.align import similarity_transform


@dataclass(frozen=True)
class Similarity3D:
    """``x ↦ scale · R @ x + t`` for row vectors: ``apply(P) = scale * P @ R.T + t``."""

    scale: float
    R: np.ndarray  # (3, 3)
    t: np.ndarray  # (3,)

    def apply(self, points: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.scale * points @ self.R.T + self.t
        return out


def fit_similarity_3d(src: np.ndarray, dst: np.ndarray) -> Similarity3D:
    """Least-squares similarity (Umeyama 1991) taking ``src`` (N, 3) onto ``dst`` (N, 3)."""
    src = np.asarray(src, np.float64)
    dst = np.asarray(dst, np.float64)
    mu_s, mu_d = src.mean(0), dst.mean(0)
    a, b = src - mu_s, dst - mu_d
    cov = b.T @ a / len(src)
    U, S, Vt = np.linalg.svd(cov)
    D = np.eye(3)
    if np.linalg.det(U) * np.linalg.det(Vt) < 0:
        D[2, 2] = -1.0
    R = U @ D @ Vt
    var_s = (a**2).sum() / len(src)
    scale = float(np.trace(np.diag(S) @ D) / var_s) if var_s > 0 else 1.0
    t = mu_d - scale * R @ mu_s
    return Similarity3D(scale, R, t)


def euler_angles(R: np.ndarray) -> tuple[float, float, float]:
    """(yaw, pitch, roll) in degrees of a rotation matrix in image axes
    (x right, y down, z away from the camera)."""
    sy = math.hypot(R[0, 0], R[1, 0])
    if sy > 1e-6:
        pitch = math.atan2(R[2, 1], R[2, 2])
        yaw = math.atan2(-R[2, 0], sy)
        roll = math.atan2(R[1, 0], R[0, 0])
    else:  # gimbal lock: yaw ±90°
        pitch = math.atan2(-R[1, 2], R[1, 1])
        yaw = math.atan2(-R[2, 0], sy)
        roll = 0.0
    return math.degrees(yaw), math.degrees(pitch), math.degrees(roll)


def relative_pose(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    """(yaw, pitch, roll) in degrees of the rotation taking mesh ``a`` to mesh ``b``,
    fitted on the expression-stable points."""
    idx = list(topo.STABLE_POINTS)
    sim = fit_similarity_3d(a[idx], b[idx])
    return euler_angles(sim.R)


def head_pose(landmarks: np.ndarray) -> tuple[float, float, float]:
    """Approximate absolute (yaw, pitch, roll) in degrees from the mesh alone.

    Roll from the eye line; yaw from the depth difference of the two face edges and
    pitch from that of forehead and chin, both measured in the face's own frame (the
    image plane turned by ``-roll``), so a face upside down or on its side in the
    photo has the yaw and pitch it would have upright. 0 is frontal.
    """
    lm = np.asarray(landmarks, np.float64)
    eye_l, eye_r = lm[topo.EYE_OUTER[0]], lm[topo.EYE_OUTER[1]]
    roll_rad = math.atan2(eye_r[1] - eye_l[1], eye_r[0] - eye_l[0])
    c, s = math.cos(roll_rad), math.sin(roll_rad)

    def upright(p: np.ndarray) -> tuple[float, float, float]:
        return c * p[0] + s * p[1], -s * p[0] + c * p[1], float(p[2])

    left, right = upright(lm[topo.FACE_EDGE_IMAGE_LEFT]), upright(lm[topo.FACE_EDGE_IMAGE_RIGHT])
    top, bottom = upright(lm[topo.FOREHEAD]), upright(lm[topo.CHIN])
    yaw = math.degrees(math.atan2(right[2] - left[2], right[0] - left[0]))
    pitch = math.degrees(math.atan2(bottom[2] - top[2], bottom[1] - top[1]))
    return yaw, pitch, math.degrees(roll_rad)


def _ratio(lm: np.ndarray, a: tuple[int, int], b: tuple[int, int]) -> float:
    num = float(np.linalg.norm(lm[a[0], :2] - lm[a[1], :2]))
    den = float(np.linalg.norm(lm[b[0], :2] - lm[b[1], :2]))
    return num / den if den > 0 else 0.0


def openness(landmarks: np.ndarray) -> dict[str, float]:
    """Expression ratios (dimensionless): mouth = inner-lip gap / mouth width;
    eyes = lid gap / eye width for each eye."""
    lm = np.asarray(landmarks, np.float64)
    return {
        "mouth": _ratio(lm, topo.INNER_LIP_MID, topo.MOUTH_CORNERS),
        "eye_image_left": _ratio(lm, topo.EYE_LID_IMAGE_LEFT, (33, 133)),
        "eye_image_right": _ratio(lm, topo.EYE_LID_IMAGE_RIGHT, (263, 362)),
    }


def eye_distance(landmarks: np.ndarray) -> float:
    """Distance between the outer eye corners, in pixels."""
    a, b = topo.EYE_OUTER
    return float(np.linalg.norm(landmarks[a, :2] - landmarks[b, :2]))


def eye_groups(lm: np.ndarray) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """((image-left eye contour, its iris), (image-right eye contour, its iris));
    the iris order is checked against the eye centres rather than assumed. The
    irises are empty tuples for meshes without iris points (fewer than 478)."""
    if len(lm) < 478:
        return (topo.EYE_IMAGE_LEFT, ()), (topo.EYE_IMAGE_RIGHT, ())
    centre_a = lm[list(topo.IRIS_A), :2].mean(0)
    d_left = np.linalg.norm(centre_a - lm[list(topo.EYE_IMAGE_LEFT), :2].mean(0))
    d_right = np.linalg.norm(centre_a - lm[list(topo.EYE_IMAGE_RIGHT), :2].mean(0))
    if d_left <= d_right:
        return (topo.EYE_IMAGE_LEFT, topo.IRIS_A), (topo.EYE_IMAGE_RIGHT, topo.IRIS_B)
    return (topo.EYE_IMAGE_LEFT, topo.IRIS_B), (topo.EYE_IMAGE_RIGHT, topo.IRIS_A)


def expression_regions(landmarks: np.ndarray) -> list[tuple[tuple[int, ...], tuple[int, int]]]:
    """Regions whose internal shape is expression (kept from the target) while
    their place and size are identity (taken from the source), each with the
    two expression-stable anchor points (corners) that define that place."""
    (eye_l, iris_l), (eye_r, iris_r) = eye_groups(landmarks)
    left, right = eye_l + iris_l, eye_r + iris_r
    return [
        (left, (33, 133)),
        (right, (263, 362)),
        (topo.LIPS_OUTER + points_inside(landmarks, topo.LIPS_OUTER), topo.MOUTH_CORNERS),
    ]


def points_inside(landmarks: np.ndarray, contour: tuple[int, ...]) -> tuple[int, ...]:
    """Mesh indices (of the 468 face points) strictly inside the polygon ``contour``:
    the lips have middle rings between the outer and inner contours, and they
    must move with the region or the mesh folds. (Even-odd ray casting, vectorised.)"""
    n = min(len(landmarks), 468)
    poly = landmarks[list(contour), :2].astype(np.float64)
    a, b = poly, np.roll(poly, -1, axis=0)
    x = landmarks[:n, 0:1].astype(np.float64)
    y = landmarks[:n, 1:2].astype(np.float64)
    crosses = (a[None, :, 1] > y) != (b[None, :, 1] > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_at = a[None, :, 0] + (y - a[None, :, 1]) * (b[None, :, 0] - a[None, :, 0]) / (
            b[None, :, 1] - a[None, :, 1])
    inside = np.count_nonzero(crosses & (x < x_at), axis=1) % 2 == 1
    inside[list(contour)] = False
    return tuple(int(i) for i in np.flatnonzero(inside))


def align_to(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The source mesh brought into the target's pose, position and scale
    (3-D similarity fitted on the stable points), (N, 3)."""
    n = min(len(source), len(target))
    idx = list(topo.STABLE_POINTS)
    sim = fit_similarity_3d(source[idx], target[idx])
    return sim.apply(np.asarray(source[:n], np.float64))


#: Width of the halo around an expression region, as a fraction of its corner span.
REGION_HALO = 0.35


def align_lower_face(aligned: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Re-fit the lower face of an aligned source mesh to the target's jaw.

    How far the jaw drops is expression, not identity: an affine map fitted on
    the mouth corners and the jaw line takes the (already pose-aligned) source's
    lower face onto the target's, so an open target mouth is not pulled shut by a
    closed source. The fit blends in from the nose base down to the upper lip.
    Returns (N, 3).
    """
    idx = list(topo.LOWER_FACE_ANCHORS)
    src2 = np.c_[aligned[idx, :2], np.ones(len(idx))]
    A, *_ = np.linalg.lstsq(src2, target[idx, :2], rcond=None)  # (3, 2)
    lower = aligned.copy()
    lower[:, :2] = np.c_[aligned[:, :2], np.ones(len(aligned))] @ A
    up = target[topo.FOREHEAD, :2] - target[topo.CHIN, :2]
    up = up / max(1e-6, float(np.linalg.norm(up)))
    h = target[: len(aligned), :2] @ up
    top, bottom = float(target[topo.NOSE_BASE, :2] @ up), float(target[0, :2] @ up)
    w = np.clip((top - h) / max(1e-6, top - bottom), 0.0, 1.0)[:, None]
    out: np.ndarray = (1.0 - w) * aligned + w * lower
    return out


def nearest_distance(points: np.ndarray, others: np.ndarray) -> np.ndarray:
    """(N,) distance from each of ``points`` (N, 2) to the nearest of ``others``
    (K, 2), in their units: ``|p|² + min(|o|² − 2 p·o)`` through one small matrix
    product (four times the speed of the per-axis differences on the mesh's 468
    points; float64, within 1e-10 px of them at image coordinates)."""
    p = np.asarray(points[:, :2], np.float64)
    o = np.asarray(others[:, :2], np.float64)
    d = p @ (-2.0 * o.T)
    d += (o * o).sum(1)
    m = d.min(axis=1)
    m += (p * p).sum(1)
    out: np.ndarray = np.sqrt(np.maximum(m, 0.0))
    return out


def fused_shape(
    source: np.ndarray, target: np.ndarray, weight: float, *, outline: float = 0.0
) -> np.ndarray:
    """The target mesh moved toward the source's shape by ``weight`` in [0, 1].

    Head pose comes from the target (the source is aligned to it first).
    Eyes+irises and lips move rigidly (similarity per region) so their
    openness — the target's expression — is preserved exactly; every other
    point moves linearly toward the aligned source point. Face-oval points move
    only by ``outline`` × ``weight``, so the target's jaw line and hairline stay
    where the blend mask expects them. Returns (N, 3).
    """
    tgt = np.asarray(target, np.float64)
    if weight <= 0.0:
        return tgt.copy()
    src = align_lower_face(align_to(source, tgt), tgt)
    n = len(src)
    per_point = np.full((n, 1), weight)
    per_point[list(topo.FACE_OVAL)] = weight * outline
    out = tgt[:n] + per_point * (src - tgt[:n])
    for region, anchors in expression_regions(tgt):
        idx = [i for i in region if i < n]
        full = similarity_transform(tgt[list(anchors), :2], src[list(anchors), :2])
        if anchors == topo.MOUTH_CORNERS:
            # The mouth keeps the target's size too: an open smile shrunk to a closed
            # source mouth's width reads as a different expression. Rotation and
            # position still come from the fit.
            lin = full[:, :2]
            scale = float(np.sqrt(abs(np.linalg.det(lin))))
            centre = tgt[list(anchors), :2].mean(0)
            full = np.c_[lin / scale, full[:, :2] @ centre + full[:, 2] - (lin / scale) @ centre]
        # Interpolate the region's similarity between identity and the full fit.
        M = (1.0 - weight) * np.array([[1.0, 0, 0], [0, 1.0, 0]]) + weight * full
        rigid = tgt[:n, :2] @ M[:, :2].T + M[:, 2]
        # Inside the region: rigid. Around it, a halo fading to the free motion, so
        # skin next to the lips or lids cannot cross their contour and fold the mesh.
        span = float(np.linalg.norm(tgt[anchors[0], :2] - tgt[anchors[1], :2]))
        dist = nearest_distance(tgt[:n, :2], tgt[idx, :2])
        w = np.clip(1.0 - dist / max(1e-6, REGION_HALO * span), 0.0, 1.0)
        w[idx] = 1.0
        w[list(topo.FACE_OVAL)] = 0.0
        out[:, :2] = w[:, None] * rigid + (1.0 - w[:, None]) * out[:, :2]
    return out
