"""Age and gender from dlib-style face chips (Cydral's CC0 networks).

Both models take RGB chips aligned like dlib's ``get_face_chip`` with padding
0.2 (64 px for age, 32 px for gender), normalised ``(pixel - mean) / 256`` per
channel, and return softmax probabilities.
"""

from __future__ import annotations

import numpy as np

from facefuse.faces.align import dlib_chip_transform, warp_chip
from facefuse.runtime.registry import LoadedModel


def _chip_tensor(image: np.ndarray, landmarks: np.ndarray, model: LoadedModel) -> np.ndarray:
    pre = model.spec.preprocessing
    size = pre.size[0]
    padding = float(model.spec.extra.get("chip_padding", 0.2))
    M = dlib_chip_transform(landmarks, size=size, padding=padding)
    chip = warp_chip(image, M, size).astype(np.float32)
    x = (chip - np.asarray(pre.mean, np.float32)) / np.asarray(pre.std, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def estimate_age(image: np.ndarray, landmarks: np.ndarray, model: LoadedModel) -> float:
    """Expected age in years: the probability-weighted mean of the 81 age classes."""
    probs = model.run(_chip_tensor(image, landmarks, model))[0][0]
    weights = np.asarray(model.spec.extra["age_weights"], np.float32)
    return float(np.dot(probs.astype(np.float32), weights))


def estimate_gender(
    image: np.ndarray, landmarks: np.ndarray, model: LoadedModel
) -> tuple[str, float]:
    """(label, probability) with labels from the manifest (``female``, ``male``)."""
    probs = model.run(_chip_tensor(image, landmarks, model))[0][0]
    labels = list(model.spec.extra.get("labels", ["female", "male"]))
    i = int(np.argmax(probs))
    return str(labels[i]), float(probs[i])
