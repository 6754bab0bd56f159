"""The video engine on clips made from the sample photos: what it keeps (frames,
times, rotation, audio), how it tracks (a second face, a cut, no face), how steady
it is, and how it refuses bad clips."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from child_processes import children
from video_clips import blank, clip, scene

from facefuse.errors import (
    CancelledError,
    InvalidArgumentError,
    InvalidVideoError,
    ModelError,
    VideoTooLargeError,
)
from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.landmarker import EYE_CONTOUR_INDICES
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.geometry import eye_distance
from facefuse.fusion.types import FuseOptions
from facefuse.video import processes as forked
from facefuse.video.engine import ClipFusion, FrameStats, VideoOptions
from facefuse.video.fuser import VideoFuser
from facefuse.video.io import Frame, VideoLimits, VideoReader, VideoWriter, probe
from facefuse.video.smoothing import OneEuroFilter
from facefuse.video.tracker import carried_eyes

SOURCE = "biden"


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory, analyser: FaceAnalyser,
          sample_images: dict[str, np.ndarray]) -> dict[str, Path]:
    """The test clips, written once: ``motion`` (25 fps, audio), ``story`` (a second
    face enters and leaves, then a cut to another photo of the first person),
    ``rotated`` (a phone clip, display matrix 90°), ``vfr`` (irregular frame times),
    ``wall`` (no face), ``dimming`` (the light falls to 60 % over 12 frames)."""
    d = tmp_path_factory.mktemp("clips")
    im = sample_images
    times = [0.0]
    for i in range(1, 16):
        times.append(times[-1] + (0.02 if i % 3 else 0.09))
    return {
        "motion": clip(d / "motion.mp4", [scene(analyser, im["obama"], 16)], audio=True),
        "story": clip(d / "story.mp4", [scene(analyser, im["obama"], 24, guest=im["biden"]),
                                        scene(analyser, im["obama2"], 8)]),
        "rotated": clip(d / "rotated.mp4", [scene(analyser, im["obama3"], 8)], rotation=90),
        "vfr": clip(d / "vfr.mp4", [scene(analyser, im["obama"], 16)], times=times),
        "wall": blank(d / "wall.mp4", 6, audio=True),
        "dimming": clip(d / "dimming.mp4", [scene(analyser, im["obama"], 12, light=(1.0, 0.6),
                                                  amplitude=0.3)]),
    }


@pytest.fixture(scope="module")
def video(fuser: FaceFuser) -> VideoFuser:
    return VideoFuser(fuser)


def frames_of(path: Path) -> list[Any]:
    with contextlib.closing(av.open(str(path))) as c:
        return [(f.pts, f.time, f.rotation, f.to_ndarray(format="rgb24"))
                for f in c.decode(c.streams.video[0])]


def audio_packets(path: Path) -> list[bytes]:
    with contextlib.closing(av.open(str(path))) as c:
        if not c.streams.audio:
            return []
        return [bytes(p) for p in c.demux(c.streams.audio[0]) if p.size]


def run_states(fuser: FaceFuser, path: Path, options: VideoOptions,
               sample_paths: dict[str, Path], **kw: Any) -> Iterator[tuple[Frame, FrameStats]]:
    state = ClipFusion(fuser, options, [sample_paths[SOURCE]], **kw)
    for item in VideoReader(path, probe(path)):
        if isinstance(item, Frame):
            _, stats = state.process(item.rgb, item.index, item.time_s)
            yield item, stats


# --- what a clip keeps -------------------------------------------------------------------


def test_frames_times_and_audio_are_kept(video: VideoFuser, clips: dict[str, Path],
                                         sample_paths: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out.mp4"
    report = video.fuse_video(sample_paths[SOURCE], clips["motion"], out)
    src, dst = frames_of(clips["motion"]), frames_of(out)
    assert len(dst) == len(src) == report.frames == 16
    assert [f[1] for f in dst] == pytest.approx([f[1] for f in src], abs=1e-3)
    info = probe(out)
    assert info.fps == Fraction(25) and info.codec == "vp9"
    # The audio is copied, packet for packet.
    assert audio_packets(out) == audio_packets(clips["motion"]) != []
    assert report.fused_frames == 16 and report.tracks == 1
    # The face changed, the wall did not (beyond the encoders' loss).
    a, b = src[8][3].astype(np.float32), dst[8][3].astype(np.float32)
    diff = np.abs(a - b).mean(axis=2)
    assert diff[150:230, 130:210].mean() > 6.0
    assert np.median(diff[:, 400:]) < 3.0
    assert not list(tmp_path.glob(".out.mp4.*"))  # no temporary file left


def test_variable_frame_times_are_kept(video: VideoFuser, clips: dict[str, Path],
                                       sample_paths: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "vfr.mkv"
    video.fuse_video(sample_paths[SOURCE], clips["vfr"], out)
    src, dst = frames_of(clips["vfr"]), frames_of(out)
    gaps = np.diff([f[1] for f in src])
    assert gaps.max() > 3 * gaps.min()  # the clip really is irregular
    assert [f[1] for f in dst] == pytest.approx([f[1] for f in src], abs=2e-3)


def test_rotated_clip_keeps_its_display_matrix(video: VideoFuser, clips: dict[str, Path],
                                               sample_paths: dict[str, Path],
                                               tmp_path: Path) -> None:
    out = tmp_path / "rot.mp4"
    report = video.fuse_video(sample_paths[SOURCE], clips["rotated"], out)
    src, dst = probe(clips["rotated"]), probe(out)
    assert src.rotation == dst.rotation == 90
    assert (dst.width, dst.height) == (src.width, src.height) == (360, 480)  # stored turned
    # Faces are found only upright: every frame fused means the turn was applied.
    assert report.fused_frames == report.frames == 8


def test_no_face_clip_is_reencoded_unchanged(video: VideoFuser, clips: dict[str, Path],
                                             sample_paths: dict[str, Path],
                                             tmp_path: Path) -> None:
    out = tmp_path / "wall.mp4"
    report = video.fuse_video(sample_paths[SOURCE], clips["wall"], out)
    assert report.fused_frames == 0 and report.frames == 6
    assert any("no frame" in n for n in report.notes)
    assert len(frames_of(out)) == 6 and audio_packets(out) == audio_packets(clips["wall"])


def test_fused_face_follows_a_lighting_change(video: VideoFuser, clips: dict[str, Path],
                                              sample_paths: dict[str, Path],
                                              tmp_path: Path) -> None:
    """The tone smoothing steadies flicker but must not hold the face at the old light."""
    out = tmp_path / "dim.mp4"
    video.fuse_video(sample_paths[SOURCE], clips["dimming"], out)
    src, dst = frames_of(clips["dimming"]), frames_of(out)
    box = (slice(140, 220), slice(140, 200))  # the middle of the face (it barely moves)

    def level(frames: list[Any], i: int) -> float:
        return float(frames[i][3][box].astype(np.float32).mean())

    want = level(src, -1) / level(src, 0)
    got = level(dst, -1) / level(dst, 0)
    assert want < 0.7
    assert abs(got - want) < 0.08


# --- tracking ----------------------------------------------------------------------------


def test_mode_one_keeps_the_same_person(fuser: FaceFuser, clips: dict[str, Path],
                                        sample_paths: dict[str, Path]) -> None:
    runs = list(run_states(fuser, clips["story"], VideoOptions(), sample_paths))
    both = [s for _, s in runs if len(s.tracks) == 2]
    assert both, "the second face was never found"
    # While both are in view, only the first person is fused.
    assert all(s.fused == [min(s.tracks)] for s in both)
    cut = [i for i, (_, s) in enumerate(runs) if s.cut]
    assert cut == [24]
    # After the cut the same person (another photo of him) keeps track 0.
    assert all(s.fused == [0] for _, s in runs[24:])


def test_mode_many_fuses_each_track_and_detects_sparsely(
        fuser: FaceFuser, clips: dict[str, Path], sample_paths: dict[str, Path]) -> None:
    opts = VideoOptions(fuse=FuseOptions(mode="many"), detect_every=8)
    runs = list(run_states(fuser, clips["story"], opts, sample_paths))
    both = [s for _, s in runs if len(s.tracks) == 2]
    assert both and all(sorted(s.fused) == sorted(s.tracks) for s in both)
    # Detection ran on far fewer frames than it tracked.
    assert sum(s.detected for _, s in runs) <= len(runs) // 2


def test_reference_mode_fuses_only_that_person(
        fuser: FaceFuser, clips: dict[str, Path], sample_paths: dict[str, Path]) -> None:
    opts = VideoOptions(fuse=FuseOptions(mode="reference"))
    runs = list(run_states(fuser, clips["story"], opts, sample_paths,
                           reference=sample_paths["biden"]))
    fused = {t for _, s in runs for t in s.fused}
    both = [s for _, s in runs if len(s.tracks) == 2]
    assert both and fused == {max(both[0].tracks)}  # the guest's track, nothing else


@pytest.mark.parametrize("mode", ["one", "many"])
def test_a_reference_outside_mode_reference_is_a_conflict(
        fuser: FaceFuser, sample_paths: dict[str, Path], mode: str) -> None:
    opts = VideoOptions(fuse=FuseOptions(mode=mode))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError) as info:
        ClipFusion(fuser, opts, [sample_paths[SOURCE]], reference=sample_paths["biden"])
    assert info.value.code == "options_conflict"


def test_tracked_mesh_matches_a_fresh_detection(
        fuser: FaceFuser, analyser: FaceAnalyser, clips: dict[str, Path],
        sample_paths: dict[str, Path]) -> None:
    opts = VideoOptions(detect_every=300, smooth=False)
    errors = []
    for frame, stats in run_states(fuser, clips["motion"], opts, sample_paths):
        if stats.detected:
            continue
        fresh = analyser.analyse(frame.rgb, embed=False)[0].landmarks
        assert fresh is not None
        tracked = stats.raw_landmarks[0]
        errors.append(float(np.linalg.norm(tracked[:468, :2] - fresh[:468, :2], axis=1).mean())
                      / eye_distance(fresh))
    assert len(errors) == 15
    assert max(errors) < 0.05  # within 5 % of the eye distance on every frame


def test_carried_irises_follow_the_eye_and_match_the_iris_model(
        fuser: FaceFuser, clips: dict[str, Path], sample_paths: dict[str, Path]) -> None:
    """Between detections the iris model runs every other frame; on the frames
    between, the irises and eye contours carried with the eyes stay within 5 % of
    the eye distance of what the model finds in that frame."""
    errors, calls = [], {1: 0, 2: 0}
    runs = {}
    runner = fuser.analyser._runner
    for every in (1, 2):
        opts = VideoOptions(detect_every=300, smooth=False, iris_every=every)

        def counted(call: stages.ModelCall, every: int = every) -> stages.Outputs:
            calls[every] += call.model == "iris"
            return runner(call)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fuser.analyser, "run", lambda st: stages.run_sync(st, counted))
            runs[every] = [s.raw_landmarks[0] for _, s in
                           run_states(fuser, clips["motion"], opts, sample_paths)]
    for a, b in zip(runs[1], runs[2], strict=True):
        eyes = [*range(468, 478), *EYE_CONTOUR_INDICES[0], *EYE_CONTOUR_INDICES[1]]
        errors.append(float(np.linalg.norm(a[eyes, :2] - b[eyes, :2], axis=1).max())
                      / eye_distance(a))
    # The source photo, then every frame; or every other tracked frame.
    assert calls[1] == 1 + 16 and calls[2] == 1 + 1 + 8, calls
    assert max(errors) < 0.05 and max(errors) > 0.0


def test_irises_are_not_carried_through_a_blink_or_a_jump() -> None:
    rng = np.random.default_rng(1)
    before = np.zeros((478, 3), np.float32)
    before[:, :2] = rng.uniform(-100, 100, (478, 2))
    for contour, x in zip(EYE_CONTOUR_INDICES, (-50.0, 30.0), strict=True):  # 40-px eyes
        before[list(contour), :2] = rng.uniform(0, 40, (16, 2)) * [1.0, 0.3] + [x, 0.0]
        before[contour[0], :2] = before[contour[8], :2] + [40.0, 0.0]
    raw = before[:468].copy()
    turn = np.array([[np.cos(0.05), -np.sin(0.05)], [np.sin(0.05), np.cos(0.05)]]) * 1.03
    moved = raw.copy()
    moved[:, :2] = raw[:, :2] @ turn.T + [3.0, -2.0]
    carried = carried_eyes(moved, raw, before)
    assert carried is not None  # a turn, a zoom and a shift are carried exactly
    np.testing.assert_allclose(carried[468:, :2], before[468:, :2] @ turn.T + [3.0, -2.0],
                               atol=1e-3)
    blink = moved.copy()
    blink[list(EYE_CONTOUR_INDICES[1][9:]), 1] += 8.0  # an upper lid drops
    assert carried_eyes(blink, raw, before) is None
    jump = moved.copy()
    jump[:, 0] += 20.0  # half an eye width in one frame
    assert carried_eyes(jump, raw, before) is None


def test_smoothing_steadies_landmarks(fuser: FaceFuser, clips: dict[str, Path],
                                      sample_paths: dict[str, Path]) -> None:
    raw, smooth = [], []
    for _, s in run_states(fuser, clips["motion"], VideoOptions(detect_every=4), sample_paths):
        raw.append(s.raw_landmarks[0][:468, :2])
        smooth.append(s.landmarks[0][:468, :2])

    def jitter(seq: list[np.ndarray]) -> float:
        a = np.stack(seq).astype(np.float64)
        return float(np.abs(a[2:] - 2 * a[1:-1] + a[:-2]).mean())  # 2nd difference

    assert jitter(smooth) < 0.8 * jitter(raw)


def test_one_euro_filter_steadies_rest_and_follows_motion() -> None:
    rng = np.random.default_rng(0)
    f = OneEuroFilter(min_cutoff=1.0, beta=0.8)
    still = [f(np.array([100.0]) + rng.normal(0, 1.0, 1), i / 25, scale=60.0)
             for i in range(100)]
    assert np.std(still[20:]) < 0.5
    f.reset()
    moving = [f(np.array([4.0 * i]), i / 25, scale=60.0)[0] for i in range(50)]
    assert abs(moving[-1] - 4.0 * 49) < 12.0  # under 3 frames behind at 100 px/s


# --- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "garbage", "photo"])
def test_corrupt_clip_is_a_typed_error(video: VideoFuser, clips: dict[str, Path],
                                       sample_paths: dict[str, Path], tmp_path: Path,
                                       damage: str) -> None:
    bad = tmp_path / "bad.mp4"
    data = clips["motion"].read_bytes()
    if damage == "truncated":
        bad.write_bytes(data[: len(data) // 3])
    elif damage == "garbage":
        bad.write_bytes(bytes(np.random.default_rng(1).integers(0, 256, 20000, np.uint8)))
    else:
        bad.write_bytes(sample_paths["obama"].read_bytes())
    out = tmp_path / "out.mp4"
    with pytest.raises(InvalidVideoError) as err:
        video.fuse_video(sample_paths[SOURCE], bad, out)
    assert err.value.code in ("corrupt_video", "no_video_stream")
    assert not out.exists() and not list(tmp_path.glob(".out.mp4.*"))


def test_limits_refuse_before_decoding(fuser: FaceFuser, clips: dict[str, Path],
                                       sample_paths: dict[str, Path], tmp_path: Path) -> None:
    for limits, code in ((VideoLimits(max_frames=10), "video_too_long"),
                         (VideoLimits(max_side=400), "video_resolution_too_high"),
                         (VideoLimits(max_fps=24), "video_fps_too_high"),
                         (VideoLimits(max_bytes=1000), "video_too_large")):
        with pytest.raises(VideoTooLargeError) as err:
            VideoFuser(fuser, limits).fuse_video(sample_paths[SOURCE], clips["motion"],
                                                 tmp_path / "o.mp4")
        assert err.value.code == code and err.value.http_status == 413


def test_webm_cannot_take_aac_audio(video: VideoFuser, clips: dict[str, Path],
                                    sample_paths: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidVideoError) as err:
        video.fuse_video(sample_paths[SOURCE], clips["motion"], tmp_path / "o.webm")
    assert err.value.code == "unsupported_container"


def test_cancel_leaves_no_output(video: VideoFuser, clips: dict[str, Path],
                                 sample_paths: dict[str, Path], tmp_path: Path) -> None:
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 3

    out = tmp_path / "c.mp4"
    with pytest.raises(CancelledError):
        video.fuse_video(sample_paths[SOURCE], clips["motion"], out, cancelled=cancelled)
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("where", ["render", "encode"])
def test_a_failure_in_a_pipeline_thread_surfaces_typed(
        fuser: FaceFuser, clips: dict[str, Path], sample_paths: dict[str, Path],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """A typed error raised in a render thread or in the encoder's thread reaches
    the caller as itself, mid-clip, and leaves no output."""
    calls = []

    def failing(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 5:
            raise ModelError("model run failed", code="model_failed")
        return real(*args, **kw)

    real: Callable[..., Any]
    if where == "render":
        swapper = fuser.swappers["classic"]
        real = swapper.render
        monkeypatch.setattr(swapper, "render", failing)
    else:
        real = VideoWriter.write
        monkeypatch.setattr(VideoWriter, "write", failing)
    out = tmp_path / "out.mp4"
    with pytest.raises(ModelError) as err:
        # (Threads: the calls are counted in this process.)
        VideoFuser(fuser).fuse_video(sample_paths[SOURCE], clips["motion"], out,
                                     VideoOptions(processes=False))
    assert err.value.code == "model_failed" and len(calls) >= 5
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.skipif(not forked.available(), reason="needs fork")
def test_a_failure_in_a_render_process_surfaces_typed_and_leaves_none_running(
        fuser: FaceFuser, clips: dict[str, Path], sample_paths: dict[str, Path],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A typed error raised in a render process reaches the caller as itself (its
    code kept), leaves no output, and the render processes are gone."""
    parent, calls = os.getpid(), []
    swapper = fuser.swappers["classic"]
    real = swapper.render

    def failing(*args: Any, **kw: Any) -> Any:
        calls.append(1)  # (each process counts its own)
        if os.getpid() != parent and len(calls) == 3:
            raise ModelError("model run failed", code="model_failed")
        return real(*args, **kw)

    monkeypatch.setattr(swapper, "render", failing)
    before = children()
    out = tmp_path / "out.mp4"
    with pytest.raises(ModelError) as err:
        VideoFuser(fuser).fuse_video(sample_paths[SOURCE], clips["motion"], out,
                                     VideoOptions(processes=True))
    assert err.value.code == "model_failed"
    assert not out.exists() and not list(tmp_path.iterdir())
    assert children() <= before


