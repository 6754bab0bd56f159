"""YuNet: our ONNX conversion against libfacedetection itself, and the detector built on it."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from yunet_ref import LibFaceDetection

from facefuse.config import Settings
from facefuse.errors import BuildError, InvalidArgumentError
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.detector_base import Letterbox
from facefuse.faces.yunet import YuNetDetector, decode_yunet, greedy_nms
from facefuse.imaging.decode import decode_image
from facefuse.runtime.registry import ModelRegistry
from facefuse.toolchain.build.yunet import read_yunet
from facefuse.toolchain.detection_sets import (
    SAMPLE_FACES,
    detection_cases,
    fetch_face_free,
    group_photo,
    match,
)
from facefuse.toolchain.sources import YUFACE, materialise


@pytest.fixture(scope="module")
def library(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> LibFaceDetection:
    if sys.platform != "linux" or platform.machine() != "x86_64":
        pytest.skip("the reference library is an x86-64 Linux build")
    return LibFaceDetection(settings.downloads_dir, tmp_path_factory.mktemp("yuface"))


@pytest.fixture(scope="module")
def yunet(registry: ModelRegistry) -> YuNetDetector:
    return YuNetDetector(registry.get("yunet"), score_threshold=0.8)


@pytest.fixture(scope="module")
def face_free(settings: Settings) -> dict[str, np.ndarray]:
    paths = fetch_face_free(settings.home / "face-free", settings.downloads_dir)
    return {name: decode_image(p) for name, p in paths.items()}


def _fit(rgb: np.ndarray, side: int = 640) -> np.ndarray:
    s = min(1.0, side / max(rgb.shape[:2]))
    if s == 1.0:
        return rgb
    return cv2.resize(rgb, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)


def _ours_native(det: YuNetDetector, rgb: np.ndarray, threshold: float) -> np.ndarray:
    """Our model at the image's own size, zero-padded to multiples of 32 like the library;
    rows ``score, x0, y0, x1, y1, 10 landmarks`` (floats)."""
    h, w = rgb.shape[:2]
    H, W = -(-h // 32) * 32, -(-w // 32) * 32
    canvas = np.zeros((3, H, W), np.float32)
    canvas[:, :h, :w] = rgb.transpose(2, 0, 1)
    regs, scores = det.run(canvas[None])
    priors, strides = [], []
    for s in (8, 16, 32):
        ys, xs = np.meshgrid(np.arange(H // s), np.arange(W // s), indexing="ij")
        priors.append(np.stack([xs.ravel(), ys.ravel()], axis=1) * float(s))
        strides.append(np.full(xs.size, float(s)))
    identity = Letterbox(0, 0, W, H, 1.0, 1.0, 0, 0, max(W, H), W, H)
    found = greedy_nms(decode_yunet(regs[0], scores[0], np.concatenate(priors),
                                    np.concatenate(strides), identity, threshold))
    return np.concatenate([found.scores[:, None], found.boxes,
                           found.keypoints.reshape(-1, 10)], axis=1)


def _reference_images(sample_images: dict[str, np.ndarray],
                      face_free: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name, img in sample_images.items():
        small = _fit(img)
        out[name] = small
        out[f"{name}-mirrored"] = np.ascontiguousarray(small[:, ::-1])
        out[f"{name}-dark"] = (small * 0.55).astype(np.uint8)
        face_w = SAMPLE_FACES[name][2] - SAMPLE_FACES[name][0]
        s = 40.0 / face_w
        out[f"{name}-face40px"] = cv2.resize(img, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)
    out["group"] = _fit(group_photo(sample_images, face_free, seed=0).image)
    out["coffee"] = _fit(face_free["coffee"])
    return out


def test_conversion_matches_libfacedetection(
    yunet: YuNetDetector, library: LibFaceDetection,
    sample_images: dict[str, np.ndarray], face_free: dict[str, np.ndarray],
) -> None:
    """Same faces, boxes and landmarks within 1 px, scores within 0.01, on real photos
    and synthetic variants (mirrored, darkened, small faces, a group, a face-free photo)."""
    compared = 0
    for name, rgb in _reference_images(sample_images, face_free).items():
        ref = library.detect(rgb)
        ours = _ours_native(yunet, rgb, 0.2)
        # The library's threshold is 0.2 too; away from it both must agree exactly.
        ref = ref[ref[:, 0] >= 25]
        strong = ours[ours[:, 0] >= 0.25]
        assert len(strong) == len(ref), name
        for row in ref:
            score, x, y, w, h = row[:5]
            # The library truncates coordinates to integers (and the score ×100).
            i = int(np.argmin(np.abs(strong[:, 1] - x) + np.abs(strong[:, 2] - y)))
            o = strong[i]
            assert abs(o[0] * 100 - score) <= 1.0, name
            assert np.all(np.abs(np.trunc(o[1:3]) - [x, y]) <= 1), name
            assert np.all(np.abs(np.trunc(o[3:5] - o[1:3]) - [w, h]) <= 1), name
            assert np.all(np.abs(np.trunc(o[5:15]) - row[5:15]) <= 1), name
            compared += 1
    assert compared >= 20  # every portrait variant and the group's faces


def test_reader_takes_every_layer_of_the_library(settings: Settings) -> None:
    lib = materialise(YUFACE, "yuface/libfacedetection.so",
                      settings.home / "sources" / YUFACE.requirement / "libfacedetection.so",
                      settings.downloads_dir)
    convs = read_yunet(lib)
    assert len(convs) == 53
    assert sum(c.weight.size + c.bias.size for c in convs.values()) == 53_184
    head = convs["backbone__model0_pw"]
    assert (head.channels, head.filters, head.depthwise) == (32, 16, False)
    # The im2col head's five padding channels are zero in the library's weights.
    assert np.all(head.weight.reshape(16, 32)[:, 27:] == 0)


def test_reader_rejects_a_file_that_is_not_elf(tmp_path: Path) -> None:
    bogus = tmp_path / "libfacedetection.so"
    bogus.write_bytes(b"not an ELF file at all" * 10)
    with pytest.raises(BuildError):
        read_yunet(bogus)


def test_batch_equals_single_runs(yunet: YuNetDetector,
                                  sample_images: dict[str, np.ndarray]) -> None:
    tensors = np.stack([yunet.preprocess(sample_images[n])[0][0] for n in ("obama", "biden")])
    regs, scores = yunet.run(tensors)
    for i in range(2):
        r1, s1 = yunet.run(tensors[i : i + 1])
        np.testing.assert_allclose(regs[i], r1[0], atol=1e-4)
        np.testing.assert_allclose(scores[i], s1[0], atol=1e-5)


def test_each_portrait_has_one_face_with_its_landmarks_inside(
    yunet: YuNetDetector, sample_images: dict[str, np.ndarray]
) -> None:
    for name, img in sample_images.items():
        faces = yunet.detect(img)
        assert len(faces) == 1, name
        f = faces[0]
        assert match(f.bbox[None].astype(float), np.array([SAMPLE_FACES[name]])) == (1, 0)
        assert f.keypoints.shape == (5, 2)
        x0, y0, x1, y1 = f.bbox
        assert np.all((f.keypoints[:, 0] > x0) & (f.keypoints[:, 0] < x1)), name
        assert np.all((f.keypoints[:, 1] > y0) & (f.keypoints[:, 1] < y1)), name
        # Keypoint 0 is the subject's right eye, on the image's left.
        assert f.keypoints[0, 0] < f.keypoints[1, 0], name


def test_letterbox_maps_detections_back_to_the_photo(
    yunet: YuNetDetector, sample_images: dict[str, np.ndarray]
) -> None:
    """A portrait shrunk and padded into the 640 input: boxes and landmarks come back
    in the photo's pixels (the same as the model's own run on that canvas, unmapped)."""
    img = sample_images["obama2"]  # 626×1200: shrunk ×0.533 and padded left and right
    tensor, box = yunet.preprocess(img)[0]
    assert box.pad_x > 0 and box.sx < 1
    canvas = tensor.transpose(1, 2, 0).astype(np.uint8)
    on_canvas = _ours_native(yunet, canvas, 0.8)
    found = yunet.detect(img)
    assert len(on_canvas) == len(found) == 1
    expect_box = box.to_image(on_canvas[0, 1:5].reshape(2, 2)).reshape(-1)
    expect_kps = box.to_image(on_canvas[0, 5:].reshape(5, 2))
    np.testing.assert_allclose(found[0].bbox, expect_box, atol=1e-2)
    np.testing.assert_allclose(found[0].keypoints, expect_kps, atol=1e-2)
    # And by hand: canvas x = (photo x - 0) * sx + pad_x.
    lm = found[0].keypoints
    np.testing.assert_allclose(lm[:, 0] * box.sx + box.pad_x, on_canvas[0, 5::2], atol=1e-2)


def test_small_face_in_a_large_photo_is_found_through_tiles(
    yunet: YuNetDetector, sample_images: dict[str, np.ndarray]
) -> None:
    img = sample_images["obama"]
    face = np.array(SAMPLE_FACES["obama"])
    s = 28.0 / (face[2] - face[0])  # face 28 px wide ...
    small = cv2.resize(img, None, fx=s, fy=s, interpolation=cv2.INTER_AREA)
    canvas = np.full((2400, 3200, 3), 90, np.uint8)  # ... in a 3200-px photo
    canvas[1500 : 1500 + small.shape[0], 2000 : 2000 + small.shape[1]] = small
    truth = (face * s + [2000, 1500, 2000, 1500])[None]
    assert len(yunet.preprocess(canvas)) > 1
    boxes = np.array([d.bbox for d in yunet.detect(canvas)], float).reshape(-1, 4)
    assert match(boxes, truth) == (1, 0)
    whole_only = YuNetDetector(yunet.model, score_threshold=0.8, tile_above=4000)
    assert len(whole_only.preprocess(canvas)) == 1
    boxes = np.array([d.bbox for d in whole_only.detect(canvas)], float).reshape(-1, 4)
    assert match(boxes, truth)[0] == 0


def test_recall_and_false_positives_on_the_detection_sets(
    settings: Settings, registry: ModelRegistry,
    sample_images: dict[str, np.ndarray], face_free: dict[str, np.ndarray],
) -> None:
    """Every sample face found upright, turned, shrunk, cut by the frame and filling it;
    nearly all faces of the synthetic groups; nothing on the face-free photos."""
    analyser = FaceAnalyser(settings.replace(detector="yunet", det_rotations=True), registry)
    totals: dict[str, list[int]] = {}
    for case in detection_cases(sample_images, face_free):
        boxes = np.array([d.bbox for d in analyser.detect(case.image)], float)
        hit, fp = match(boxes.reshape(-1, 4), case.faces)
        row = totals.setdefault(case.kind, [0, 0, 0])
        row[0] += hit
        row[1] += len(case.faces)
        row[2] += fp
    for kind in ("sample", "rotated", "downscaled", "large", "edge"):
        found, present, false = totals[kind]
        assert (found, false) == (present, 0), kind
    found, present, false = totals["group"]
    assert found >= 0.85 * present and false == 0
    assert totals["face-free"][2] == 0


def test_invalid_arguments_are_typed_errors(yunet: YuNetDetector) -> None:
    with pytest.raises(InvalidArgumentError):
        YuNetDetector(yunet.model, score_threshold=1.5)
    with pytest.raises(InvalidArgumentError):
        YuNetDetector(yunet.model, size=650)
    with pytest.raises(InvalidArgumentError):
        yunet.detect(np.zeros((40, 40), np.uint8))
