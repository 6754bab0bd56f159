"""Run FP32 and candidate models on the evaluation data and apply the gate.

:class:`Evaluator` caches the FP32 outputs once and judges any number of
candidates (INT8 formats × calibration methods, FP16) of the same model
against them. :func:`end_to_end` fuses sample pairs with the FP32 pipeline and
with the candidates swapped in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.faces.detectors import detector_of_model
from facefuse.faces.landmarker import project
from facefuse.fusion.engine import FaceFuser
from facefuse.runtime.files import sha256_file
from facefuse.runtime.manifest import ModelSpec
from facefuse.runtime.registry import LoadedModel, ModelRegistry
from facefuse.runtime.session import create_session
from facefuse.toolchain.quantize.calibration import MODEL_TASKS, StageData
from facefuse.toolchain.quantize.gate import (
    THRESHOLDS,
    GateResult,
    Thresholds,
    detector_figures,
    e2e_figures,
    judge,
    landmark_figures,
    recognizer_figures,
)

#: (source, target) sample pairs fused by the end-to-end gate.
E2E_PAIRS: tuple[tuple[str, str], ...] = (
    ("obama", "biden"),
    ("biden", "obama2"),
    ("astronaut", "obama3"),
)


def variant_spec(base: ModelSpec, path: Path, precision: str,
                 extra: Mapping[str, Any] | None = None) -> ModelSpec:
    """The manifest entry of a derived model file ``path`` (``<base>.<precision>``).

    Inputs, outputs, preprocessing, source and licence are the base's (the
    variants keep FP32 IO); ``extra`` is the base's plus ``extra``; opset,
    size and sha256 are the file's own.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=base.opset)
    names = ([i.name for i in model.graph.input], [o.name for o in model.graph.output])
    want = ([t.name for t in base.inputs], [t.name for t in base.outputs])
    if not set(want[0]) <= set(names[0]) or want[1] != names[1]:
        raise ValueError(f"{path.name} has IO {names}, but {base.name} declares {want}")
    return dataclasses.replace(
        base,
        name=f"{base.name}.{precision}",
        file=path.name,
        sha256=sha256_file(path),
        size=path.stat().st_size,
        opset=opset,
        precision=precision,
        base=base.name,
        extra={**base.extra, **(extra or {})},
    )


def load_candidate(base: ModelSpec, path: Path, settings: Settings,
                   precision: str) -> LoadedModel:
    """Open a candidate model file through the project's session factory."""
    session = create_session(path, settings)
    return LoadedModel(spec=variant_spec(base, path, precision), session=session, path=path)


def run_batched(model: LoadedModel, tensors: np.ndarray, batch: int = 16) -> list[np.ndarray]:
    """All outputs of ``model`` over (N, ...) ``tensors``, run ``batch`` at a time."""
    parts: list[list[np.ndarray]] = []
    for i in range(0, len(tensors), batch):
        parts.append(model.run(np.ascontiguousarray(tensors[i : i + batch], np.float32)))
    return [np.concatenate([p[k] for p in parts]) for k in range(len(parts[0]))]


