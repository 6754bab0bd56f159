"""The fusion pixel stages as ONNX graphs against the OpenCV reference."""

from __future__ import annotations

import itertools
import math
from typing import Any

import cv2
import numpy as np
import pytest

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.types import Face
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.pixels import OnnxPixels, OpenCVPixels, load_graph, pixel_backend
from facefuse.toolchain.samples import SAMPLES, identity_of

PAIRS = [(s, t) for s, t in itertools.permutations(SAMPLES, 2)
         if identity_of(s) != identity_of(t)]
MIN_PSNR_DB = 40.0


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def onnx_pixels(settings: Settings) -> OnnxPixels:
    return OnnxPixels(settings)


@pytest.fixture(scope="module")
def crops(sample_images: dict[str, np.ndarray],
          analysed_faces: dict[str, Face]) -> dict[str, np.ndarray]:
    """name -> a 320×280 uint8 crop around the sample's face."""
    out = {}
    for name, face in analysed_faces.items():
        x0, y0, x1, y1 = (int(v) for v in face.bbox)
        cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
        img = cv2.copyMakeBorder(sample_images[name], 200, 200, 200, 200, cv2.BORDER_REFLECT_101)
        out[name] = np.ascontiguousarray(img[cy + 200 - 160: cy + 200 + 160,
                                             cx + 200 - 140: cx + 200 + 140])
    return out


def oval(h: int, w: int, feather: float) -> np.ndarray:
    m = np.zeros((h, w), np.float32)
    cv2.ellipse(m, (w // 2, h // 2), (w // 3, h * 2 // 5), 0, 0, 360, 1.0, -1)
    return np.asarray(cv2.GaussianBlur(m, (0, 0), feather), np.float32)


def test_shipped_graphs_are_what_the_builder_makes() -> None:
    pytest.importorskip("onnx")
    from facefuse.toolchain.build.pixel_graphs import all_graphs

    for name, data in all_graphs().items():
        assert load_graph(name) == data, f"{name} is stale: rerun the pixel_graphs builder"


def test_remap_matches_cv2_on_a_photo_under_a_warp(onnx_pixels: OnnxPixels,
                                                   crops: dict[str, np.ndarray]) -> None:
    img = crops["obama"]
    yy, xx = np.mgrid[0:300, 0:260].astype(np.float32)
    # A rotation, a stretch and a ripple; some coordinates fall outside (reflected border).
    mx = (0.9 * xx - 0.2 * yy + 30 + 4 * np.sin(yy / 17)).astype(np.float32)
    my = (0.2 * xx + 1.1 * yy - 20).astype(np.float32)
    ref = OpenCVPixels().remap(img, mx, my)
    out = onnx_pixels.remap(img, mx, my)
    assert out.shape == ref.shape == (300, 260, 3)
    assert psnr(out, ref) >= 50.0
    assert float(np.abs(out - ref).max()) < 2.0  # cv2 quantises map positions to 1/32 px


@pytest.mark.parametrize(("h", "w"), [(320, 280), (161, 97), (24, 30)])
def test_multiband_matches_laplacian_blend(onnx_pixels: OnnxPixels,
                                           crops: dict[str, np.ndarray], h: int, w: int) -> None:
    fg = crops["obama"][:h, :w].astype(np.float32)
    bg = crops["biden"][:h, :w]
    mask = oval(h, w, 3.0)
    # ``multiband`` may overwrite its foreground: each backend gets its own copy.
    ref = OpenCVPixels().multiband(fg.copy(), bg, mask)
    out = onnx_pixels.multiband(fg.copy(), bg, mask)
    assert psnr(out, ref) >= MIN_PSNR_DB
    # Far from the mask the result is the background.
    assert float(np.abs(out[0, 0] - bg[0, 0]).max()) < 1.0


@pytest.mark.parametrize("sigma", [3.0, 12.0, 19.0])
def test_lighting_matches_the_opencv_transfer(onnx_pixels: OnnxPixels,
                                              crops: dict[str, np.ndarray], sigma: float) -> None:
    src = crops["obama"].astype(np.float32)
    tgt = crops["astronaut"].astype(np.float32)
    skin = (oval(src.shape[0], src.shape[1], 3.0) > 0.5).astype(np.float32)
    ref = OpenCVPixels().lighting(src, tgt, skin, sigma, 3.0)
    out = onnx_pixels.lighting(src, tgt, skin, sigma, 3.0)
    inside = skin > 0
    assert psnr(out[inside], ref[inside]) >= MIN_PSNR_DB
    assert not np.allclose(ref, src, atol=1.0)  # the transfer did change the source


def test_auto_backend_is_opencv_on_a_cpu_host(settings: Settings) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this host has CUDA")
    gpu_first = settings.replace(providers=("tensorrt", "cuda", "cpu"))
    assert pixel_backend(gpu_first).name == "opencv"
    assert pixel_backend(gpu_first.replace(pixel_backend="onnx")).name == "onnx"
    assert pixel_backend(settings.replace(pixel_backend="opencv")).name == "opencv"


def test_fusion_on_onnx_pixels_matches_opencv_on_every_sample_pair(
        settings: Settings, analyser: FaceAnalyser, sample_images: dict[str, np.ndarray]) -> None:
    fusers = {b: FaceFuser(settings.replace(pixel_backend=b), analyser) for b in ("opencv", "onnx")}
    assert fusers["onnx"].pixels.name == "onnx" and fusers["opencv"].pixels.name == "opencv"
    analysed: dict[str, Any] = {n: analyser.analyse(img) for n, img in sample_images.items()}
    worst_psnr, worst_id = math.inf, 0.0
    for s, t in PAIRS:
        out = {b: f.fuse_faces(sample_images[s], analysed[s][0], sample_images[t], analysed[t],
                               [0], FuseOptions(degree=100)) for b, f in fusers.items()}
        ref, dev = out["opencv"], out["onnx"]
        assert not np.array_equal(ref.image, sample_images[t])
        worst_psnr = min(worst_psnr, psnr(dev.image, ref.image))
        q_ref, q_dev = ref.fused[0].quality, dev.fused[0].quality
        assert q_ref is not None and q_dev is not None
        worst_id = max(worst_id, abs(q_dev["id_sim_source"] - q_ref["id_sim_source"]),
                       abs(q_dev["id_sim_target"] - q_ref["id_sim_target"]))
    assert worst_psnr >= MIN_PSNR_DB
    assert worst_id <= 0.005, worst_id


def test_the_classic_swapper_is_fork_safe_on_opencvs_pixels_only(
        onnx_pixels: OnnxPixels) -> None:
    """A clip renders in forked processes only where no ONNX Runtime session is in
    the render: the ONNX pixel backend keeps it in threads."""
    from facefuse.fusion.swappers.classic import ClassicSwapper

    assert ClassicSwapper(pixels=OpenCVPixels()).fork_safe
    assert not ClassicSwapper(pixels=onnx_pixels).fork_safe
