"""The neural swapper plug-in: inswapper-style ONNX face-swap models from the manifest.

A user drops a face-swap model into the model directory and declares it in
``manifest.json`` with ``task: "swap"``; :func:`~facefuse.fusion.swappers.build_swappers`
makes every such entry an :class:`OnnxSwapper` under the entry's name
(``facefuse fuse --swapper NAME``). The contract (see ``docs/swappers.md``):

* inputs, in manifest order: ``target`` ``[N, 3, S, S]`` float32 — the target
  face aligned to ``extra.template`` and normalised by ``preprocessing``
  (``(pixel - mean) / std`` per channel, in ``color`` order, NCHW) — and
  ``source`` ``[N, D]`` float32 — the source identity latent;
* output ``[N, 3, S, S]`` float32, the swapped crop in the same colour order,
  in ``extra.output_range`` (``0..1`` or ``-1..1``);
* ``extra.recognizer`` names the registry model whose embedding of the source
  face makes the latent (``extra.latent``: ``embedding`` = its raw vector,
  ``normalized`` = unit length), optionally projected by a (D_in, D) matrix
  ``P`` and re-normalised (``latent = v @ P / |v @ P|``, as inswapper does with
  its ``emap``). ``extra.projection`` is ``initializer:last`` (the model's last
  graph initializer) or ``file:<name>.npy`` (a file in the model directory).

Rendering: the target face is cropped with a similarity to the template, run
through the model, and the output crop is warped back by the inverse affine into
the face region, masked by the same feathered face oval as the classic swapper
times a feathered crop-validity mask; ``degree`` mixes it with the target:
``face = target + texture_weight × (swapped − target)``. The swap model keeps the
target's geometry, so the ``shape`` weight has no effect here.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from facefuse.errors import InvalidArgumentError, ModelCorruptError, ModelMissingError
from facefuse.faces.recognizer import normalize
from facefuse.faces.types import Face
from facefuse.fusion import mask as masks
from facefuse.fusion.carry import Carried
from facefuse.fusion.swappers.base import FaceLayer
from facefuse.fusion.swappers.onnx.contract import (
    ANALYSER_RECOGNIZER,
    DLIB_TEMPLATE,
    EMBED_TASK,
    TEMPLATES,
    SwapContract,
    breach,
    check_session,
    parse_contract,
    static_dim,
)
from facefuse.fusion.swappers.onnx.crop import (
    align_transform,
    crop_face,
    from_tensor,
    paste_back,
    project_latent,
    to_tensor,
)
from facefuse.fusion.types import FuseOptions
from facefuse.runtime.files import sha256_file
from facefuse.runtime.onnx_file import last_initializer
from facefuse.runtime.registry import LoadedModel, ModelRegistry

__all__ = ["OnnxSwapper", "recognizer_embedding"]

# ----------------------------------------------------------------------------------------
# The swapper
# ----------------------------------------------------------------------------------------


#: Source embeddings an ONNX swapper keeps (faces are immutable and shared, so
#: the cache lives here, keyed by the face's mesh and image size).
EMBEDDING_CACHE_SIZE = 8


def _face_digest(rgb: np.ndarray, face: Face) -> str:
    h = hashlib.blake2b(str(rgb.shape).encode(), digest_size=16)
    h.update(np.ascontiguousarray(face.landmarks if face.landmarks is not None
                                  else face.bbox).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class _Loaded:
    contract: SwapContract
    model: LoadedModel
    projection: np.ndarray | None
    #: The recognizer model when it is not the analyser's (None: use Face.embedding).
    recognizer: LoadedModel | None


class OnnxSwapper:
    """A manifest ``task: "swap"`` model as a :class:`~facefuse.fusion.swappers.base.Swapper`.

    Nothing is loaded until the first :meth:`render`: the entry is then checked
    against the contract, the model file verified (sha256) and its session built
    through the registry. Thread-safe.
    """

    def __init__(self, registry: ModelRegistry, name: str) -> None:
        self.registry = registry
        self.name = name
        self._lock = threading.Lock()
        self._loaded: _Loaded | None = None
        self._generation = -1
        self._embeddings: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()

    def load(self) -> _Loaded:
        """Check and load the model (once per registry generation); raises typed errors."""
        loaded = self._loaded
        if loaded is not None and self._generation == self.registry.generation:
            return loaded
        with self._lock:
            if self._loaded is None or self._generation != self.registry.generation:
                generation = self.registry.generation
                self._loaded = self._load()
                self._generation = generation
            return self._loaded

    def _load(self) -> _Loaded:
        spec = self.registry.manifest.get(self.name)
        contract = parse_contract(spec)
        rec_name = contract.recognizer
        if not self.registry.has(rec_name):
            raise ModelMissingError(
                f"swap model {self.name!r} needs the recognizer {rec_name!r}, which is not in "
                "the model manifest", code="swap_recognizer_missing")
        rec_spec = self.registry.manifest.get(rec_name)
        if rec_spec.task != EMBED_TASK:
            raise breach(self.name, f"extra.recognizer {rec_name!r} is a {rec_spec.task!r} "
                                  f"model, not {EMBED_TASK!r}")
        rec_dims = static_dim(rec_spec.outputs[0].shape[-1]) if rec_spec.outputs else None
        model = self.registry.get(self.name)
        check_session(contract, spec, model)
        projection = self._projection(contract, model)
        d_in = rec_dims if projection is None else int(projection.shape[0])
        if projection is not None and rec_dims is not None and projection.shape[0] != rec_dims:
            raise breach(self.name, f"the projection is {projection.shape[0]}×{projection.shape[1]}"
                                  f" but the recognizer {rec_name!r} gives {rec_dims} values")
        d_out = contract.latent_dims if projection is None else int(projection.shape[1])
        if projection is None and d_in is not None and d_in != contract.latent_dims:
            raise breach(self.name, f"the source input takes {contract.latent_dims} values but "
                                  f"the recognizer {rec_name!r} gives {d_in} (and there is no "
                                  "projection)")
        if d_out != contract.latent_dims:
            raise breach(self.name, f"the projection gives {d_out} values but the source input "
                                  f"takes {contract.latent_dims}")
        recognizer = None if rec_name == ANALYSER_RECOGNIZER else self.registry.get(rec_name)
        return _Loaded(contract, model, projection, recognizer)

    def _projection(self, contract: SwapContract, model: LoadedModel) -> np.ndarray | None:
        p = contract.projection
        if p is None:
            return None
        if p == "initializer:last":
            mat = last_initializer(model.path)
            where = "the model's last initializer"
        else:
            path = self.registry.models_dir / p[len("file:"):]
            if not path.is_file():
                raise ModelMissingError(f"projection file {path} of swap model {self.name!r} is "
                                        "missing", code="swap_projection_missing")
            want = self.registry.manifest.get(self.name).extra.get("projection_sha256")
            if want is not None and sha256_file(path) != want:
                raise ModelCorruptError(f"projection file {path} of swap model {self.name!r} "
                                        "does not match extra.projection_sha256",
                                        code="swap_projection_corrupt")
            try:
                mat = np.load(path, allow_pickle=False)
            except (ValueError, OSError) as exc:
                raise breach(self.name, f"cannot read projection {path.name}: {exc}") from exc
            where = path.name
        if mat.ndim != 2 or not np.issubdtype(mat.dtype, np.floating) or mat.size == 0:
            raise breach(self.name, f"projection ({where}) must be a 2-D float matrix "
                                  f"(D_in, D), got {mat.dtype} {mat.shape}")
        if not np.all(np.isfinite(mat)):
            raise breach(self.name, f"projection ({where}) has non-finite values")
        return np.asarray(mat, np.float32)

    # ---- the source latent ------------------------------------------------------------

    def source_latent(self, source_rgb: np.ndarray, source_face: Face) -> np.ndarray:
        """The model's source input for this face: (1, D) float32."""
        loaded = self.load()
        c = loaded.contract
        raw = self._embedding(loaded, source_rgb, source_face)
        v = raw if c.latent == "embedding" else normalize(raw)
        return project_latent(v, loaded.projection)[None]

    def _embedding(self, loaded: _Loaded, rgb: np.ndarray, face: Face) -> np.ndarray:
        """The recognizer's raw vector for ``face`` (the last few cached: one source
        face is rendered into every chosen target face)."""
        if loaded.recognizer is None:
            raw = face.embedding_raw if face.embedding_raw is not None else face.embedding
            if raw is None:
                raise InvalidArgumentError("the source face has no embedding",
                                           code="source_no_embedding")
            return np.asarray(raw, np.float32)
        key = (loaded.contract.recognizer, _face_digest(rgb, face))
        with self._lock:
            cached = self._embeddings.get(key)
        if cached is not None:
            return cached
        vec = recognizer_embedding(loaded.recognizer, rgb, face)
        with self._lock:
            self._embeddings[key] = vec
            while len(self._embeddings) > EMBEDDING_CACHE_SIZE:
                self._embeddings.popitem(last=False)
        return vec

    # ---- rendering --------------------------------------------------------------------

    def render(
        self,
        source_rgb: np.ndarray,
        source_face: Face,
        target_rgb: np.ndarray,
        target_face: Face,
        options: FuseOptions,
        carried: Carried | None = None,
    ) -> FaceLayer:
        """The swapped face over the target face's region (see the module docstring);
        nothing is carried between frames."""
        assert target_face.landmarks is not None
        loaded = self.load()
        c = loaded.contract
        latent = self.source_latent(source_rgb, source_face)
        tgt_lm = target_face.landmarks.astype(np.float64)
        M = align_transform(tgt_lm, c.template, c.size, c.padding)
        crop = crop_face(target_rgb, M, c.size)
        out = loaded.model.run(to_tensor(crop, c.mean, c.std, c.bgr), latent)[0]
        swapped_crop = from_tensor(out, c.output_range, c.bgr)
        feather = masks.feather_px(tgt_lm)
        region = masks.face_region(tgt_lm, target_rgb.shape, 2 * feather)
        x0, y0, x1, y1 = region
        bg = target_rgb[y0:y1, x0:x1].astype(np.float32)
        swapped, valid = paste_back(swapped_crop, M, region, feather)
        # Where the crop does not reach, the layer is the target itself, so no blend
        # level ever sees the border-repeated crop edge.
        swapped = bg + valid[..., None] * (swapped - bg)
        mask = masks.oval_mask(tgt_lm, region, feather) * valid
        face = bg + np.float32(options.texture_weight) * (swapped - bg)
        return FaceLayer(region, face.astype(np.float32), mask.astype(np.float32), tgt_lm)

    def model_names(self) -> tuple[str, ...]:
        """The manifest entries its render runs: the swap model and, when its entry
        names one, the recogniser (read off the manifest; nothing is loaded)."""
        spec = self.registry.manifest.models.get(self.name)
        recognizer = spec.extra.get("recognizer") if spec is not None else None
        return (self.name, str(recognizer)) if recognizer else (self.name,)

    @property
    def needs_source_embedding(self) -> bool:
        """Yes: the source latent is made from an identity embedding (the analyser's,
        ``Face.embedding``, unless ``extra.recognizer`` names another model); known
        without loading the model, so a broken entry still fails on first use."""
        return True

    @property
    def fork_safe(self) -> bool:
        """Never: its model is an ONNX Runtime session (and may be on a GPU)."""
        return False

    def carry(self, target_rgb: np.ndarray, target_face: Face, options: FuseOptions,
              source_face: Face | None = None) -> Carried | None:
        """None: the model sees the whole face on every frame."""
        return None


def recognizer_embedding(model: LoadedModel, rgb: np.ndarray, face: Face) -> np.ndarray:
    """Raw embedding (D,) float32 of ``face`` by a registry recognizer other than dlib's.

    The chip follows the recognizer's manifest entry: ``preprocessing`` (size,
    mean, std, colour) and ``extra.template`` (default ``arcface_112`` for 112-px
    multiples, ``arcface_128`` for 128-px multiples, else ``dlib_150`` with
    ``extra.chip_padding``).
    """
    assert face.landmarks is not None
    spec = model.spec
    pre = spec.preprocessing
    size = int(pre.size[0])
    template = spec.extra.get("template")
    if template not in TEMPLATES:
        template = ("arcface_112" if size % 112 == 0 else
                    "arcface_128" if size % 128 == 0 else DLIB_TEMPLATE)
    padding = float(spec.extra.get("chip_padding", 0.25))
    M = align_transform(face.landmarks, str(template), size, padding)
    chip = crop_face(rgb, M, size)
    x = to_tensor(chip, np.asarray(pre.mean, np.float32), np.asarray(pre.std, np.float32),
                  pre.color == "BGR")
    return np.asarray(model.run(x)[0], np.float32).reshape(-1)