class Evaluator:
    """Gate figures of candidates against the FP32 models on one evaluation set.

    Args:
        data: the evaluation :class:`StageData` (disjoint from calibration).
        fp32: the FP32 models by name.
        settings: for detector thresholds and the same-person distance.
    """

    def __init__(self, data: StageData, fp32: Mapping[str, LoadedModel],
                 settings: Settings, thresholds: Thresholds = THRESHOLDS) -> None:
        self.data = data
        self.fp32 = dict(fp32)
        self.settings = settings
        self.thresholds = thresholds
        self._ref: dict[str, Any] = {}

    def _outputs(self, name: str, model: LoadedModel) -> Any:
        task = MODEL_TASKS[name]
        if task == "detect":
            return self._detections(name, model)
        if task == "mesh":
            raw = run_batched(model, self.data.tensors(name))[0]
            return [project(r, it.M)[:, :2] for r, it in zip(raw, self.data.mesh, strict=True)]
        if task == "iris":
            contours, iris = run_batched(model, self.data.tensors(name))[:2]
            pts = np.concatenate([contours, iris], axis=1)
            return [project(r, it.M)[:, :2] for r, it in zip(pts, self.data.iris, strict=True)]
        return run_batched(model, self.data.tensors(name))[0]

    def _detections(self, name: str, model: LoadedModel) -> list[tuple[np.ndarray, np.ndarray]]:
        det = detector_of_model(model, self.settings)
        out: list[tuple[np.ndarray, np.ndarray]] = []
        for item in self.data.detect[name]:
            regs, scores = model.run(np.ascontiguousarray(item.tensors, np.float32))[:2]
            found = det.postprocess(regs, scores, item.transforms)
            boxes = np.array([d.bbox for d in found], np.float64).reshape(-1, 4)
            kps = np.array([d.keypoints for d in found], np.float64).reshape(len(found), -1, 2)
            out.append((boxes, kps))
        return out

    def reference(self, name: str) -> Any:
        if name not in self._ref:
            self._ref[name] = self._outputs(name, self.fp32[name])
        return self._ref[name]

    def figures(self, name: str, candidate: LoadedModel) -> dict[str, Any]:
        """The gate figures of ``candidate`` (a variant of ``name``)."""
        ref = self.reference(name)
        test = self._outputs(name, candidate)
        task = MODEL_TASKS[name]
        if task == "detect":
            return detector_figures(ref, test, self.thresholds.detect_iou)
        if task in ("mesh", "iris"):
            items = self.data.mesh if task == "mesh" else self.data.iris
            return landmark_figures(ref, test, [it.iod for it in items])
        ids = [it.identity for it in self.data.embed]
        return recognizer_figures(ref, test, ids, self.settings.same_person_distance)

    def judge(self, name: str, candidate: LoadedModel) -> GateResult:
        """Figures and verdict of ``candidate``."""
        fig = self.figures(name, candidate)
        return judge(candidate.spec.name, MODEL_TASKS[name], fig, self.thresholds)


class OverlayRegistry(ModelRegistry):
    """A registry in which some base names resolve to given (candidate) models."""

    def __init__(self, settings: Settings, overrides: Mapping[str, LoadedModel]) -> None:
        super().__init__(settings)
        self.overrides = dict(overrides)

    def get(self, name: str) -> LoadedModel:
        model = self.overrides.get(name)
        return model if model is not None else super().get(name)


def fused_identity(fuser: FaceFuser, photos: Mapping[str, Path],
                   pairs: Sequence[tuple[str, str]]) -> list[float]:
    """``id_sim_source`` of the fused output of each (source, target) pair."""
    out: list[float] = []
    for src, tgt in pairs:
        result = fuser.fuse(photos[src], photos[tgt])
        out.append(float(result.fused[0].quality["id_sim_source"]))
    return out


def end_to_end(
    settings: Settings,
    candidates: Mapping[str, LoadedModel],
    photos: Mapping[str, Path],
    pairs: Sequence[tuple[str, str]] = E2E_PAIRS,
    thresholds: Thresholds = THRESHOLDS,
    subject: str = "end-to-end",
) -> GateResult:
    """Fuse ``pairs`` with the FP32 pipeline and with ``candidates`` swapped in; judge.

    ``settings.precision`` is forced to fp32 for everything that is not a candidate.
    """

    fp32_settings = settings.replace(precision="fp32")
    pairs = [(s, t) for s, t in pairs if s in photos and t in photos]
    ref_fuser = FaceFuser(fp32_settings,
                          analyser=FaceAnalyser(fp32_settings, ModelRegistry(fp32_settings)))
    test_fuser = FaceFuser(fp32_settings, analyser=FaceAnalyser(
        fp32_settings, OverlayRegistry(fp32_settings, candidates)))
    ref = fused_identity(ref_fuser, photos, pairs)
    test = fused_identity(test_fuser, photos, pairs)
    fig = e2e_figures(ref, test)
    fig["pairs_fused"] = [f"{s}->{t}" for s, t in pairs]
    fig["models"] = sorted(m.spec.name for m in candidates.values())
    return judge(subject, "e2e", fig, thresholds)
