"""The accuracy gate: a quantized model that fails is refused, never merely warned about.

Figures compare the quantized model with its FP32 base on the same evaluation
inputs (disjoint from calibration). Thresholds:

* recognizer: cosine(FP32, INT8) of the embeddings, mean ≥ 0.995 and minimum
  ≥ 0.98; same/different decisions at the configured Euclidean threshold agree
  on ≥ 99.7 % of evaluation pairs;
* detector: the same faces found — every FP32 face matched one-to-one by a
  quantized face with IoU ≥ 0.9 and no extra face — and keypoint error ≤ 1 %
  of the face width (mean over faces of the mean keypoint distance / FP32 box width);
* mesh (and iris): mean landmark error against FP32 ≤ 1 % of the inter-ocular
  distance (mean over faces);
* end to end: the fused output's identity similarity to the source within
  0.01 of the FP32 pipeline's (every fused pair).

Every function here is pure: arrays in, a figures dict out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Thresholds:
    """The gate's limits (see the module docstring)."""

    embed_cos_mean: float = 0.995
    embed_cos_min: float = 0.98
    embed_decision_agreement: float = 0.997
    detect_iou: float = 0.9
    detect_kp_err: float = 0.01
    mesh_err: float = 0.01
    e2e_id_sim_diff: float = 0.01


THRESHOLDS = Thresholds()


@dataclass
class GateResult:
    """The verdict on one model (or the end-to-end pipeline)."""

    subject: str
    figures: dict[str, Any]
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        return f"{self.subject}: {status}" + ("" if self.passed else " — " + "; ".join(
            self.failures))


def _need(failures: list[str], ok: bool, text: str) -> None:
    if not ok:
        failures.append(text)


# -- recognizer ----------------------------------------------------------------------------


def _unit(v: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return np.asarray(v / np.where(n > 0, n, 1.0), np.float64)


def recognizer_figures(
    ref: np.ndarray, test: np.ndarray, identities: Sequence[str], threshold: float
) -> dict[str, Any]:
    """Figures of quantized vs FP32 embeddings.

    Args:
        ref, test: (N, D) raw embeddings of the same N chips, FP32 and quantized.
        identities: (N,) person of each chip; pairs are all ``i < j``.
        threshold: same-person Euclidean distance on raw embeddings (dlib: 0.6).
    """
    ref = np.asarray(ref, np.float64)
    test = np.asarray(test, np.float64)
    if ref.shape != test.shape or ref.ndim != 2 or len(ref) < 2:
        raise ValueError(f"need two (N, D) arrays with N >= 2, got {ref.shape} and {test.shape}")
    cos = np.sum(_unit(ref) * _unit(test), axis=1)
    ids = np.asarray(identities)
    iu, ju = np.triu_indices(len(ref), k=1)
    d_ref = np.linalg.norm(ref[iu] - ref[ju], axis=1)
    d_test = np.linalg.norm(test[iu] - test[ju], axis=1)
    same_ref = d_ref < threshold
    same_test = d_test < threshold
    truth = ids[iu] == ids[ju]
    agree = same_ref == same_test
    return {
        "chips": len(ref),
        "pairs": len(iu),
        "pairs_same_identity": int(truth.sum()),
        "cos_mean": float(cos.mean()),
        "cos_min": float(cos.min()),
        "decision_agreement": float(agree.mean()),
        "decisions_flipped": int((~agree).sum()),
        "distance_abs_diff_max": float(np.abs(d_ref - d_test).max()),
        "threshold": float(threshold),
        # How the two models do against the identity labels (context, not gated).
        "accuracy_fp32": float((same_ref == truth).mean()),
        "accuracy_quantized": float((same_test == truth).mean()),
    }


def check_recognizer(fig: Mapping[str, Any], t: Thresholds = THRESHOLDS) -> list[str]:
    failures: list[str] = []
    _need(failures, fig["cos_mean"] >= t.embed_cos_mean,
          f"embedding cosine mean {fig['cos_mean']:.5f} < {t.embed_cos_mean}")
    _need(failures, fig["cos_min"] >= t.embed_cos_min,
          f"embedding cosine min {fig['cos_min']:.5f} < {t.embed_cos_min}")
    _need(failures, fig["decision_agreement"] >= t.embed_decision_agreement,
          f"same/different decisions agree on {fig['decision_agreement']:.4%} of "
          f"{fig['pairs']} pairs < {t.embed_decision_agreement:.1%}")
    return failures


# -- detector ------------------------------------------------------------------------------


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of boxes a (K, 4) and b (L, 4), ``x0, y0, x1, y1`` → (K, L)."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    x0 = np.maximum(a[:, None, 0], b[None, :, 0])
    y0 = np.maximum(a[:, None, 1], b[None, :, 1])
    x1 = np.minimum(a[:, None, 2], b[None, :, 2])
    y1 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    return np.asarray(np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0))


