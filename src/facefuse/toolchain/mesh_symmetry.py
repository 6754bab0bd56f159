"""The face mesh's left/right vertex pairing, derived from the landmarker itself.

A photo and its mirror image show the same face; the landmarker run on the
mirror image and its points flipped back puts vertex ``i`` where the photo's
vertex ``mirror(i)`` is (the subject's right eye corner where the left one
was). Per sample photo the cost of pairing ``i`` with ``j`` is that distance in
eye distances, summed over the sample photos and made symmetric; vertices are
then paired greedily by increasing cost, each at most once, so the result is an
involution by construction (midline vertices pair with themselves).

The table is written once to :mod:`facefuse.faces.mesh_mirror` (generated, not
typed by hand) and checked against a fresh derivation by the tests:

    .venv/bin/python -m facefuse.toolchain.mesh_symmetry
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from facefuse.faces.landmarker import MESH_POINTS
from facefuse.faces.topology import EYE_OUTER

#: (H, W, 3) uint8 image -> (478, 3) landmarks of its largest face, or None.
Landmarks = Callable[[np.ndarray], "np.ndarray | None"]

MODULE = Path(__file__).resolve().parents[1] / "faces" / "mesh_mirror.py"


def mirror_cost(landmarks_of: Landmarks, images: Iterable[np.ndarray]) -> np.ndarray:
    """(468, 468) float64 symmetric cost: entry ``[i, j]`` the distance (eye
    distances, summed over ``images``) between vertex ``i`` found on the mirror
    image, flipped back, and vertex ``j`` found on the image (and the reverse)."""
    total = np.zeros((MESH_POINTS, MESH_POINTS))
    for image in images:
        p = landmarks_of(image)
        q = landmarks_of(np.ascontiguousarray(image[:, ::-1]))
        if p is None or q is None:
            continue
        p = np.asarray(p[:MESH_POINTS, :2], np.float64)
        q = np.asarray(q[:MESH_POINTS, :2], np.float64).copy()
        q[:, 0] = image.shape[1] - 1 - q[:, 0]
        eye = float(np.linalg.norm(p[EYE_OUTER[0]] - p[EYE_OUTER[1]]))
        total += np.linalg.norm(q[:, None, :] - p[None, :, :], axis=2) / max(eye, 1e-6)
    out: np.ndarray = total + total.T
    return out


def pair_greedy(cost: np.ndarray) -> tuple[int, ...]:
    """An involution over the vertices: the cheapest free pair first, until every
    vertex is paired (possibly with itself)."""
    n = len(cost)
    mirror = np.full(n, -1, np.intp)
    for k in np.argsort(cost, axis=None, kind="stable"):
        i, j = divmod(int(k), n)
        if mirror[i] < 0 and mirror[j] < 0:
            mirror[i], mirror[j] = j, i
    return tuple(int(v) for v in mirror)


def derive_mirror(landmarks_of: Landmarks, images: Iterable[np.ndarray]) -> tuple[int, ...]:
    """The pairing from the landmarker's answers on ``images`` and their mirror images."""
    return pair_greedy(mirror_cost(landmarks_of, images))


def render_module(mirror: tuple[int, ...]) -> str:
    """The source text of :mod:`facefuse.faces.mesh_mirror` holding ``mirror``."""
    rows = [", ".join(str(v) for v in mirror[i:i + 16]) for i in range(0, len(mirror), 16)]
    body = "\n".join(f"    {r}," for r in rows)
    return (
        '"""Left/right vertex pairs of the 468-point face mesh (generated: do not edit).\n\n'
        "``MIRROR[i]`` is the vertex at the mirror place of vertex ``i`` (the same\n"
        "vertex on the face's midline); an involution. Derived from the landmarker on\n"
        "the sample photos and their mirror images by\n"
        "``python -m facefuse.toolchain.mesh_symmetry`` (see that module).\n"
        '"""\n\n'
        f"MIRROR: tuple[int, ...] = (\n{body}\n)\n"
    )


def main() -> None:
    from facefuse.config import Settings
    from facefuse.faces.analyser import FaceAnalyser
    from facefuse.imaging.decode import decode_image
    from facefuse.toolchain.samples import fetch_samples

    settings = Settings.from_env(threads=1, precision="fp32")
    analyser = FaceAnalyser(settings)

    def landmarks_of(image: np.ndarray) -> np.ndarray | None:
        faces = analyser.analyse(image, embed=False)
        return faces[0].landmarks if faces else None

    images = [decode_image(p) for p in
              fetch_samples(settings.samples_dir, settings.downloads_dir).values()]
    MODULE.write_text(render_module(derive_mirror(landmarks_of, images)))
    print(f"wrote {MODULE}")


if __name__ == "__main__":
    main()
