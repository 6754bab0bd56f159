"""Contact sheets: source, target, the fused outputs at degrees 0, 50 and 100, and
degree 100 without relighting and occluder masks (the engine before them), for
comparison."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import cv2
import numpy as np

from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.types import FuseOptions
from facefuse.imaging.decode import ImageInput

SHEET_DEGREES = (0, 50, 100)


def _tile(rgb: np.ndarray, height: int, label: str) -> np.ndarray:
    scale = height / rgb.shape[0]
    w = max(1, round(rgb.shape[1] * scale))
    tile = cv2.resize(rgb, (w, height), interpolation=cv2.INTER_AREA)
    tile = np.ascontiguousarray(tile)
    cv2.rectangle(tile, (0, 0), (w, 26), (0, 0, 0), -1)
    cv2.putText(tile, label, (6, 19), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 255), 1,
                cv2.LINE_AA)
    return tile


def contact_sheet(
    fuser: FaceFuser,
    sources: Sequence[ImageInput],
    target: ImageInput,
    options: FuseOptions,
    *,
    height: int = 360,
) -> np.ndarray:
    """One RGB uint8 row: source, target, fused at 0/50/100 and at 100 without
    relighting, occluder masks and the symmetric fill (labelled with identity
    figures)."""
    src_rgb = fuser.analyser.decode(sources[0])
    tgt_rgb = fuser.analyser.decode(target)
    tiles = [_tile(src_rgb, height, "source"), _tile(tgt_rgb, height, "target")]
    plain = dataclasses.replace(options, relight=False, reject_source_occluders=False,
                                keep_target_occluders=False, symmetric_fill=False)
    runs = [(float(d), options, f"degree {d}") for d in SHEET_DEGREES]
    runs.append((100.0, plain, "100, no relight/masks"))
    for d, opts, label in runs:
        r = fuser.fuse(list(sources), tgt_rgb,
                       dataclasses.replace(opts, degree=d, shape=None, texture=None))
        q = r.quality
        if "id_sim_source" in q:
            label += f"  src {q['id_sim_source']:.2f} tgt {q['id_sim_target']:.2f}"
        tiles.append(_tile(r.image, height, label))
    gap = np.full((height, 6, 3), 255, np.uint8)
    row = [tiles[0]]
    for t in tiles[1:]:
        row += [gap, t]
    return np.concatenate(row, axis=1)
