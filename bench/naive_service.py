"""A naive baseline of the fusion service, for bench/naive_vs_facefuse.py (bench only:
needs torch and onnx2torch, ``make bench-gpu-deps``).

The same pipeline as a straightforward service would run it: one FastAPI endpoint,
``POST /v1/fuse`` with the same form fields (``source``, ``target``, ``degree``), a
JPEG out with the ``X-Facefuse-Identity-Similarity`` header, as ``facefuse serve``
answers by default.

Kept the same as ``facefuse serve`` (facefuse's own code, so the comparison is about
how the pipeline is served, not about a different algorithm): image decoding with
its limits, the stages (detect with its tiling, mesh + iris, embed), face selection,
the classic fusion on OpenCV, the similarity from one recogniser call at the
rendered mesh, and the output policy (label, XMP) encoding JPEG at quality 92.

What differs, on purpose:

1. models: the same ONNX files converted with onnx2torch and run in PyTorch eager
   FP32 on the CPU (``--torch-threads`` intra-op threads per worker, default 1:
   torch's own default, one per core in every worker, ran 10-30× slower on a shared
   2-core machine), instead of ONNX Runtime sessions (the product's threads and
   memory options);
2. no cross-request micro-batching: each request's model calls run on their own (a
   stage's items of one request are stacked into one call, as the library does);
3. no caches: no L1 of analyses, no L2 of results;
4. whole-frame processing: the rendered face layer is padded to the full target
   frame and the multi-band blend runs over the whole image, not the face region;
5. one request at a time per worker (a lock around the pipeline); ``--workers``
   uvicorn processes, each loading its own models;
6. none of the server's admission control, memory budget, upload guard, metrics;
7. the age and gender models are not loaded (facefuse loads them; /v1/fuse does not
   run them at default settings, and onnx2torch cannot convert them).

    .venv/bin/python bench/naive_service.py --port 8100 [--workers 2] [--torch-threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
from pathlib import Path

import numpy as np
import torch
from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse, PlainTextResponse, Response

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.errors import FacefuseError
from facefuse.faces import stages
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.types import Face
from facefuse.fusion.carry import Carried
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.mapping import MappedFace
from facefuse.fusion.quality import identity_similarity
from facefuse.fusion.select import IdentityNeeds, select
from facefuse.fusion.swappers.base import FaceLayer, Swapper
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.output import OutputPolicy
from facefuse.runtime.manifest import ModelSpec, verify_file
from facefuse.runtime.registry import LoadedModel, ModelRegistry
from torch_graphs import TorchRunner, torch_model

JPEG_QUALITY = 92  # the server's default for /v1/fuse
THREADS_ENV = "NAIVE_TORCH_THREADS"  # how main() tells the worker processes


#: Loaded by facefuse but never run by ``/v1/fuse`` at default settings (attributes
#: off); onnx2torch cannot convert them (opset 18 Pad), so the baseline leaves them out.
UNUSED = frozenset({"age", "gender"})


class TorchRegistry(ModelRegistry):
    """The model registry with every model converted to a PyTorch eager FP32 module."""

    def has(self, name: str) -> bool:
        return name not in UNUSED and super().has(name)

    def _load(self, spec: ModelSpec) -> LoadedModel:
        path = verify_file(self.models_dir, spec)
        runner = TorchRunner(spec, torch_model(path, "cpu"), "cpu", torch.float32)
        return runner  # type: ignore[return-value]  # spec + run is all the stages use


def padded(part: np.ndarray, region: tuple[int, int, int, int], shape: tuple[int, int],
           fill: np.ndarray | None = None) -> np.ndarray:
    """``part`` (h, w[, c]) placed at ``region`` of a full frame of ``shape`` (H, W),
    over ``fill`` (H, W[, c]) or zeros."""
    x0, y0, x1, y1 = region
    out = (np.array(fill, np.float32) if fill is not None
           else np.zeros((*shape, *part.shape[2:]), np.float32))
    out[y0:y1, x0:x1] = part
    return out


@dataclasses.dataclass
class WholeFrame:
    """A swapper whose layers cover the whole target frame (the face layer padded with
    the target's own pixels, the masks with zeros), so blending runs over every pixel."""

    inner: Swapper

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def needs_source_embedding(self) -> bool:
        return self.inner.needs_source_embedding

    @property
    def fork_safe(self) -> bool:
        return self.inner.fork_safe

    def render(self, source_rgb: np.ndarray, source_face: Face, target_rgb: np.ndarray,
               target_face: Face, options: FuseOptions,
               carried: Carried | None = None) -> FaceLayer:
        layer = self.inner.render(source_rgb, source_face, target_rgb, target_face, options,
                                  carried)
        shape = target_rgb.shape[:2]
        keep = None if layer.keep is None else padded(layer.keep, layer.region, shape)
        return FaceLayer((0, 0, shape[1], shape[0]),
                         padded(layer.face, layer.region, shape, target_rgb),
                         padded(layer.mask, layer.region, shape), layer.landmarks, keep)

    def carry(self, target_rgb: np.ndarray, target_face: Face, options: FuseOptions,
              source_face: Face | None = None) -> Carried | None:
        """The naive loop reuses nothing between frames."""
        return None


class NaiveFusion:
    """The whole request, synchronously, one at a time: decode, analyse both images,
    select, fuse (whole frame), score, encode."""

    def __init__(self, settings: Settings) -> None:
        self.analyser = FaceAnalyser(settings, TorchRegistry(settings))
        self.fuser = FaceFuser(settings, self.analyser)
        self.fuser.swappers["classic"] = WholeFrame(self.fuser.swappers["classic"])
        self.output = OutputPolicy.from_settings(settings)
        self.lock = threading.Lock()

    def fuse(self, source: bytes, target: bytes, degree: float,
             similarity: bool = False) -> tuple[bytes, float | None]:
        """JPEG bytes of the fused image and, when ``similarity`` (off by default, as
        in facefuse), the output's identity similarity to the source."""
        options = FuseOptions(degree=degree, evaluate=False)
        needs = IdentityNeeds.of(
            options, similarity=similarity,
            source_embedding=self.fuser.swapper(options.swapper).needs_source_embedding)
        with self.lock:
            a = self.analyser
            src_rgb, tgt_rgb = a.decode(source), a.decode(target)
            src_faces = a.analyse(src_rgb, embed=needs.source)
            tgt_faces = a.analyse(tgt_rgb, embed=needs.target)
            chosen = select([src_faces], tgt_faces, options)
            pairs = [MappedFace(0, chosen.source_face, i) for i in chosen.targets]
            result = self.fuser.fuse_mapped([src_rgb], pairs, tgt_rgb, tgt_faces, options)
            sim = None
            first = result.fused[0] if result.fused else None
            if similarity and first is not None and first.landmarks is not None:
                out_face = a.run(stages.embed_at(a.models.recognizer, result.image,
                                                 first.target_face, first.landmarks))
                sim = identity_similarity(out_face, chosen.source_face)
            return self.output.encode(result.image, "jpeg", JPEG_QUALITY), sim


def create_app() -> FastAPI:
    """The naive app (models loaded before it answers; FACEFUSE_* settings apply)."""
    torch.set_num_threads(int(os.environ.get(THREADS_ENV, "1")))
    naive = NaiveFusion(Settings.from_env(precision="fp32"))
    app = FastAPI(title="naive baseline")

    @app.exception_handler(FacefuseError)
    async def typed_error(_: Request, exc: FacefuseError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)

    @app.get("/readyz")
    def readyz() -> dict[str, str]:
        return {"status": "ready"}

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
        return ""  # no metrics: present so the closed-loop driver can poll it

    @app.post("/v1/fuse")
    def fuse(source: UploadFile = File(...), target: UploadFile = File(...),  # noqa: B008
             degree: float = Form(100.0), similarity: bool = Form(False)) -> Response:
        body, sim = naive.fuse(source.file.read(), target.file.read(), degree, similarity)
        headers = {} if sim is None else {"X-Facefuse-Identity-Similarity": f"{sim:.6f}"}
        return Response(body, media_type="image/jpeg", headers=headers)

    return app


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--torch-threads", type=int, default=1)
    args = ap.parse_args(argv)
    os.environ[THREADS_ENV] = str(args.torch_threads)
    # uvicorn's own command line, as a plain deployment runs it: with several workers
    # its supervisor process stays small (it never imports the app, torch or models).
    os.execv(sys.executable, [
        sys.executable, "-m", "uvicorn", "naive_service:create_app", "--factory",
        "--host", args.host, "--port", str(args.port), "--workers", str(args.workers),
        "--app-dir", str(Path(__file__).resolve().parent), "--log-level", "warning"])


if __name__ == "__main__":
    sys.exit(main())
