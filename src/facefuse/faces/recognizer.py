"""Face identity embeddings with dlib's ResNet, converted to ONNX.

The model takes 150×150 RGB chips cut like ``dlib.get_face_chip`` (see
:func:`facefuse.faces.align.dlib_chip_transform` and
:func:`~facefuse.faces.align.warp_chip`) and returns dlib's raw 128-D
descriptor: two photos show the same person when the Euclidean distance of
their raw descriptors is below 0.6 (dlib's threshold). The per-channel mean
and ``/256`` scaling live inside the graph, so the input is plain pixels.
"""

from __future__ import annotations

import numpy as np

from facefuse.errors import InvalidArgumentError
from facefuse.runtime.registry import LoadedModel, ModelEntry

CHIP_SIZE = 150
EMBEDDING_DIMS = 128


class Recognizer:
    """Wraps the ``dlib_resnet`` model (input ``[N, 3, 150, 150]`` RGB 0..255,
    output ``[N, 128]`` raw descriptors).

    :meth:`preprocess` and :meth:`run` are separate so a micro-batcher can stack
    chips of many requests into one model run; :meth:`embed_chips` does both.
    ``model`` may be the manifest entry alone (a
    :class:`~facefuse.runtime.registry.DeferredModel`): the stages then run it through
    their driver's registry, which loads it on its first embedding; :meth:`run` and
    :meth:`embed_chips` need it loaded.
    """

    def __init__(self, model: ModelEntry) -> None:
        self.model = model
        size = model.spec.preprocessing.size
        self.size = int(size[0]) if size else CHIP_SIZE

    def preprocess(self, chip: np.ndarray) -> np.ndarray:
        """A (150, 150, 3) uint8 RGB chip → (3, 150, 150) float32 pixel values 0..255.

        A stack (N, 150, 150, 3) gives (N, 3, 150, 150).
        """
        c = np.asarray(chip)
        if c.shape[-3:] != (self.size, self.size, 3) or c.ndim not in (3, 4) or c.dtype != np.uint8:
            raise InvalidArgumentError(
                f"expected ({self.size}, {self.size}, 3) uint8 RGB chip(s), got {c.dtype} {c.shape}"
            )
        axes = (2, 0, 1) if c.ndim == 3 else (0, 3, 1, 2)
        out: np.ndarray = np.ascontiguousarray(c.transpose(axes), dtype=np.float32)
        return out

    def run(self, batch: np.ndarray) -> np.ndarray:
        """(N, 3, 150, 150) float32 → (N, 128) float32 raw descriptors."""
        x = np.ascontiguousarray(batch, dtype=np.float32)
        if x.ndim != 4 or x.shape[1:] != (3, self.size, self.size):
            raise InvalidArgumentError(f"expected (N, 3, {self.size}, {self.size}), got {x.shape}")
        if len(x) == 0:
            return np.zeros((0, EMBEDDING_DIMS), np.float32)
        if not isinstance(self.model, LoadedModel):
            raise TypeError("this Recognizer holds the model's entry only: run it through "
                            "the registry (stages.embed), or give it a loaded model")
        return self.model.run(x)[0].astype(np.float32, copy=False)

    def embed_chips(self, chips: np.ndarray) -> np.ndarray:
        """(N, 150, 150, 3) uint8 RGB chips → (N, 128) float32 raw descriptors."""
        c = np.asarray(chips)
        if c.ndim == 3:
            c = c[None]
        if len(c) == 0:
            return np.zeros((0, EMBEDDING_DIMS), np.float32)
        return self.run(self.preprocess(c))


def normalize(v: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Unit-length vector(s) along the last axis (float32); zero vectors stay zero."""
    a = np.asarray(v, np.float32)
    n = np.linalg.norm(a, axis=-1, keepdims=True)
    out: np.ndarray = (a / np.maximum(n, eps)).astype(np.float32)
    return out


def distance(a: np.ndarray, b: np.ndarray) -> np.ndarray | float:
    """Euclidean distance between raw descriptors (broadcast over leading axes).

    dlib's rule: the same person below 0.6. Returns a float for two vectors.
    """
    d = np.linalg.norm(np.asarray(a, np.float64) - np.asarray(b, np.float64), axis=-1)
    return float(d) if np.ndim(d) == 0 else d


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray | float:
    """Cosine similarity in [-1, 1] (broadcast over leading axes)."""
    s = np.sum(normalize(a).astype(np.float64) * normalize(b).astype(np.float64), axis=-1)
    return float(s) if np.ndim(s) == 0 else s
