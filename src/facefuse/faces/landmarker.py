"""MediaPipe's dense face mesh (468 points) plus iris refinement (→ 478 points).

Stages, as in MediaPipe's ``face_landmark`` and ``iris_landmark`` graphs:

1. **Face ROI** from a detection: the box centre, side ``1.5 × max(w, h)``
   (square), rotated so the detector's eye keypoints are level. The ROI is
   warped to 192×192 RGB in [0, 1] (edge pixels replicated outside the image).
2. **Mesh**: 468 × (x, y, z) in ROI pixels and a face-presence logit; points
   are mapped back to image pixels, z is scaled like x.
3. **Eye ROIs** from the mesh eye corners (33/133 and 362/263): side
   ``2.3 × corner distance``, rotated along the corner line, 64×64 RGB in
   [0, 1]; the image-right eye is mirrored so both look like an image-left eye.
4. **Iris**: 71 eye-region points and 5 iris points per eye. The 5 iris points
   of each eye are appended (468–472: image-left eye (33/133), 473–477:
   image-right eye (362/263); centre first), and the 16 eye-contour points of
   the mesh take the iris model's more precise x, y (MediaPipe's
   ``UpdateFaceLandmarksCalculator``).

Every warp is an affine ``M`` (2, 3) from image pixels to tensor pixels, in
continuous coordinates (pixel ``i`` spans ``[i, i+1)``); the model outputs are
mapped back with its inverse. ``roi``/``postprocess`` and
``eye_rois``/``refine`` are separate so a batcher can stack many faces into
one model run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np

from facefuse.errors import InvalidArgumentError
from facefuse.faces.types import Detection
from facefuse.imaging.checks import require_rgb
from facefuse.runtime.registry import LoadedModel

MESH_SIZE = 192
IRIS_SIZE = 64
MESH_POINTS = 468
ALL_POINTS = 478
#: Face ROI side as a multiple of the detection box's long side.
FACE_ROI_SCALE = 1.5
#: Eye ROI side as a multiple of the eye-corner distance (MediaPipe's 2.3).
EYE_ROI_SCALE = 2.3
#: Eye-corner mesh indices (start, end) of the image-left and image-right eye.
EYE_CORNERS: tuple[tuple[int, int], tuple[int, int]] = ((33, 133), (362, 263))
#: Mesh indices of the first 16 (eye-contour) points of the iris model's 71, per eye.
EYE_CONTOUR_INDICES: tuple[tuple[int, ...], tuple[int, ...]] = (
    (33, 7, 163, 144, 145, 153, 154, 155, 133, 246, 161, 160, 159, 158, 157, 173),
    (263, 249, 390, 373, 374, 380, 381, 382, 362, 466, 388, 387, 386, 385, 384, 398),
)
#: Without an iris model the iris radius is estimated as this × the eye-corner distance.
IRIS_RADIUS_PER_EYE_WIDTH = 0.22  # mean over the sample portraits (0.20–0.25)
#: Above this many image pixels per tensor pixel, ROIs are pre-shrunk with area
#: averaging before the bilinear warp, so large faces do not alias.
ANTIALIAS_ABOVE = 2.0


def rotated_square_roi(
    centre: np.ndarray, side: float, angle: float, size: int, *, flip: bool = False
) -> np.ndarray:
    """Affine (2, 3) float64 mapping image pixels → ROI tensor pixels.

    The ROI is a square of ``side`` image pixels centred at ``centre`` (2,),
    rotated by ``angle`` radians (clockwise on screen, y down), sampled into a
    ``size``×``size`` tensor; ``flip`` mirrors it horizontally.
    """
    c, s = math.cos(angle), math.sin(angle)
    k = size / side
    # tensor = k * R(-angle) @ (p - centre) + size / 2
    A = k * np.array([[c, s], [-s, c]])
    t = np.array([size / 2.0, size / 2.0]) - A @ np.asarray(centre, np.float64)
    M = np.concatenate([A, t[:, None]], axis=1)
    if flip:
        M = np.array([[-1.0, 0.0, size], [0.0, 1.0, 0.0]]) @ np.vstack([M, [0.0, 0.0, 1.0]])
    return M


def invert_affine(M: np.ndarray) -> np.ndarray:
    """Inverse of a (2, 3) affine."""
    return np.asarray(cv2.invertAffineTransform(np.asarray(M, np.float64)), np.float64)


def apply_affine(M: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply (2, 3) ``M`` to points (..., 2); float64."""
    pts = np.asarray(points, np.float64)
    out: np.ndarray = pts @ M[:, :2].T + M[:, 2]
    return out