@pytest.mark.skipif(not forked.available(), reason="needs fork")
@pytest.mark.parametrize("fork_safe", [True, False])
def test_renders_go_to_processes_only_when_the_swapper_is_fork_safe(
        fuser: FaceFuser, clips: dict[str, Path], sample_paths: dict[str, Path],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fork_safe: bool) -> None:
    """A swapper whose render runs ONNX Runtime (the ONNX swapper, the classic one
    on the ONNX pixel backend) renders in threads: a session does not survive a
    fork."""
    swapper = fuser.swappers["classic"]
    assert swapper.fork_safe  # OpenCV's pixels
    monkeypatch.setattr(type(swapper), "fork_safe", property(lambda _: fork_safe))
    before, seen = children(), []
    VideoFuser(fuser).fuse_video(sample_paths[SOURCE], clips["motion"], tmp_path / "o.mp4",
                                 progress=lambda *_: seen.append(len(children() - before)))
    assert max(seen) == (2 if fork_safe else 0)


@pytest.mark.skipif(not forked.available(), reason="needs fork")
def test_frames_rendered_in_processes_give_the_clip_of_threads(
        video: VideoFuser, clips: dict[str, Path], sample_paths: dict[str, Path],
        tmp_path: Path) -> None:
    """The render processes make exactly the clip the render threads make (two
    faces tracked, a cut), and none is left running after it."""
    before = children()
    outs = []
    for processes in (False, True):
        out = tmp_path / f"p{processes}.mp4"
        report = video.fuse_video(sample_paths[SOURCE], clips["story"], out,
                                  VideoOptions(fuse=FuseOptions(mode="many"),
                                               processes=processes))
        assert report.cuts == 1 and report.fused_frames == 32
        outs.append(frames_of(out))
    assert children() <= before
    for a, b in zip(*outs, strict=True):
        assert a[0] == b[0] and np.array_equal(a[3], b[3])


