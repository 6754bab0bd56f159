"""Quality figures of a fused face, computed on the output image.

* ``id_sim_source`` / ``id_sim_target``: cosine similarity of the output's
  identity embedding to the source's and the target's;
* ``yaw_diff`` / ``pitch_diff`` / ``roll_diff``: head-pose difference output vs
  target in degrees (absolute), from the meshes' expression-stable points;
* ``mouth_diff`` / ``eye_diff``: openness ratio differences output vs target;
* ``seam_energy_output`` / ``seam_energy_target`` / ``seam_ratio``: mean
  squared gradient magnitude in the mask's transition band, output vs target;
* ``source_yaw_diff`` / ``source_pitch_diff``: head-pose difference source vs
  target in degrees (absolute): how far the fusion had to turn the source;
* ``visible_fraction``: the share of the target face's area whose source surface
  the source photo shows well (:func:`facefuse.fusion.visibility.visible_fraction`),
  1 for matching poses.

The measurements on synthetic variants (occluder survival and leak, the lighting
gradient left, the boundary tone ΔE) are the toolchain's:
:mod:`facefuse.toolchain.measures`.
"""

from __future__ import annotations

import cv2
import numpy as np

from facefuse.faces.recognizer import cosine_similarity
from facefuse.faces.types import Face
from facefuse.fusion.geometry import openness, relative_pose
from facefuse.fusion.mask import boundary_band
from facefuse.fusion.visibility import visible_fraction


def identity_similarity(face: Face, source: Face) -> float | None:
    """Cosine similarity of two faces' identity embeddings; None when either has none."""
    if face.embedding is None or source.embedding is None:
        return None
    return float(cosine_similarity(face.embedding, source.embedding))


def gradient_energy(rgb: np.ndarray, band: np.ndarray) -> float:
    """Mean squared Sobel gradient magnitude of the grey image over ``band`` (bool)."""
    grey = cv2.cvtColor(np.ascontiguousarray(rgb.astype(np.uint8)), cv2.COLOR_RGB2GRAY)
    g = grey.astype(np.float32)
    gx = cv2.Sobel(g, cv2.CV_32F, 1, 0, ksize=3)
    gy = cv2.Sobel(g, cv2.CV_32F, 0, 1, ksize=3)
    e = gx**2 + gy**2
    return float(e[band].mean()) if band.any() else 0.0


def seam_scores(
    output: np.ndarray, target: np.ndarray, mask: np.ndarray, region: tuple[int, int, int, int]
) -> dict[str, float]:
    """Gradient energy along the mask boundary, output vs target (same region)."""
    x0, y0, x1, y1 = region
    band = boundary_band(mask)
    out_e = gradient_energy(output[y0:y1, x0:x1], band)
    tgt_e = gradient_energy(target[y0:y1, x0:x1], band)
    return {
        "seam_energy_output": out_e,
        "seam_energy_target": tgt_e,
        "seam_ratio": out_e / tgt_e if tgt_e > 0 else 1.0,
    }


def compare_faces(output_face: Face, source_face: Face, target_face: Face) -> dict[str, float]:
    """Identity, pose and expression figures of ``output_face`` (analysed on the output)."""
    q: dict[str, float] = {}
    for name, other in (("id_sim_source", source_face), ("id_sim_target", target_face)):
        sim = identity_similarity(output_face, other)
        if sim is not None:
            q[name] = sim
    if output_face.landmarks is not None and target_face.landmarks is not None:
        yaw, pitch, roll = relative_pose(target_face.landmarks, output_face.landmarks)
        q["yaw_diff"], q["pitch_diff"], q["roll_diff"] = abs(yaw), abs(pitch), abs(roll)
        o, t = openness(output_face.landmarks), openness(target_face.landmarks)
        q["mouth_diff"] = abs(o["mouth"] - t["mouth"])
        q["eye_diff"] = max(abs(o["eye_image_left"] - t["eye_image_left"]),
                            abs(o["eye_image_right"] - t["eye_image_right"]))
    if source_face.landmarks is not None and target_face.landmarks is not None:
        yaw, pitch, _ = relative_pose(source_face.landmarks, target_face.landmarks)
        q["source_yaw_diff"], q["source_pitch_diff"] = abs(yaw), abs(pitch)
        q["visible_fraction"] = visible_fraction(source_face.landmarks, target_face.landmarks)
    return q
