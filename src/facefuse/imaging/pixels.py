"""The fusion pixel stages behind one interface, on OpenCV or on an ORT device.

Three stages move most of a fusion's pixels: the dense remap of a face region
(twice per face), the lighting transfer and the multi-band blend.
:class:`PixelBackend` names them; two implementations:

* :class:`OpenCVPixels` — the reference: :func:`~facefuse.imaging.warp.remap_region`,
  the lighting transfer by :func:`masked_blur` (normalised convolution) and
  :func:`~facefuse.imaging.blend.laplacian_blend`, all on the CPU.
* :class:`OnnxPixels` — the same arithmetic as small ONNX graphs shipped in
  ``imaging/graphs/`` (GridSample, Resize, Conv/ConvTranspose; built by
  ``facefuse.toolchain.build.pixel_graphs``), run by ONNX Runtime through the
  project's session factory, so on a CUDA/TensorRT provider the pixels stay on
  the GPU. Parity with OpenCV is tested on the sample photos (PSNR ≥ 40 dB).

``FACEFUSE_PIXEL_BACKEND``: ``opencv``, ``onnx``, or ``auto`` (``onnx`` when a
GPU provider is active, else ``opencv``: measured faster on the CPU, see
BENCHMARKS.md). Every method takes and returns float32 0..255 arrays, not clipped
unless said.
"""

from __future__ import annotations

import threading
from importlib import resources
from typing import Final, Protocol

import cv2
import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from facefuse.config import Settings
from facefuse.imaging.blend import auto_levels, laplacian_blend
from facefuse.imaging.channels import each_channel
from facefuse.imaging.warp import remap_region
from facefuse.runtime.binding import run_bound
from facefuse.runtime.providers import device_of
from facefuse.runtime.session import create_session, provider_plan

F32 = npt.NDArray[np.float32]

#: Deepest pyramid with a shipped graph.
MAX_GRAPH_LEVELS: Final = 8


class PixelBackend(Protocol):
    """The pixel stages of the classic swapper and the blend."""

    name: str

    def remap(self, image: npt.NDArray[np.uint8], map_x: F32, map_y: F32) -> F32:
        """(H, W, 3) uint8 sampled at (h, w) absolute pixel maps → (h, w, 3) float32
        (bilinear, reflect-101 border, as :func:`cv2.remap`)."""
        ...

    def lighting(self, source: F32, target: F32, weight: F32, sigma: float,
                 max_gain: float) -> F32:
        """``source`` × clamp(local mean of ``target`` / local mean of ``source``),
        (H, W, 3) float32 in 0..255 (clipped), the local means by :func:`masked_blur`
        over ``weight`` (H, W) > 0 at ``sigma`` px; the ratio of the target's local mean
        colour to the source's gives the source the target's tone and shading while
        it keeps its own detail."""
        ...

    def multiband(self, fg: F32, bg: npt.NDArray[np.uint8], mask: F32) -> F32:
        """Multi-band blend of (H, W, 3) ``fg`` into ``bg`` under (H, W) ``mask``
        at :func:`~facefuse.imaging.blend.auto_levels` depth → float32 (not clipped).
        ``fg`` is the caller's to give up: it may be overwritten."""
        ...