def test_rendering_frames_at_once_gives_the_one_at_a_time_clip(
        video: VideoFuser, clips: dict[str, Path], sample_paths: dict[str, Path],
        tmp_path: Path) -> None:
    """Frames rendered in a pool while the next are tracked (the tone filter reset at
    the cut applied in frame order) make exactly the clip of one frame at a time."""
    outs = []
    for threads in (1, 3):
        out = tmp_path / f"t{threads}.mp4"
        report = video.fuse_video(sample_paths[SOURCE], clips["story"], out,
                                  VideoOptions(fuse=FuseOptions(mode="many"), threads=threads))
        assert report.cuts == 1 and report.fused_frames == 32
        outs.append(frames_of(out))
    assert len(outs[0]) == len(outs[1]) == 32
    for a, b in zip(*outs, strict=True):
        assert a[0] == b[0] and np.array_equal(a[3], b[3])


def test_a_clips_frames_share_the_sources_work(fuser: FaceFuser, clips: dict[str, Path],
                                              sample_paths: dict[str, Path]) -> None:
    cache = fuser.swappers["classic"].sources  # type: ignore[attr-defined]
    before = (cache.hits, cache.misses)
    fused = sum(bool(s.fused) for _, s in run_states(fuser, clips["motion"], VideoOptions(),
                                                     sample_paths))
    hits, misses = cache.hits - before[0], cache.misses - before[1]
    assert fused == 16 and hits + misses == 16
    # The face's size changes a little in the clip: the source's working scale is on
    # a coarse grid, so nearly every frame finds the work of one before it.
    assert misses <= 3


