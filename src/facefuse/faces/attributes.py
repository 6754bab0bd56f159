"""Age and gender from dlib-style face chips (Cydral's CC0 networks).

Both models take RGB chips aligned like dlib's ``get_face_chip`` with padding
0.2 (64 px for age, 32 px for gender), normalised ``(pixel - mean) / 256`` per
channel, and return softmax probabilities.
"""

from __future__ import annotations

import numpy as np

from facefuse.faces.align import dlib_chip_transform, warp_chip
from facefuse.runtime.manifest import ModelSpec
from facefuse.runtime.registry import ModelEntry


def attribute_chip(image: np.ndarray, landmarks: np.ndarray, model: ModelEntry) -> np.ndarray:
    """The model input of one face: (3, S, S) float32 normalised chip (S from the spec)."""
    pre = model.spec.preprocessing
    size = pre.size[0]
    padding = float(model.spec.extra.get("chip_padding", 0.2))
    M = dlib_chip_transform(landmarks, size=size, padding=padding)
    chip = warp_chip(image, M, size).astype(np.float32)
    x = (chip - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def read_age(probs: np.ndarray, spec: ModelSpec) -> float:
    """Expected age in years: the probability-weighted mean of the 81 age classes."""
    weights = np.asarray(spec.extra["age_weights"], np.float32)
    return float(np.dot(np.reshape(probs, -1).astype(np.float32), weights))


def read_gender(probs: np.ndarray, spec: ModelSpec) -> tuple[str, float]:
    """(label, probability) with labels from the manifest (``female``, ``male``)."""
    p = np.reshape(probs, -1)
    labels = list(spec.extra.get("labels", ["female", "male"]))
    i = int(np.argmax(p))
    return str(labels[i]), float(p[i])