def blur_plan(height: int, width: int, sigma: float) -> tuple[int, tuple[int, int], float]:
    """The masked blur's decimation: factor ``k``, small (w, h) and the sigma there.

    A low-pass this wide survives decimation: blur at 1/k size (σ/k ≥ 2 px) and
    upsample, so the cost stays flat as faces get larger.
    """
    k = max(1, int(sigma // 2.0))
    small = (max(1, width // k), max(1, height // k)) if k > 1 else (width, height)
    return k, small, sigma * small[0] / width


def masked_blur(image: np.ndarray, weight: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian local mean of ``image`` (H, W, C) counting only pixels with
    ``weight`` (H, W) > 0 (normalised convolution); (H, W, C) float32."""
    w: np.ndarray = weight.astype(np.float32)
    h, wd = w.shape
    k, small, s = blur_plan(h, wd, sigma)
    num_in: np.ndarray = image * each_channel(w, image.shape[2])
    if k > 1:
        num_in = cv2.resize(num_in, small, interpolation=cv2.INTER_AREA)
        w = cv2.resize(w, small, interpolation=cv2.INTER_AREA)
    num = cv2.GaussianBlur(num_in, (0, 0), s, borderType=cv2.BORDER_REFLECT)
    den = cv2.GaussianBlur(w, (0, 0), s, borderType=cv2.BORDER_REFLECT)
    out: np.ndarray = num / each_channel(np.maximum(den, 1e-4), num.shape[2])
    if k > 1:
        out = cv2.resize(out, (wd, h), interpolation=cv2.INTER_LINEAR)
    return out


def _gain(source: F32, mu_t: np.ndarray, mu_s: np.ndarray, max_gain: float) -> F32:
    gain = np.clip((mu_t + 1.0) / (mu_s + 1.0), 1.0 / max_gain, max_gain)
    return np.clip(source * gain, 0.0, 255.0).astype(np.float32)


class OpenCVPixels:
    """The reference backend: OpenCV on the CPU."""

    name = "opencv"

    def remap(self, image: npt.NDArray[np.uint8], map_x: F32, map_y: F32) -> F32:
        return remap_region(image, map_x, map_y).astype(np.float32)

    def lighting(self, source: F32, target: F32, weight: F32, sigma: float,
                 max_gain: float) -> F32:
        mu_t = masked_blur(target, weight, sigma)
        mu_s = masked_blur(source, weight, sigma)
        return _gain(source, mu_t, mu_s, max_gain)

    def multiband(self, fg: F32, bg: npt.NDArray[np.uint8], mask: F32) -> F32:
        return np.asarray(laplacian_blend(fg, bg, mask, overwrite_fg=True), np.float32)


def gaussian_taps(sigma: float) -> F32:
    """OpenCV's Gaussian kernel for a float image at ``sigma`` (size ``round(8σ+1)|1``)."""
    size = round(sigma * 8 + 1) | 1
    return np.asarray(cv2.getGaussianKernel(size, sigma), np.float32).reshape(-1)


def load_graph(name: str) -> bytes:
    """The bytes of a shipped pixel graph (``remap.onnx``, ``multiband_3.onnx`` ...)."""
    return resources.files("facefuse.imaging").joinpath("graphs", name).read_bytes()


class OnnxPixels:
    """The pixel stages as ONNX graphs run by ONNX Runtime (see the module docstring).

    Sessions are opened lazily through the session factory with ``settings``'
    providers and shared across threads. Inputs are bound on the first
    provider's device (IO binding), so on a GPU each array crosses the bus once.
    Stages the graphs cannot take (a blur kernel wider than the decimated image,
    a pyramid deeper than :data:`MAX_GRAPH_LEVELS`) run on OpenCV instead.
    """

    name = "onnx"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.device = device_of(provider_plan(settings).names[0])
        self._sessions: dict[str, ort.InferenceSession] = {}
        self._lock = threading.Lock()
        self._fallback = OpenCVPixels()

    def _run(self, graph: str, **inputs: np.ndarray) -> F32:
        session = self._sessions.get(graph)
        if session is None:
            with self._lock:
                session = self._sessions.get(graph)
                if session is None:
                    session = create_session(load_graph(graph), self.settings)
                    self._sessions[graph] = session
        names = [i.name for i in session.get_inputs()]
        out = run_bound(session, names, [inputs[n] for n in names], self.device)
        return np.asarray(out[0], np.float32)

    def remap(self, image: npt.NDArray[np.uint8], map_x: F32, map_y: F32) -> F32:
        return self._run("remap.onnx", image=image.astype(np.float32),
                         map_x=np.asarray(map_x, np.float32), map_y=np.asarray(map_y, np.float32))

    def lighting(self, source: F32, target: F32, weight: F32, sigma: float,
                 max_gain: float) -> F32:
        h, w = weight.shape
        _, small, s = blur_plan(h, w, sigma)
        taps = gaussian_taps(s)
        if len(taps) // 2 >= min(small):  # reflect padding needs a wider image
            return self._fallback.lighting(source, target, weight, sigma, max_gain)
        return self._run("lighting.onnx", source=np.asarray(source, np.float32),
                         target=np.asarray(target, np.float32),
                         weight=np.asarray(weight, np.float32), taps=taps,
                         small=np.array([small[1], small[0]], np.int64),
                         max_gain=np.array(max_gain, np.float32))

    def multiband(self, fg: F32, bg: npt.NDArray[np.uint8], mask: F32) -> F32:
        levels = auto_levels(*fg.shape[:2])
        if not 1 <= levels <= MAX_GRAPH_LEVELS or min(fg.shape[:2]) >> levels < 1:
            return self._fallback.multiband(fg, bg, mask)
        return self._run(f"multiband_{levels}.onnx", fg=np.asarray(fg, np.float32),
                         bg=bg.astype(np.float32), mask=np.clip(mask, 0, 1).astype(np.float32))


def pixel_backend(settings: Settings) -> PixelBackend:
    """The backend ``settings.pixel_backend`` names (``auto``: ONNX on a GPU provider)."""
    choice = settings.pixel_backend
    if choice == "auto":
        choice = "onnx" if provider_plan(settings).gpu else "opencv"
    return OnnxPixels(settings) if choice == "onnx" else OpenCVPixels()


__all__ = ["OnnxPixels", "OpenCVPixels", "PixelBackend", "masked_blur", "pixel_backend"]