def test_the_writer_converts_only_the_changed_boxes(clips: dict[str, Path],
                                                    tmp_path: Path) -> None:
    """Told where a frame changed, the writer reuses the decoded picture elsewhere:
    the box holds the new pixels, and the rest is closer to the input than a round
    trip of the whole frame through RGB."""
    from facefuse.video.codecs import encoder
    from facefuse.video.io import VideoWriter, conversion, patched_picture, picture_plane

    src = clips["motion"]
    info = probe(src)
    frames = [f for f in VideoReader(src, info) if isinstance(f, Frame)]
    assert all(f.coded is not None for f in frames)
    box = (101, 61, 260, 231)  # odd corners: grown to even pixels
    decoded = {}
    for mode, changed in (("whole", None), ("boxes", [box])):
        out = tmp_path / f"{mode}.mp4"
        with VideoWriter(out, info, encoder("vp9"), src) as writer:
            for f in frames:
                rgb = f.rgb.copy()
                rgb[61:231, 101:260] = 255 - rgb[61:231, 101:260]
                writer.write(f, rgb, changed)
        decoded[mode] = np.stack([f[3] for f in frames_of(out)]).astype(np.float32)
    inp = np.stack([f.rgb for f in frames]).astype(np.float32)
    want = inp.copy()
    want[:, 61:231, 101:260] = 255 - want[:, 61:231, 101:260]
    outside = np.ones(inp.shape[1:3], bool)
    outside[55:237, 95:266] = False
    for mode in decoded:
        assert np.abs(decoded[mode] - want)[:, 65:227, 105:256].mean() < 4.0
    err = {m: float(np.abs(d - inp)[:, outside].mean()) for m, d in decoded.items()}
    assert err["boxes"] < err["whole"]
    # Before the encoder: the decoded planes exactly, but for the box grown to even
    # pixels, whose luma is the whole frame's conversion.
    f = frames[3]
    rgb = f.rgb.copy()
    rgb[61:231, 101:260] = 0
    picture = patched_picture(f.coded, rgb, [box], *conversion(info))
    whole = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(
        format="yuv420p", dst_colorspace=conversion(info)[0],
        dst_color_range=conversion(info)[1])
    y, y_in, y_all = (picture_plane(x, 0) for x in (picture, f.coded, whole))
    grown = np.zeros(y.shape, bool)
    grown[60:232, 100:260] = True
    assert np.array_equal(y[~grown], y_in[~grown]) and np.array_equal(y[grown], y_all[grown])
    assert not np.array_equal(y, y_in)
    for i in (1, 2):
        u, u_in = picture_plane(picture, i), picture_plane(f.coded, i)
        half = np.zeros(u.shape, bool)
        half[30:116, 50:130] = True
        assert np.array_equal(u[~half], u_in[~half])


