"""The target's nostril openings: found where they show, kept when the target is
seen from further below than a source that lacks them, the source's otherwise."""

from __future__ import annotations

import numpy as np

from facefuse.fusion.engine import FaceFuser
from facefuse.fusion.swappers.classic import nostrils
from facefuse.fusion.types import FuseOptions
from facefuse.toolchain.trials import Sample


def _area(image: np.ndarray, landmarks: np.ndarray) -> float:
    return nostrils.area(nostrils.openings(image, landmarks), landmarks)


def test_openings_show_on_faces_seen_from_below_not_on_a_frontal_one(
        samples: dict[str, Sample]) -> None:
    """obama3, photographed from below, and obama2 show their nostril openings;
    the astronaut, lit and seen from the front, shows none."""
    a = {n: _area(samples[n].image, samples[n].landmarks)
         for n in ("obama3", "obama2", "astronaut")}
    assert a["obama3"] > 10 * a["astronaut"] and a["obama2"] > 10 * a["astronaut"], a
    assert a["astronaut"] < 0.001, a


def test_the_share_kept_follows_the_pose_and_what_the_source_shows(
        samples: dict[str, Sample]) -> None:
    from_below, frontal = samples["obama3"].landmarks, samples["astronaut"].landmarks
    # Seen from 21 degrees further below than the source: the pose keeps all; the
    # same pose, or the source seen from below, none.
    assert nostrils.pose_share(from_below, frontal) == 1.0
    assert nostrils.pose_share(from_below, from_below) == 0.0
    assert nostrils.pose_share(frontal, from_below) == 0.0
    shown = _area(samples["obama3"].image, from_below)
    assert nostrils.lacking(shown, 0.0) == 1.0
    assert nostrils.lacking(shown, shown) == 0.0
    assert nostrils.lacking(shown, 0.5 * shown) == 0.5
    assert nostrils.lacking(0.0, 0.0) == 0.0


def test_soften_stays_within_a_pixel_of_the_openings() -> None:
    holes = np.zeros((40, 40), np.float32)
    holes[18:22, 15:20] = 1.0
    soft = nostrils.soften(holes, 6.0)
    assert soft[19, 17] == 1.0 and soft.max() <= 1.0
    assert not soft[:16].any() and not soft[24:].any()


def test_a_face_seen_from_below_keeps_its_dark_nostrils(
        fuser: FaceFuser, samples: dict[str, Sample]) -> None:
    """Fused from the frontal astronaut or obama, obama3's nose keeps its openings,
    long slits and all: the output read on the fused mesh (the source's smaller
    nose) shows at least half as much of them as the target itself (a search disc
    about each nostril's midpoint kept 0.41 of them from either source, as dots);
    onto biden, about frontal too, biden's openings are not kept."""
    t = samples["obama3"]
    own = _area(t.image, t.landmarks)
    for name in ("astronaut", "obama"):
        s = samples[name]
        r = fuser.fuse_faces(s.image, s.faces[0], t.image, t.faces, [0],
                             FuseOptions(degree=100, evaluate=False))
        mesh = r.fused[0].landmarks
        assert mesh is not None
        out = _area(r.image, mesh)
        assert out >= 0.5 * own, (name, out, own)
    s = samples["astronaut"]
    b = samples["biden"]
    r = fuser.fuse_faces(s.image, s.faces[0], b.image, b.faces, [0],
                         FuseOptions(degree=100, evaluate=False))
    kept = nostrils.openings(b.image, b.landmarks) > 0.5
    assert kept.any()
    changed = np.abs(r.image.astype(int) - b.image.astype(int)).max(axis=2) > 8
    assert changed[kept].mean() > 0.5