def detector_figures(
    ref: Sequence[tuple[np.ndarray, np.ndarray]],
    test: Sequence[tuple[np.ndarray, np.ndarray]],
    iou_threshold: float = THRESHOLDS.detect_iou,
) -> dict[str, Any]:
    """Figures of quantized vs FP32 detections, image by image.

    Args:
        ref, test: per image ``(boxes (K, 4) pixels, keypoints (K, P, 2) pixels)``.
        iou_threshold: a quantized face matches an FP32 face at IoU ≥ this.

    Faces are matched greedily by IoU, one-to-one. The keypoint error of a
    matched face is its mean keypoint distance divided by the FP32 box width.
    """
    if len(ref) != len(test):
        raise ValueError("ref and test must cover the same images")
    n_ref = matched = extra = 0
    ious: list[float] = []
    kp_err: list[float] = []
    for (rb, rk), (tb, tk) in zip(ref, test, strict=True):
        rb = np.asarray(rb, np.float64).reshape(-1, 4)
        tb = np.asarray(tb, np.float64).reshape(-1, 4)
        n_ref += len(rb)
        if len(rb) == 0 or len(tb) == 0:
            extra += len(tb)
            continue
        iou = box_iou(rb, tb)
        used: set[int] = set()
        for i in np.argsort(-iou.max(axis=1)):
            order = [j for j in np.argsort(-iou[i]) if j not in used]
            if not order:
                continue
            j = int(order[0])
            ious.append(float(iou[i, j]))
            if iou[i, j] < iou_threshold:
                continue
            used.add(j)
            matched += 1
            width = max(float(rb[i, 2] - rb[i, 0]), 1e-6)
            d = np.linalg.norm(np.asarray(rk[i], np.float64) - np.asarray(tk[j], np.float64),
                               axis=-1)
            kp_err.append(float(d.mean()) / width)
        extra += len(tb) - len(used)
    return {
        "images": len(ref),
        "faces_fp32": n_ref,
        "faces_matched": matched,
        "faces_extra": extra,
        "iou_min": min(ious) if ious else None,
        "iou_mean": float(np.mean(ious)) if ious else None,
        "kp_err_mean": float(np.mean(kp_err)) if kp_err else None,
        "kp_err_max": max(kp_err) if kp_err else None,
    }


def check_detector(fig: Mapping[str, Any], t: Thresholds = THRESHOLDS) -> list[str]:
    failures: list[str] = []
    _need(failures, fig["faces_fp32"] > 0, "no FP32 faces in the evaluation set")
    _need(failures, fig["faces_matched"] == fig["faces_fp32"],
          f"only {fig['faces_matched']} of {fig['faces_fp32']} FP32 faces found again at "
          f"IoU >= {t.detect_iou} (lowest IoU {fig['iou_min']})")
    _need(failures, fig["faces_extra"] == 0,
          f"{fig['faces_extra']} face(s) found that FP32 does not find")
    kp = fig["kp_err_mean"]
    _need(failures, kp is not None and kp <= t.detect_kp_err,
          f"keypoint error {kp if kp is None else f'{kp:.4%}'} of face width > "
          f"{t.detect_kp_err:.0%}")
    return failures


# -- mesh / iris ---------------------------------------------------------------------------


def landmark_figures(
    ref: Sequence[np.ndarray], test: Sequence[np.ndarray], scale: Sequence[float]
) -> dict[str, Any]:
    """Mean landmark error per face relative to a per-face length.

    Args:
        ref, test: per face (P, 2) landmarks in image pixels, FP32 and quantized.
        scale: per face the normalising length in pixels (the inter-ocular distance).
    """
    if not (len(ref) == len(test) == len(scale)) or not ref:
        raise ValueError("need the same, non-zero number of faces in ref, test and scale")
    errs = [
        float(np.linalg.norm(np.asarray(r, np.float64)[:, :2] - np.asarray(q, np.float64)[:, :2],
                             axis=1).mean()) / float(s)
        for r, q, s in zip(ref, test, scale, strict=True)
    ]
    return {
        "faces": len(errs),
        "err_mean": float(np.mean(errs)),
        "err_p95": float(np.percentile(errs, 95)),
        "err_max": float(np.max(errs)),
        "unit": "fraction of inter-ocular distance",
    }


def check_landmarks(fig: Mapping[str, Any], t: Thresholds = THRESHOLDS) -> list[str]:
    failures: list[str] = []
    _need(failures, fig["err_mean"] <= t.mesh_err,
          f"mean landmark error {fig['err_mean']:.4%} of inter-ocular distance > "
          f"{t.mesh_err:.0%}")
    return failures


# -- end to end ----------------------------------------------------------------------------


def e2e_figures(ref: Sequence[float], test: Sequence[float]) -> dict[str, Any]:
    """Fused-output identity similarity to the source, FP32 pipeline vs quantized, per pair."""
    if len(ref) != len(test) or not ref:
        raise ValueError("need the same, non-zero number of fused pairs")
    diff = np.abs(np.asarray(ref, np.float64) - np.asarray(test, np.float64))
    return {
        "pairs": len(ref),
        "id_sim_fp32": [round(float(v), 5) for v in ref],
        "id_sim_quantized": [round(float(v), 5) for v in test],
        "id_sim_abs_diff_max": float(diff.max()),
        "id_sim_abs_diff_mean": float(diff.mean()),
    }


def check_e2e(fig: Mapping[str, Any], t: Thresholds = THRESHOLDS) -> list[str]:
    failures: list[str] = []
    _need(failures, fig["id_sim_abs_diff_max"] <= t.e2e_id_sim_diff,
          f"fused identity similarity differs from FP32 by up to "
          f"{fig['id_sim_abs_diff_max']:.4f} > {t.e2e_id_sim_diff}")
    return failures


CHECKS = {
    "embed": check_recognizer,
    "detect": check_detector,
    "mesh": check_landmarks,
    "iris": check_landmarks,
    "e2e": check_e2e,
}


def judge(subject: str, task: str, figures: dict[str, Any],
          t: Thresholds = THRESHOLDS) -> GateResult:
    """Apply the thresholds of ``task`` (embed, detect, mesh, iris, e2e) to ``figures``."""
    return GateResult(subject, figures, CHECKS[task](figures, t))