def test_faces_rendered_in_turn_match_faces_rendered_at_once_when_apart(
        fuser: FaceFuser, clips: dict[str, Path], sample_paths: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Overlapping faces are rendered one after another over the frame as blended so
    far (as the image path does); on the story clip's two faces, which lie apart,
    that order must give exactly the frames of rendering both over the decoded frame."""
    from facefuse.video import engine

    options = VideoOptions(fuse=FuseOptions(mode="many"))
    first = ClipFusion(fuser, options, [sample_paths[SOURCE]])
    at_once = [first.process(f.rgb, f.index, f.time_s)[0]
               for f in VideoReader(clips["story"], probe(clips["story"]))
               if isinstance(f, Frame)]
    monkeypatch.setattr(engine, "_overlapping", lambda plan: len(plan.targets) > 1)
    state = ClipFusion(fuser, options, [sample_paths[SOURCE]])
    two_faces = 0
    for i, f in enumerate(x for x in VideoReader(clips["story"], probe(clips["story"]))
                          if isinstance(x, Frame)):
        rgb, stats = state.process(f.rgb, f.index, f.time_s)
        two_faces += len(stats.fused) > 1
        assert np.array_equal(rgb, at_once[i]), i
    assert two_faces > 0


def test_overlapping_regions_are_found() -> None:
    from types import SimpleNamespace

    from facefuse.video.engine import _overlapping

    lm = np.zeros((478, 3))
    lm[:, 0] = np.linspace(100, 160, 478)
    lm[:, 1] = np.linspace(100, 170, 478)
    lm[33, :2], lm[263, :2] = (110, 120), (150, 120)

    def plan(dx: float) -> Any:
        other = lm.copy()
        other[:, 0] += dx
        faces = [SimpleNamespace(face=SimpleNamespace(landmarks=m)) for m in (lm, other)]
        return SimpleNamespace(targets=faces, rgb=np.zeros((400, 800, 3), np.uint8))

    assert _overlapping(plan(70.0)) and not _overlapping(plan(400.0))
    one: Any = SimpleNamespace(targets=plan(70.0).targets[:1], rgb=None)
    assert not _overlapping(one)


@pytest.mark.parametrize("error", [OSError(12, "Cannot allocate memory"),
                                   NotImplementedError("no named semaphores")])
def test_a_clip_renders_in_threads_when_processes_cannot_start(
        video: VideoFuser, clips: dict[str, Path], sample_paths: dict[str, Path],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """A fork that fails (out of memory or processes) or a host without named
    semaphores (no /dev/shm in a container) leaves the clip to the threads."""
    def refuse(*_: Any, **__: Any) -> None:
        raise error

    monkeypatch.setattr(forked, "ForkedCalls", refuse)
    report = video.fuse_video(sample_paths[SOURCE], clips["motion"], tmp_path / "o.mp4")
    assert report.fused_frames == 16