def affine_scale(M: np.ndarray) -> float:
    """Mean linear scale of an affine (sqrt of |det|)."""
    return math.sqrt(abs(float(np.linalg.det(M[:, :2]))))


def warp_roi(image: np.ndarray, M: np.ndarray, size: int) -> np.ndarray:
    """Sample the ROI ``M`` (image → tensor, continuous coords) as (size, size, 3) uint8.

    Bilinear, edge pixels replicated outside the image. When the ROI is more
    than :data:`ANTIALIAS_ABOVE`× larger than the tensor, its bounding region
    is first shrunk with area averaging by the integer factor ``k = floor(f)``
    of the ROI's ``f`` image pixels per tensor pixel (OpenCV's exact k×k block
    path, ~10× faster than a fractional area resize), and the bilinear warp does
    the remaining ``f / k`` < 1.5.
    """
    h, w = image.shape[:2]
    src = image
    M = np.asarray(M, np.float64)
    factor = 1.0 / affine_scale(M)  # image pixels per tensor pixel
    if factor > ANTIALIAS_ABOVE:
        k = int(factor)
        corners = apply_affine(invert_affine(M), np.array([[0, 0], [size, 0], [size, size],
                                                           [0, size]], np.float64))
        # A margin of k + 2 pixels, and whole k×k blocks only: the < k pixels left
        # over at the right/bottom lie outside the ROI (or, at the image's own edge,
        # where the warp replicates the border anyway).
        x0 = max(0, math.floor(corners[:, 0].min()) - k - 2)
        y0 = max(0, math.floor(corners[:, 1].min()) - k - 2)
        x1 = min(w, math.ceil(corners[:, 0].max()) + k + 2)
        y1 = min(h, math.ceil(corners[:, 1].max()) + k + 2)
        cw, ch = (x1 - x0) // k * k, (y1 - y0) // k * k
        if cw >= 2 * k and ch >= 2 * k:
            src = cv2.resize(image[y0:y0 + ch, x0:x0 + cw], (cw // k, ch // k),
                             interpolation=cv2.INTER_AREA)
            # small = (p - (x0, y0)) / k  →  p = k · small + origin
            to_image = np.array([[k, 0.0, x0], [0.0, k, y0]], np.float64)
            M = M @ np.vstack([to_image, [0.0, 0.0, 1.0]])
    # cv2 uses pixel-centre (index) coordinates: p_i = p_c - 0.5 on both sides.
    Mi = M.copy()
    Mi[:, 2] += M[:, :2] @ np.array([0.5, 0.5]) - 0.5
    out = cv2.warpAffine(src, Mi, (size, size), flags=cv2.INTER_LINEAR,
                         borderMode=cv2.BORDER_REPLICATE)
    return np.asarray(out, np.uint8)


def to_unit_tensor(patch: np.ndarray) -> np.ndarray:
    """RGB uint8 (S, S, 3) → float32 (3, S, S) in [0, 1]."""
    return np.ascontiguousarray(patch.transpose(2, 0, 1), dtype=np.float32) / 255.0


def face_roi(detection: Detection) -> tuple[np.ndarray, float, float]:
    """MediaPipe's detection → face ROI: ``(centre (2,), side px, angle rad)``.

    Centre of the box, side 1.5 × its long side, angle that levels the line
    from keypoint 0 (image-left eye) to keypoint 1 (image-right eye).
    """
    b = np.asarray(detection.bbox, np.float64)
    centre = np.array([(b[0] + b[2]) / 2.0, (b[1] + b[3]) / 2.0])
    side = FACE_ROI_SCALE * max(b[2] - b[0], b[3] - b[1])
    kp = np.asarray(detection.keypoints, np.float64)
    angle = math.atan2(kp[1, 1] - kp[0, 1], kp[1, 0] - kp[0, 0])
    return centre, float(side), angle


def eye_roi(landmarks: np.ndarray, eye: int) -> tuple[np.ndarray, float, float]:
    """Eye ROI from mesh corners (``eye`` 0: image-left, 1: image-right).

    ``(centre (2,), side px, angle rad)``: the corners' bounding-box centre,
    2.3 × its long side, the angle of the start→end corner line.
    """
    a, b = (np.asarray(landmarks[i, :2], np.float64) for i in EYE_CORNERS[eye])
    centre = (np.minimum(a, b) + np.maximum(a, b)) / 2.0
    side = EYE_ROI_SCALE * float(np.max(np.abs(b - a)))
    angle = math.atan2(b[1] - a[1], b[0] - a[0])
    return centre, side, angle


def sigmoid(x: float) -> float:
    x = min(max(x, -80.0), 80.0)
    return 1.0 / (1.0 + math.exp(-x))


def project(raw: np.ndarray, M: np.ndarray) -> np.ndarray:
    """Model points (K·3,) or (K, 3) in tensor pixels → (K, 3) float64 image pixels.

    x, y go through the inverse of ``M``; z is divided by ``M``'s scale (so it
    is in image pixels like x).
    """
    pts = np.asarray(raw, np.float64).reshape(-1, 3)
    out = np.empty_like(pts)
    out[:, :2] = apply_affine(invert_affine(M), pts[:, :2])
    out[:, 2] = pts[:, 2] / affine_scale(M)
    return out


class FaceMesh:
    """Dense face mesh with optional iris refinement.

    Args:
        mesh: the ``facemesh`` model (input ``[N, 3, 192, 192]`` in [0, 1];
            outputs ``landmarks`` ``[N, 1404]``, ``presence`` ``[N, 1]`` logit).
        iris: the ``iris`` model (input ``[N, 3, 64, 64]`` in [0, 1]; outputs
            ``contours`` ``[N, 213]``, ``iris`` ``[N, 15]``), or None: the 10 iris
            points are then estimated from the eye contour.
        refine_eyes: replace the 16 eye-contour points per eye by the iris
            model's (x, y) (only with an iris model).
    """

    def __init__(
        self, mesh: LoadedModel, iris: LoadedModel | None = None, *, refine_eyes: bool = True
    ) -> None:
        self.mesh = mesh
        self.iris = iris
        self.refine_eyes = refine_eyes

    # -- face mesh ---------------------------------------------------------------------

    def roi(self, image: np.ndarray, detection: Detection) -> tuple[np.ndarray, np.ndarray]:
        """The mesh input for one face.

        Args:
            image: RGB uint8 (H, W, 3).
            detection: a detector result in pixels of ``image``.

        Returns:
            tensor (3, 192, 192) float32 in [0, 1], and M (2, 3) float64 image → ROI pixels.
        """
        require_rgb(image)
        centre, side, angle = face_roi(detection)
        if not side > 0:
            raise InvalidArgumentError("detection box is empty")
        M = rotated_square_roi(centre, side, angle, MESH_SIZE)
        return to_unit_tensor(warp_roi(image, M, MESH_SIZE)), M

    def run_mesh(self, tensors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, 3, 192, 192) → landmarks (N, 1404), presence logits (N, 1)."""
        raw, flag = self.mesh.run(np.ascontiguousarray(tensors, dtype=np.float32))[:2]
        return raw.reshape(len(tensors), -1), flag.reshape(len(tensors), -1)

    @staticmethod
    def postprocess(raw: np.ndarray, M: np.ndarray) -> np.ndarray:
        """Mesh output (1404,) for the ROI ``M`` → (468, 3) float32 image pixels."""
        return project(raw, M).astype(np.float32)

    @staticmethod
    def presence(flag: np.ndarray | float) -> float:
        """Face-presence probability from the mesh's logit."""
        return sigmoid(float(np.reshape(flag, -1)[0]))

    # -- iris --------------------------------------------------------------------------

    @staticmethod
    def eye_rois(image: np.ndarray, mesh: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """The two iris inputs for one face: image-left eye, then image-right eye (mirrored).

        Args:
            image: RGB uint8 (H, W, 3).
            mesh: (468+, 3) landmarks in image pixels.

        Returns:
            two ``(tensor (3, 64, 64) float32 in [0, 1], M (2, 3) image → tensor)``;
            the second M includes the horizontal mirror.
        """
        out: list[tuple[np.ndarray, np.ndarray]] = []
        for eye in (0, 1):
            centre, side, angle = eye_roi(mesh, eye)
            side = max(side, 1.0)
            M = rotated_square_roi(centre, side, angle, IRIS_SIZE, flip=eye == 1)
            out.append((to_unit_tensor(warp_roi(image, M, IRIS_SIZE)), M))
        return out

    def run_iris(self, tensors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, 3, 64, 64) → contours (N, 213), iris (N, 15)."""
        if self.iris is None:
            raise InvalidArgumentError("no iris model loaded")
        contours, iris = self.iris.run(np.ascontiguousarray(tensors, dtype=np.float32))[:2]
        return contours.reshape(len(tensors), -1), iris.reshape(len(tensors), -1)

    def refine(
        self,
        mesh: np.ndarray,
        contours: np.ndarray,
        iris: np.ndarray,
        transforms: Sequence[np.ndarray],
    ) -> np.ndarray:
        """Append the iris points and refine the eye contours.

        Args:
            mesh: (468, 3) image pixels.
            contours: (2, 213) iris-model eye-region output per eye (image-left, image-right).
            iris: (2, 15) iris-model iris output per eye.
            transforms: the two eye-ROI affines from :meth:`eye_rois`.

        Returns:
            (478, 3) float32 image pixels. Iris z is shifted so that the eye
            contour's mean z matches the mesh.
        """
        out = np.zeros((ALL_POINTS, 3), np.float64)
        out[:MESH_POINTS] = mesh[:MESH_POINTS]
        for eye in (0, 1):
            M = transforms[eye]
            eye_pts = project(contours[eye], M)[:16]
            iris_pts = project(iris[eye], M)
            idx = list(EYE_CONTOUR_INDICES[eye])
            z_shift = float(mesh[idx, 2].mean() - eye_pts[:, 2].mean())
            iris_pts[:, 2] += z_shift
            out[MESH_POINTS + 5 * eye : MESH_POINTS + 5 * eye + 5] = iris_pts
            if self.refine_eyes:
                out[idx, :2] = eye_pts[:, :2]
        return out.astype(np.float32)

    @staticmethod
    def estimate_iris(mesh: np.ndarray) -> np.ndarray:
        """(478, 3) float32: the mesh plus iris points guessed from the eye contours.

        The centre is the eye contour's mean, the four rim points lie at
        :data:`IRIS_RADIUS_PER_EYE_WIDTH` × eye width along and across the eye,
        in the iris model's order: centre, nasal side, top, temporal side, bottom.
        """
        out = np.zeros((ALL_POINTS, 3), np.float64)
        out[:MESH_POINTS] = mesh[:MESH_POINTS]
        for eye in (0, 1):
            idx = list(EYE_CONTOUR_INDICES[eye])
            centre = mesh[idx].mean(axis=0).astype(np.float64)
            a, b = (np.asarray(mesh[i, :2], np.float64) for i in EYE_CORNERS[eye])
            width = float(np.linalg.norm(b - a))  # both corner pairs run image-left → right
            u = (b - a) / width if width > 0 else np.array([1.0, 0.0])
            v = np.array([-u[1], u[0]])  # u turned 90° clockwise on screen: "down"
            r = IRIS_RADIUS_PER_EYE_WIDTH * width
            base = MESH_POINTS + 5 * eye
            out[base] = centre
            nasal = u if eye == 0 else -u
            for j, d in enumerate((nasal, -v, -nasal, v)):
                out[base + 1 + j, :2] = centre[:2] + r * d
                out[base + 1 + j, 2] = centre[2]
        return out.astype(np.float32)

    # -- one-call API ------------------------------------------------------------------

    def landmarks(self, image: np.ndarray, detection: Detection) -> tuple[np.ndarray, float]:
        """Dense landmarks of one face: ((478, 3) float32 image pixels, presence in [0, 1])."""
        return self.landmarks_many(image, [detection])[0]

    def landmarks_many(
        self, image: np.ndarray, detections: Sequence[Detection]
    ) -> list[tuple[np.ndarray, float]]:
        """:meth:`landmarks` for several faces of one image, batching the model runs."""
        if not detections:
            return []
        rois = [self.roi(image, d) for d in detections]
        raw, flags = self.run_mesh(np.stack([t for t, _ in rois]))
        meshes = [self.postprocess(r, M) for r, (_, M) in zip(raw, rois, strict=True)]
        presences = [self.presence(f) for f in flags]
        if self.iris is None:
            return [(self.estimate_iris(m), p) for m, p in zip(meshes, presences, strict=True)]
        eyes = [self.eye_rois(image, m) for m in meshes]
        tensors = np.stack([t for pair in eyes for t, _ in pair])
        contours, iris = self.run_iris(tensors)
        out: list[tuple[np.ndarray, float]] = []
        for i, (m, p) in enumerate(zip(meshes, presences, strict=True)):
            Ms = [M for _, M in eyes[i]]
            full = self.refine(m, contours[2 * i : 2 * i + 2], iris[2 * i : 2 * i + 2], Ms)
            out.append((full, p))
        return out
