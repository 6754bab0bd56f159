"""The target's nostril openings: found where they show, kept when the target is
seen from further below than a source that lacks them, the source's otherwise."""

from __future__ import annotations

import numpy as np

from facefuse.fusion import mask as masks
from facefuse.fusion import nostrils
from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.types import FuseOptions
from facefuse.toolchain.trials import Sample


def _area(s: Sample) -> float:
    return nostrils.area(s.image.astype(np.float32), s.landmarks)


def test_openings_show_on_faces_seen_from_below_not_on_a_frontal_one(
        samples: dict[str, Sample]) -> None:
    """obama3, photographed from below, and obama2 show their nostril openings;
    the astronaut, lit and seen from the front, shows none."""
    assert _area(samples["obama3"]) > 10 * _area(samples["astronaut"])
    assert _area(samples["obama2"]) > 10 * _area(samples["astronaut"])
    assert _area(samples["astronaut"]) < 0.001


def test_the_share_kept_follows_the_pose_and_what_the_source_shows(
        samples: dict[str, Sample]) -> None:
    from_below, frontal = samples["obama3"].landmarks, samples["astronaut"].landmarks
    shown = _area(samples["obama3"])
    # Seen from 21 degrees further below than a source without openings: all kept.
    assert nostrils.keep_share(shown, 0.0, from_below, frontal) == 1.0
    # The same pose: the source's own nostrils.
    assert nostrils.keep_share(shown, 0.0, from_below, from_below) == 0.0
    # A source showing as much of its own: nothing kept, whatever the pose.
    assert nostrils.keep_share(shown, shown, from_below, frontal) == 0.0
    assert nostrils.keep_share(0.0, 0.0, from_below, frontal) == 0.0


def test_a_face_seen_from_below_keeps_its_dark_nostrils(
        fuser: FaceFuser, samples: dict[str, Sample]) -> None:
    """Fused from the frontal astronaut, obama3's nose keeps its openings: the output
    read on the fused mesh shows about as much of them as the target itself."""
    s, t = samples["astronaut"], samples["obama3"]
    r = fuser.fuse_faces(s.image, s.faces[0], t.image, t.faces, [0],
                         FuseOptions(degree=100, evaluate=False))
    mesh = r.fused[0].landmarks
    assert mesh is not None
    out = nostrils.area(r.image.astype(np.float32), mesh)
    assert out >= 0.6 * _area(t), (out, _area(t))
    # The astronaut onto biden, both about frontal: biden's openings are not kept.
    b = samples["biden"]
    r = fuser.fuse_faces(s.image, s.faces[0], b.image, b.faces, [0],
                         FuseOptions(degree=100, evaluate=False))
    mesh = r.fused[0].landmarks
    assert mesh is not None
    region = r.fused[0].region
    holes = nostrils.openings(b.image.astype(np.float32), b.landmarks,
                              masks.feather_px(b.landmarks))
    x0, y0, x1, y1 = region
    assert holes[y0:y1, x0:x1].any()
    kept = holes > 0.5
    changed = np.abs(r.image.astype(int) - b.image.astype(int)).max(axis=2) > 8
    assert changed[kept].mean() > 0.5
