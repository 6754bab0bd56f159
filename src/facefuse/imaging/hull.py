"""Completing a triangulation to its points' convex hull.

OpenCV's ``Subdiv2D`` (behind :func:`facefuse.imaging.warp.delaunay`) triangulates
inside a finite super-triangle whose three virtual vertices sit a large but finite
distance ``R`` away. A hull edge ``a–c`` of length ``L`` then loses the thin
triangle ``(a, b, c)`` of a point ``b`` less than about ``L² / (8 R)`` inside it:
the circle through ``a``, ``c`` and a virtual vertex holds ``b``, so ``b`` is
joined to the virtual vertex instead and the sliver is dropped with the virtual
triangles. On a 1/8 px lattice this happens (1/64 px² missing from a 4000 px²
hull, shown with exact integer arithmetic on the lattice).

:func:`complete_to_hull` puts those slivers back: it walks the triangulation's
boundary and clips every ear where the boundary turns inward (a pocket), and it
joins points that no triangle uses to the boundary edges they see. Both steps
only add triangles outside the current ones and free of other points, so the
result still tiles: disjoint triangles whose union is the convex hull.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]

#: Doubled triangle areas (px²) at or below this count as collinear.
_EPS2: Final = 1e-6


def _cross(o: F64, a: F64, b: F64) -> float:
    """Doubled signed area of ``(o, a, b)``: > 0 when ``b`` is left of ``o → a``."""
    return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))


def _outer_edges(tris: I32, n: int) -> npt.NDArray[np.int64]:
    """(B, 2) directed boundary edges: those whose reverse no triangle has
    (triangles wound positively: the inside is on each edge's left)."""
    edges = tris[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2).astype(np.int64)
    keys = np.sort(edges[:, 0] * n + edges[:, 1])
    rev = edges[:, 1] * n + edges[:, 0]
    pos = np.clip(np.searchsorted(keys, rev), 0, len(keys) - 1)
    out: npt.NDArray[np.int64] = edges[keys[pos] != rev]
    return out


def _boundary(tris: I32, n: int) -> dict[int, int] | None:
    """``start → end`` of the directed boundary edges, or None when a vertex
    starts two of them (a pinch)."""
    outer = _outer_edges(tris, n)
    nxt = dict(zip(outer[:, 0].tolist(), outer[:, 1].tolist(), strict=True))
    return nxt if len(nxt) == len(outer) else None


def _covers_hull(pts: F64, tris: I32, cand: npt.NDArray[np.intp]) -> bool:
    """True when the boundary never turns inward and every candidate point is a
    vertex: the common case, checked without a Python loop."""
    seen = np.zeros(len(pts), dtype=bool)
    seen[tris.reshape(-1)] = True
    if not seen[cand].all():
        return False
    outer = _outer_edges(tris, len(pts))
    order = np.argsort(outer[:, 0])
    starts = outer[order, 0]
    at = np.searchsorted(starts, outer[:, 1])
    if np.any(at >= len(starts)) or np.any(starts[np.minimum(at, len(starts) - 1)] != outer[:, 1]):
        return False  # not one closed chain of edges: let the slow path decide
    a, b, c = pts[outer[:, 0]], pts[outer[:, 1]], pts[outer[order[at], 1]]
    turn = (b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0])
    return bool(np.all(turn >= -_EPS2))


def _free(pts: F64, cand: npt.NDArray[np.intp], tri: tuple[int, int, int]) -> bool:
    """True when no point of ``cand`` but the corners lies in the closed triangle
    ``tri`` (wound positively)."""
    p0, p1, p2 = pts[tri[0]], pts[tri[1]], pts[tri[2]]
    q = pts[cand[(cand != tri[0]) & (cand != tri[1]) & (cand != tri[2])]]
    inside = np.ones(len(q), dtype=bool)
    for a, b in ((p0, p1), (p1, p2), (p2, p0)):
        inside &= (b[0] - a[0]) * (q[:, 1] - a[1]) - (b[1] - a[1]) * (q[:, 0] - a[0]) >= -_EPS2
    return not inside.any()


def _clip_ear(
    pts: F64, nxt: dict[int, int], cand: npt.NDArray[np.intp]
) -> tuple[int, int, int] | None:
    """A triangle filling an inward turn ``a → b → c`` of the boundary, or None."""
    for a, b in nxt.items():
        c = nxt[b]
        if _cross(pts[a], pts[b], pts[c]) < -_EPS2 and _free(pts, cand, (a, c, b)):
            return a, c, b
    return None


def _join_orphan(pts: F64, nxt: dict[int, int], orphans: list[int],
                 cand: npt.NDArray[np.intp]) -> list[tuple[int, int, int]]:
    """The fan joining one unused point to the boundary chain it sees, or []."""
    for x in orphans:
        seen = [u for u, v in nxt.items() if _cross(pts[u], pts[v], pts[x]) < -_EPS2]
        if not seen:
            continue
        first = [u for u in seen if not any(nxt[w] == u for w in seen)]
        if len(first) != 1:
            continue  # not one contiguous chain: leave it for a later round
        fan, u = [], first[0]
        while u in seen:
            fan.append((u, x, nxt[u]))
            u = nxt[u]
        if all(_free(pts, cand, t) for t in fan):
            return fan
    return []


def complete_to_hull(pts: F64, tris: I32, used: npt.NDArray[np.intp]) -> I32:
    """Add the triangles ``tris`` misses inside the convex hull of ``pts[used]``.

    Args:
        pts: (P, 2) float64 pixel coordinates.
        tris: (T, 3) int32 vertex indices, each triangle wound positively
            (``(v1 - v0) × (v2 - v0) > 0``), disjoint, their union simply connected.
        used: (U,) the indices that may be vertices (duplicates already merged).

    Returns:
        (T', 3) int32, ``tris`` first, then the added triangles (same winding).
        Unchanged when ``tris`` already covers the hull, is empty, or its boundary
        is pinched at a vertex.
    """
    cand = np.asarray(used, dtype=np.intp)
    if len(tris) == 0 or _covers_hull(pts, tris, cand):
        return tris
    added: list[tuple[int, int, int]] = []
    while True:
        nxt = _boundary(np.vstack([tris, np.asarray(added, np.int32).reshape(-1, 3)]), len(pts))
        if nxt is None:
            break
        ear = _clip_ear(pts, nxt, cand)
        if ear is not None:
            added.append(ear)
            continue
        have = set(tris.reshape(-1).tolist()) | {v for t in added for v in t}
        fan = _join_orphan(pts, nxt, [int(i) for i in cand if int(i) not in have], cand)
        if not fan:
            break
        added.extend(fan)
    if not added:
        return tris
    out: I32 = np.vstack([tris, np.asarray(added, dtype=np.int32)])
    return out
