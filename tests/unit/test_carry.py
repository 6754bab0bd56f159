"""Regions carried from frame to frame: a target's glasses and beard found on one
frame of a clip and moved with the face to the next ones stay where the face's
own glasses and beard are, and stay kept through the fusion."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from facefuse.errors import InvalidArgumentError
from facefuse.faces.analyser import FaceAnalyser
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.geometry import eye_distance, fused_shape
from facefuse.fusion.swappers.classic import regions
from facefuse.fusion.swappers.classic.swapper import CLIP_WORK_EYE_PX, WORK_EYE_PX, ClassicSwapper
from facefuse.fusion.types import FuseOptions
from facefuse.live.loop import LIVE_WORK_EYE_PX, live_options
from facefuse.toolchain.measures import hair_kept
from facefuse.toolchain.synthetic import paste_facial_hair, paste_glasses
from facefuse.toolchain.trials import Sample
from facefuse.video.engine import ClipFusion, VideoOptions

#: (rotation degrees, shift x, shift y, scale) of the frames of the moving face.
MOVES = [(0.0, 0, 0, 1.0), (2.0, 6, -3, 1.01), (4.0, 12, -5, 1.02), (5.0, 17, -8, 1.03),
         (3.0, 20, -6, 1.02), (0.0, 22, -2, 1.0), (-2.0, 18, 2, 0.99), (-4.0, 12, 5, 0.98)]


def _moved(image: np.ndarray, move: tuple[float, int, int, float],
           centre: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """``image`` turned, shifted and scaled about ``centre``, and the (2, 3) map."""
    angle, dx, dy, scale = move
    m = cv2.getRotationMatrix2D(centre, angle, scale)
    m[:, 2] += (dx, dy)
    h, w = image.shape[:2]
    return cv2.warpAffine(image, m, (w, h), flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_REPLICATE), m


@pytest.fixture(scope="module")
def worn(samples: dict[str, Sample]) -> tuple[np.ndarray, np.ndarray]:
    """biden wearing metal glasses and a beard (astronaut's real pixels), and the
    (H, W) bool footprint of both."""
    t, d = samples["biden"], samples["astronaut"]
    hairy, beard = paste_facial_hair(t.image, t.landmarks, "beard", d.image, d.landmarks)
    image, frame = paste_glasses(hairy, t.landmarks, "metal", d.image, d.landmarks)
    return image, beard | frame


@pytest.fixture(scope="module")
def moving(analyser: FaceAnalyser, samples: dict[str, Sample],
           worn: tuple[np.ndarray, np.ndarray]
           ) -> list[tuple[np.ndarray, np.ndarray, Sample]]:
    """The frames of the worn face moving (:data:`MOVES`): (frame, footprint, its
    analysis)."""
    image, fp = worn
    lm = samples["biden"].landmarks
    centre = (float(lm[1, 0]), float(lm[1, 1]))
    out = []
    for move in MOVES:
        frame, _ = _moved(image, move, centre)
        footprint, _ = _moved(fp.astype(np.uint8) * 255, move, centre)
        out.append((frame, footprint > 127, Sample(frame, analyser.analyse(frame, embed=False))))
    return out


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(1, (a | b).sum()))


def test_carried_regions_move_with_the_face(
        moving: list[tuple[np.ndarray, np.ndarray, Sample]]) -> None:
    """The glasses and beard found on the first frame, moved to each later frame by
    the similarity between the meshes, cover the frame's true glasses and beard as
    well as finding them on that frame itself does, and little else."""
    swapper = ClassicSwapper()
    options = FuseOptions()
    first = moving[0][2]
    carried = swapper.carry(first.image, first.faces[0], options)
    assert carried.mask is not None and carried.mask.any()
    assert carried.hair is not None and carried.hair.any()
    for i, (_, footprint, s) in enumerate(moving[1:], 1):
        again = swapper.carry(s.image, s.faces[0], options)
        assert again.mask is not None and again.hair is not None
        x0, y0, x1, y1 = again.box
        size = (again.mask.shape[1], again.mask.shape[0])
        onto = carried.mask_onto(s.landmarks, (x0, y0), again.ratio, size)
        hair = carried.hair_onto(s.landmarks, (x0, y0), again.ratio, size)
        assert onto is not None and hair is not None
        # (The glasses are kept on top, the beard laid over: both move with the face.)
        moved, found = np.maximum(onto, hair) > 0.5, np.maximum(again.mask, again.hair) > 0.5
        truth = cv2.resize(footprint[y0:y1, x0:x1].astype(np.float32), size,
                           interpolation=cv2.INTER_AREA) > 0.3
        near = cv2.dilate(truth.astype(np.uint8), np.ones((5, 5), np.uint8)) > 0
        cover = (moved[truth].mean(), found[truth].mean())
        off = (moved[~near].sum() / moved.sum(), found[~near].sum() / found.sum())
        assert cover[0] >= cover[1] - 0.05, (i, cover)
        assert off[0] <= off[1] + 0.03, (i, off)
        assert _iou(moved, found) >= 0.85, (i, _iou(moved, found))
        # The iris colour is the face's own, read again: within a few grey levels.
        assert carried.iris is not None and again.iris is not None
        assert np.abs(carried.iris[0] - again.iris[0]).max() <= 6.0, (i, carried.iris,
                                                                     again.iris)


def test_a_turned_squashed_or_resized_face_is_looked_at_again(
        moving: list[tuple[np.ndarray, np.ndarray, Sample]]) -> None:
    first = moving[0][2]
    carried = ClassicSwapper().carry(first.image, first.faces[0], FuseOptions())
    lm = first.landmarks
    assert all(carried.fits(s.landmarks) for _, _, s in moving[1:4])
    centre = lm[:468, :2].mean(axis=0)
    squashed = lm.copy()
    squashed[:, 1] = centre[1] + 0.85 * (lm[:, 1] - centre[1])  # a nod, an open mouth
    larger = lm.copy()
    larger[:, :2] = centre + 1.2 * (lm[:, :2] - centre)
    assert not carried.fits(squashed)
    assert not carried.fits(larger)


def test_a_face_cut_by_the_frame_is_looked_at_again(
        moving: list[tuple[np.ndarray, np.ndarray, Sample]]) -> None:
    """Found on a frame that cuts the face's neighbourhood (a face entering), the
    regions are not carried: what lay beyond the edge was never seen."""
    frame, _, s = moving[0]
    lm = s.landmarks
    x_cut = int(lm[:468, 0].min()) + 5  # the frame's edge through the face's side
    cropped = np.ascontiguousarray(frame[:, x_cut:])
    moved = lm.copy()
    moved[:, 0] -= x_cut
    face = dataclasses.replace(s.faces[0], landmarks=moved.astype(np.float32))
    carried = ClassicSwapper().carry(cropped, face, FuseOptions())
    assert carried.cut and not carried.fits(moved)
    whole = ClassicSwapper().carry(frame, s.faces[0], FuseOptions())
    assert not whole.cut and whole.fits(lm)


def test_regions_every_is_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="regions_every"):
        VideoOptions(regions_every=0)


def test_a_clip_keeps_the_targets_glasses_and_beard_on_carried_frames(
        fuser: FaceFuser, sample_paths: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        moving: list[tuple[np.ndarray, np.ndarray, Sample]]) -> None:
    """Fusing the moving face, the glasses and beard found on one frame in four
    are kept on the frames between as well as when found on every frame."""
    kept: dict[int, list[float]] = {}
    found: list[int] = []
    swapper = fuser.swappers["classic"]
    real = swapper.carry

    def spy(*args: Any) -> Any:
        found.append(1)  # (regions_every=1 never asks)
        return real(*args)

    monkeypatch.setattr(swapper, "carry", spy)
    for every in (1, 4):
        state = ClipFusion(fuser, VideoOptions(regions_every=every),
                           [sample_paths["obama"]])
        kept[every] = []
        for i, (frame, fp, s) in enumerate(moving):
            out, stats = state.process(frame, i, i / 25.0)
            assert stats.fused == [0]
            # (The beard is laid over the fused skin, the glasses kept: both strand
            # for strand, hair_kept; the frame's pixels alone, occluder_survival.)
            kept[every].append(hair_kept(out, frame, fp, s.landmarks))
    # Found on frames 0 and 4 only (the face's moves are rigid: it fits between).
    assert len(found) == 2, found
    assert min(kept[4]) >= min(kept[1]) - 0.03, kept
    assert np.median(kept[4]) >= np.median(kept[1]) - 0.02, kept
    assert min(kept[4]) >= 0.75, kept  # (found on every frame: 0.81 at worst)


def test_worn_regions_are_the_occluder_masks_regions(
        moving: list[tuple[np.ndarray, np.ndarray, Sample]]) -> None:
    """What is carried is what the occluder mask holds besides the other occluders
    (on the working copy of the face, as the swapper finds them)."""
    image, _, s = moving[0]
    lm = s.landmarks
    scale = min(1.0, WORK_EYE_PX / eye_distance(lm))
    small = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    local = lm.copy()
    local[:, :3] *= scale
    both = regions.face_occluders(small, local, glasses=True, facial_hair=True)
    alone = regions.face_occluders(small, local)
    found = regions.worn_regions(small, local, glasses=True, facial_hair=True)
    assert found.any()
    assert np.array_equal(both, np.maximum(alone, found))


def test_the_frames_of_a_carry_share_the_triangulation(samples: dict[str, Sample]) -> None:
    """The fused mesh's triangulation on the frame the carry was made on serves the
    fused meshes of the next frames while none of its triangles flips; a mesh
    that folded over is triangulated on its own."""
    from facefuse.imaging.warp import delaunay, doubled_areas

    s = samples["biden"]
    assert ClassicSwapper().carry(s.image, s.faces[0], FuseOptions()).triangles is None
    options = FuseOptions()
    carried = ClassicSwapper().carry(s.image, s.faces[0], options,
                                     samples["obama"].faces[0])
    assert carried.triangles is not None and not carried.triangles.flags.writeable
    src_lm, tgt_lm = samples["obama"].faces[0].landmarks, s.faces[0].landmarks
    assert src_lm is not None and tgt_lm is not None
    lm = fused_shape(src_lm.astype(np.float64), tgt_lm.astype(np.float64),
                     options.shape_weight)
    calls: list[int] = []

    def triangulate(pts: np.ndarray) -> np.ndarray:
        calls.append(1)
        return delaunay(pts)

    mesh = lm[:468, :2]
    assert carried.triangles_for(mesh, triangulate) is carried.triangles and not calls
    # The face a little turned, moved and grown: the same triangles.
    m = cv2.getRotationMatrix2D((300.0, 300.0), 3.0, 1.02)
    moved = mesh @ m[:, :2].T + m[:, 2] + (4.0, -2.0)
    assert carried.triangles_for(moved, triangulate) is carried.triangles and not calls
    # Mirrored, every triangle flips: triangulated on its own.
    mirrored = mesh * (-1.0, 1.0) + (2 * mesh[:, 0].max(), 0.0)
    own = carried.triangles_for(mirrored, triangulate)
    assert len(calls) == 1 and own is not carried.triangles
    assert (doubled_areas(mirrored, own) > 0).all()


def test_a_clip_frame_renders_at_the_clip_scale_as_a_photo_would(
        samples: dict[str, Sample],
        moving: list[tuple[np.ndarray, np.ndarray, Sample]]) -> None:
    """A frame rendered with carried findings works at the clip's working scale, and
    the face comes out as at the photo's: its largest channel's change within two
    grey levels and a half on average inside the face (about 1 on the bench's frames;
    the beard laid over the face, filled and toned at each scale, 2.0 here)."""
    source = samples["obama"]
    frame, _, s = moving[1]
    options = FuseOptions(evaluate=False)
    layers = {}
    for eye_px in (WORK_EYE_PX, CLIP_WORK_EYE_PX):
        swapper = ClassicSwapper(clip_eye_px=eye_px)
        carried = swapper.carry(moving[0][0], moving[0][2].faces[0], options,
                                source.faces[0])
        layers[eye_px] = swapper.render(source.image, source.faces[0], frame, s.faces[0],
                                        options, carried)
    photo, clip = layers[WORK_EYE_PX], layers[CLIP_WORK_EYE_PX]
    assert photo.region == clip.region
    inside = np.minimum(photo.mask, clip.mask) > 0.5
    diff = np.abs(photo.face - clip.face).max(axis=2)[inside]
    assert 0.0 < float(diff.mean()) < 2.5, float(diff.mean())


def test_a_clip_asking_its_own_working_eye_distance_renders_its_carried_frames_at_it(
        fuser: FaceFuser, sample_paths: dict[str, Path], samples: dict[str, Sample],
        moving: list[tuple[np.ndarray, np.ndarray, Sample]]) -> None:
    """A live session's clip state carries its working eye distance with each face's
    findings where it shrinks the face by no more than it allows (a face too large
    is left to the swapper's clip scale), and the swapper renders those frames at
    it, as one made with it as its clip scale would; the face comes out within a
    few grey levels of the clip's scale on average (3.6 with the test face's beard
    laid over at each scale; under 2.5 when it was kept as pixels)."""
    with pytest.raises(InvalidArgumentError, match="work_eye_px"):
        VideoOptions(work_eye_px=8.0)
    with pytest.raises(InvalidArgumentError, match="work_min_scale"):
        VideoOptions(work_min_scale=1.5)
    live = live_options(FuseOptions())
    eye = eye_distance(moving[0][2].landmarks)
    assert live.work_min_scale * eye > LIVE_WORK_EYE_PX  # the face is too large ...
    for options, asked in ((live, None), (dataclasses.replace(live, work_min_scale=0.0),
                                          LIVE_WORK_EYE_PX)):
        state = ClipFusion(fuser, options, [sample_paths["obama"]])
        for i, (frame, _, _) in enumerate(moving[:2]):
            state.process(frame, i, i / 25.0)
        (track,) = state.tracker.tracks
        assert track.carried is not None and track.carried.work_eye_px == asked

    source = samples["obama"]
    frame, _, s = moving[1]
    fuse = FuseOptions(evaluate=False)
    clip = ClassicSwapper()
    assert eye_distance(s.landmarks) > CLIP_WORK_EYE_PX > LIVE_WORK_EYE_PX
    found = clip.carry(moving[0][0], moving[0][2].faces[0], fuse, source.faces[0])
    lower = dataclasses.replace(found, work_eye_px=LIVE_WORK_EYE_PX)
    at_live = clip.render(source.image, source.faces[0], frame, s.faces[0], fuse, lower)
    made = ClassicSwapper(clip_eye_px=LIVE_WORK_EYE_PX).render(
        source.image, source.faces[0], frame, s.faces[0], fuse, found)
    at_clip = clip.render(source.image, source.faces[0], frame, s.faces[0], fuse, found)
    assert np.array_equal(at_live.face, made.face) and np.array_equal(at_live.mask, made.mask)
    inside = np.minimum(at_live.mask, at_clip.mask) > 0.5
    diff = np.abs(at_live.face - at_clip.face).max(axis=2)[inside]
    assert 0.0 < float(diff.mean()) < 4.0, float(diff.mean())
