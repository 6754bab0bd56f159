"""Alignment, crop, tensor conversion and paste-back of a swap model's face crop:
pure functions (numpy in, numpy out)."""

from __future__ import annotations

import math

import cv2
import numpy as np

from facefuse.errors import InvalidArgumentError
from facefuse.faces.align import (
    dlib_chip_transform,
    invert_affine,
    similarity_transform,
    transform_points,
)
from facefuse.faces.recognizer import normalize
from facefuse.fusion import mask as masks
from facefuse.fusion.swappers.onnx.contract import ARCFACE_TEMPLATES, DLIB_TEMPLATE, OUTPUT_RANGES

#: Mesh points for the ArcFace order: image-left iris centre, image-right iris centre,
#: nose tip, image-left mouth corner, image-right mouth corner. The refined mesh
#: appends the image-left eye's iris first (468–472), then the image-right one.
MESH_ARCFACE_POINTS: tuple[int, int, int, int, int] = (468, 473, 1, 61, 291)
#: Mesh points to fall back on for the eye centres when there is no iris (468 points):
#: the midpoints of the eye corners (image-left 33/133, image-right 263/362).
_EYE_CORNERS = ((33, 133), (263, 362))




def template_points(template: str, size: int) -> np.ndarray:
    """The ArcFace ``template`` in an ``size``-px chip: (5, 2) float64 pixels."""
    if template not in ARCFACE_TEMPLATES:
        raise InvalidArgumentError(f"not an ArcFace template: {template!r}")
    points, native = ARCFACE_TEMPLATES[template]
    return points * (float(size) / native)


def arcface_points(landmarks: np.ndarray) -> np.ndarray:
    """The five ArcFace points of a face from its mesh, (5, 2) float64 pixels.

    Image-left eye centre, image-right eye centre, nose tip (1), image-left mouth
    corner (61), image-right mouth corner (291). Eye centres are the iris centres
    468/473 of a 478-point mesh, the eye-corner midpoints of a 468-point one.
    """
    lm = np.asarray(landmarks, np.float64)
    if lm.ndim != 2 or lm.shape[0] < 468 or lm.shape[1] < 2:
        raise InvalidArgumentError(f"expected (468|478, 2|3) mesh landmarks, got {lm.shape}")
    if lm.shape[0] >= 478:
        return lm[list(MESH_ARCFACE_POINTS), :2].copy()
    eyes = [lm[list(pair), :2].mean(axis=0) for pair in _EYE_CORNERS]
    return np.vstack([*eyes, lm[[1, 61, 291], :2]])


def align_transform(
    landmarks: np.ndarray, template: str, size: int, padding: float = 0.25
) -> np.ndarray:
    """Image → crop affine (2, 3) float64 for a ``size``-px crop of the face.

    ArcFace templates: least-squares similarity (Umeyama) of :func:`arcface_points`
    onto :func:`template_points`. ``dlib_150``: dlib's chip geometry from the mesh
    (:func:`~facefuse.faces.align.dlib_chip_transform`) at ``size`` and ``padding``.
    """
    if template == DLIB_TEMPLATE:
        return dlib_chip_transform(landmarks, size=size, padding=padding)
    return similarity_transform(arcface_points(landmarks), template_points(template, size))


def crop_face(image: np.ndarray, M: np.ndarray, size: int) -> np.ndarray:
    """Cut a ``size``×``size`` crop with the image → crop affine ``M``.

    Reads only the crop's preimage in ``image`` (plus a small margin); when the
    crop is smaller than the face it is low-pass filtered first (Gaussian,
    sigma = (1/scale − 1)/2) so it does not alias. Beyond the image border the
    edge pixels are repeated. Returns (size, size, C) float32, 0..255.
    """
    img = np.asarray(image)
    h, w = img.shape[:2]
    A = np.asarray(M, np.float64)
    scale = math.sqrt(abs(float(np.linalg.det(A[:, :2]))))
    sigma = max(0.0, (1.0 / scale - 1.0) / 2.0) if scale > 0 else 0.0
    corners = transform_points(invert_affine(A), np.array(
        [[0.0, 0.0], [size - 1.0, 0.0], [0.0, size - 1.0], [size - 1.0, size - 1.0]]))
    margin = 3.0 * sigma + 2.0
    x0 = int(np.clip(np.floor(corners[:, 0].min() - margin), 0, w - 1))
    y0 = int(np.clip(np.floor(corners[:, 1].min() - margin), 0, h - 1))
    x1 = int(np.clip(np.ceil(corners[:, 0].max() + margin) + 1, x0 + 1, w))
    y1 = int(np.clip(np.ceil(corners[:, 1].max() + margin) + 1, y0 + 1, h))
    sub: np.ndarray = img[y0:y1, x0:x1].astype(np.float32)
    local = A.copy()
    local[:, 2] += A[:, :2] @ np.array([x0, y0], np.float64)
    if scale < 0.5:
        # Area-average down to twice the crop's resolution first (cheap on big faces);
        # a resized pixel centre x' sits at image pixel (x' + 0.5) / f - 0.5.
        f = 2.0 * scale
        sw, sh = max(1, round(sub.shape[1] * f)), max(1, round(sub.shape[0] * f))
        fx, fy = sw / sub.shape[1], sh / sub.shape[0]
        sub = cv2.resize(sub, (sw, sh), interpolation=cv2.INTER_AREA)
        to_sub = np.array([[1.0 / fx, 0.0, 0.5 / fx - 0.5], [0.0, 1.0 / fy, 0.5 / fy - 0.5]])
        local = local[:, :2] @ to_sub + np.hstack([np.zeros((2, 2)), local[:, 2:]])
        sigma = max(0.0, (1.0 / (scale / min(fx, fy)) - 1.0) / 2.0)
    if sigma > 0.3:
        sub = cv2.GaussianBlur(sub, (0, 0), sigmaX=sigma, sigmaY=sigma,
                               borderType=cv2.BORDER_REPLICATE)
    out: np.ndarray = cv2.warpAffine(sub, local, (size, size), flags=cv2.INTER_LINEAR,
                                     borderMode=cv2.BORDER_REPLICATE)
    return out.reshape(size, size, -1).astype(np.float32, copy=False)


def to_tensor(crop: np.ndarray, mean: np.ndarray, std: np.ndarray, bgr: bool) -> np.ndarray:
    """(S, S, 3) RGB 0..255 → (1, 3, S, S) float32 ``(pixel - mean) / std`` in model order."""
    c = np.asarray(crop, np.float32)
    if bgr:
        c = c[..., ::-1]
    x = (c - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None], dtype=np.float32)


def from_tensor(output: np.ndarray, output_range: str, bgr: bool) -> np.ndarray:
    """(1, 3, S, S) or (3, S, S) model output → (S, S, 3) float32 RGB pixels, clipped to 0..255."""
    offset, scale = OUTPUT_RANGES[output_range]
    o = np.asarray(output, np.float32)
    if o.ndim == 4:
        o = o[0]
    img = (o.transpose(1, 2, 0) + offset) * scale
    if bgr:
        img = img[..., ::-1]
    out: np.ndarray = np.clip(img, 0.0, 255.0).astype(np.float32)
    return out


def paste_back(
    crop: np.ndarray, M: np.ndarray, region: masks.Region, feather: float
) -> tuple[np.ndarray, np.ndarray]:
    """Warp a crop back into ``region`` of the image by the inverse of ``M``.

    Args:
        crop: (S, S, 3) float32 pixels.
        M: (2, 3) image → crop affine the crop was cut with.
        region: ``(x0, y0, x1, y1)`` image pixels.
        feather: width (pixels) of the ramp inside the crop's edge.

    Returns:
        ``(face, valid)``: (h, w, 3) float32 pixels over the region and (h, w)
        float32 crop-validity in [0, 1] — 0 where the region is not covered by
        the crop, rising smoothly to 1 over ``feather`` pixels inside its edge.
    """
    x0, y0, x1, y1 = region
    size = crop.shape[0]
    local = np.asarray(M, np.float64).copy()  # region pixel → crop pixel
    local[:, 2] += local[:, :2] @ np.array([x0, y0], np.float64)
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    face = cv2.warpAffine(np.asarray(crop, np.float32), local, (x1 - x0, y1 - y0), flags=flags,
                          borderMode=cv2.BORDER_REPLICATE)
    cover = cv2.warpAffine(np.ones((size, size), np.float32), local, (x1 - x0, y1 - y0),
                           flags=flags, borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
    inside = (cover > 0.999).astype(np.uint8)
    dist = cv2.distanceTransform(inside, cv2.DIST_L2, 5)
    ramp = np.clip(dist / max(float(feather), 1.0), 0.0, 1.0)
    valid = (ramp * ramp * (3.0 - 2.0 * ramp)).astype(np.float32)  # smoothstep
    return face.reshape(y1 - y0, x1 - x0, -1).astype(np.float32, copy=False), valid


def project_latent(vector: np.ndarray, projection: np.ndarray | None) -> np.ndarray:
    """The source latent: ``vector`` (D_in,) as is, or ``v @ P / |v @ P|`` with P (D_in, D).

    Returns (D,) float32.
    """
    v = np.asarray(vector, np.float64).reshape(-1)
    if projection is None:
        return v.astype(np.float32)
    return normalize((v @ np.asarray(projection, np.float64)).astype(np.float32))
