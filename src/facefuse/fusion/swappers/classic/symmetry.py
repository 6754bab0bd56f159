"""Sampling the source where it shows the face: directly, or mirrored by symmetry.

A target turned away from the source's pose maps parts of its face onto parts of
the source face that the source photo hides (they face away from its camera),
shows only as a thin edge-on strip, or lacks altogether (beyond its face
outline, where the warp would read background); a turned source seen from a
frontal target, the same. Per target pixel the layer takes its colour from:

1. the **direct** sample (the source's own vertex positions), weighted by how
   well the source shows that part (:func:`triangle_scores`) and cut at the
   source's face outline (:func:`outline_field`);
2. the **mirrored** sample for what the direct one does not show: the same place
   on the other half of the source face, through the mesh's left/right vertex
   pairs (:data:`MIRROR`, derived from the landmarker by
   :mod:`facefuse.toolchain.mesh_symmetry`). Its warp is the same
   piecewise-affine map with the source's vertices permuted, so it is as smooth
   as the direct one; it is gated by the same outline and occluder masks, and
   re-toned by the source's side-to-side lighting (:func:`side_tone`) so that a
   cheek in the shade stays in the shade before the relighting;
3. the target's own pixels (in the target's own lighting) where neither half is
   shown, or where the direct sample is shown but covered by an occluder.

The visibility scores are per triangle (the foreshortening ratio of
:mod:`facefuse.fusion.visibility`, ramped between :data:`HIDDEN` and
:data:`SHOWN`: only parts the source hides or squeezes about five-fold are
taken from the mirror, since a direct sample, even stretched, carries more of
the source's identity), averaged onto the vertices by area, smoothed over the
mesh (:data:`SMOOTHING` passes) and interpolated per pixel inside each
triangle; near the outline the direct sample fades out over :data:`RAMP` eye
distances where the mirrored sample lies deeper inside the source face. All
weights are continuous, so the three sources cross-fade instead of meeting at a
seam, and none samples beyond the source's face outline (:func:`outside_share`
measures that: 0). The mirrored sample is used only where it shows some part of
the face markedly better (:data:`MIRROR_GAIN`; in a clip, wherever the direct one
falls short); elsewhere the direct sample stands alone, cut at the outline.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from facefuse.faces.landmarker import MESH_POINTS
from facefuse.faces.mesh_mirror import MIRROR
from facefuse.fusion.swappers.classic.light import vertex_normals
from facefuse.fusion.swappers.classic.occlusion import outline_mask, skin_vertices
from facefuse.imaging.channels import each_channel

#: Foreshortening ratio (source over target) at and below which a triangle counts
#: as hidden in the source, and at and above which as fully shown.
HIDDEN = 0.05
SHOWN = 0.2
#: Passes of neighbour averaging of the vertex scores (each widens the ramp by
#: about one vertex spacing).
SMOOTHING = 2
#: Width of the cross-fade from the direct to the mirrored sample inside the
#: source's face outline, in eye distances.
RAMP = 0.3
#: The fill is used only where the mirrored source shows some vertex better than the
#: direct one by at least this score. Below it both halves show the face about as well
#: (a frontal source, or a source turned the way the target is), the two samples are
#: alike, and the fill moves the output by little: on the 20 sample pairs and 24
#: frontal sources onto heads turned up to ±39° it moved no more than 158 pixels of a
#: face by over 8 grey levels (99th percentile of the changed pixels ≤ 7), while a
#: fill where the gain is 0.5-0.8 (a source turned 11-13° onto a frontal or opposite
#: target) moves thousands by 14-24. Skipping it takes 7-13 % off the fusion stage.
#: Where it is skipped the direct sample stands alone, still cut at the outline.
MIRROR_GAIN = 0.35
#: Below this smallest vertex score the direct sample is short of fully shown
#: (:attr:`FillPlan.partial`).
FULLY_SHOWN = 0.999

#: :data:`MIRROR` as an index array (468,).
MIRROR_ORDER = np.asarray(MIRROR, np.intp)


def mirrored(points: np.ndarray) -> np.ndarray:
    """The mesh points (≥ 468, k) with every vertex moved to its mirror vertex's
    place (iris points, if any, dropped): ``out[i] = points[MIRROR[i]]``."""
    return np.asarray(points)[MIRROR_ORDER]


def _ramp(x: np.ndarray) -> np.ndarray:
    t = np.clip((x - HIDDEN) / (SHOWN - HIDDEN), 0.0, 1.0)
    out: np.ndarray = t * t * (3.0 - 2.0 * t)
    return out


def triangle_scores(source_pts: np.ndarray, target_pts: np.ndarray, tris: np.ndarray,
                    *, reflected: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per triangle (T,): how well (0..1) the source shows it, and its target area (px²).

    ``source_pts``/``target_pts`` (N, 3): x, y in pixels and the landmarker's z.
    0 when the triangle faces away in the source (its winding reversed relative
    to the target's, or kept when ``reflected``: a mirrored triangle's winding
    flips once by the mirroring itself); otherwise the ramp of the ratio of its
    foreshortening (projected over surface area) in the source to the target's.
    """
    def areas(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a, b, c = p[tris[:, 0]], p[tris[:, 1]], p[tris[:, 2]]
        u, v = b - a, c - a
        return 0.5 * (u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0]), \
            0.5 * np.linalg.norm(np.cross(u, v), axis=1)

    t_signed, t_surface = areas(np.asarray(target_pts, np.float64))
    s_signed, s_surface = areas(np.asarray(source_pts, np.float64))
    same = np.sign(s_signed) == np.sign(t_signed)
    facing = ~same if reflected else same
    cos_t = np.abs(t_signed) / np.maximum(t_surface, 1e-9)
    cos_s = np.abs(s_signed) / np.maximum(s_surface, 1e-9)
    ratio = cos_s / np.maximum(cos_t, 1e-9)
    return np.where(facing, _ramp(ratio), 0.0), np.abs(t_signed)


def vertex_scores(scores: np.ndarray, area: np.ndarray, tris: np.ndarray,
                  n: int = MESH_POINTS) -> np.ndarray:
    """Triangle scores (T,) → smooth vertex scores (n,) in [0, 1]: area-weighted
    mean over each vertex's triangles, then :data:`SMOOTHING` passes of halfway
    averaging with the neighbours. Vertices in no triangle score 1."""
    num = np.zeros(n)
    den = np.zeros(n)
    for k in range(3):
        np.add.at(num, tris[:, k], scores * area)
        np.add.at(den, tris[:, k], area)
    v = np.where(den > 0, num / np.maximum(den, 1e-12), 1.0)
    edges = np.concatenate([tris[:, [0, 1]], tris[:, [1, 2]], tris[:, [2, 0]]])
    edges = np.concatenate([edges, edges[:, ::-1]])
    count = np.bincount(edges[:, 0], minlength=n).astype(np.float64)
    for _ in range(SMOOTHING):
        nb = np.bincount(edges[:, 0], weights=v[edges[:, 1]], minlength=n)
        v = np.where(count > 0, 0.5 * v + 0.5 * nb / np.maximum(count, 1.0), v)
    out: np.ndarray = np.clip(v, 0.0, 1.0)
    return out


@dataclass(frozen=True)
class FillPlan:
    """What the layer samples where: per-vertex scores (468,) of the direct and
    the mirrored source, and the mirrored source points (468, 2) to warp by."""

    direct: np.ndarray
    mirror: np.ndarray
    mirrored_points: np.ndarray

    @property
    def needed(self) -> bool:
        """Whether the mirrored source shows some part of the face markedly better
        than the direct one (by :data:`MIRROR_GAIN`)."""
        return bool((self.mirror - self.direct).max() >= MIRROR_GAIN)

    @property
    def partial(self) -> bool:
        """Whether any part of the face is short of fully shown by the direct source
        (the rule a clip's frames fill by, so that it does not switch between them)."""
        return bool(self.direct.min() < FULLY_SHOWN)

    def weight_points(self) -> np.ndarray:
        """(468, 2): the scores as a 'point set' (x = direct, y = mirrored), so the
        piecewise-affine warp interpolates them per pixel like coordinates."""
        return np.stack([self.direct, self.mirror], axis=1)


def plan_fill(source_lm: np.ndarray, fused_lm: np.ndarray, tris: np.ndarray) -> FillPlan:
    """Visibility of both source halves from the fused face's pose.

    ``source_lm``/``fused_lm`` (≥ 468, 3) pixels in their own frames; ``tris``
    (T, 3) the fused mesh's triangles.
    """
    src = np.asarray(source_lm[:MESH_POINTS], np.float64)
    dst = np.asarray(fused_lm[:MESH_POINTS], np.float64)
    direct, area = triangle_scores(src, dst, tris)
    mirror_pts = mirrored(src)
    mirror, _ = triangle_scores(mirror_pts, dst, tris, reflected=True)
    return FillPlan(vertex_scores(direct, area, tris), vertex_scores(mirror, area, tris),
                    mirror_pts[:, :2])


def outline_field(outline: np.ndarray, ramp: float = 0.0) -> np.ndarray:
    """(H, W) float32 in [0, 1] over the source: its face ``outline`` (float32 mask,
    at least half covered counts: the pixel's centre inside the mesh's face oval)
    shrunk by a pixel; with ``ramp`` > 0 (pixels) rising from that edge to 1 over
    that distance instead of at once (for cross-fades that must still reach 0 at
    it). Sampled with :func:`sample_field`."""
    shrunk = cv2.erode((outline >= 0.5).astype(np.uint8), np.ones((3, 3), np.uint8))
    if ramp <= 0:
        return shrunk.astype(np.float32)
    dist = cv2.distanceTransform(shrunk, cv2.DIST_L2, 3)
    out: np.ndarray = np.minimum(dist / np.float32(ramp), 1.0).astype(np.float32)
    return out


def sample_field(field: np.ndarray, map_x: np.ndarray, map_y: np.ndarray) -> np.ndarray:
    """(h, w) float32: an :func:`outline_field` sampled at the map's coordinates (0
    beyond the image). Where it is above 0 every bilinear tap of the sample lies
    inside the outline."""
    out: np.ndarray = cv2.remap(field, map_x, map_y, cv2.INTER_LINEAR,
                                borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
    return out


def combine(shown: np.ndarray, shown_soft: np.ndarray, mirror: np.ndarray,
            mirror_soft: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-pixel weights (h, w) of the direct and mirrored samples.

    ``shown``/``shown_soft``: the direct score gated by the source's outline,
    crisply and with a ramp inside it (:func:`outline_field`); ``mirror`` /
    ``mirror_soft``: the mirrored score gated the same ways. Where the mirrored
    sample lies deeper inside the source's face than the direct one, the direct
    sample fades out along its ramp and the mirror takes over, so the two
    cross-fade instead of meeting at the outline (and a frontal pair, whose two
    sides are alike, keeps its direct samples). What covers the source is filled
    from its own skin before either is sampled (``skin_fill``), so neither is gated
    by it. ``1 − sum`` goes to the target's own pixels.
    """
    deeper = np.clip(mirror_soft - shown_soft, 0.0, 1.0)
    direct = np.clip(shown + deeper * (shown_soft - shown), 0.0, 1.0)
    m = (1.0 - direct) * np.clip(mirror, 0.0, 1.0)
    return direct.astype(np.float32), m.astype(np.float32)


#: Blur of the source before its vertex colours are read, in eye distances.
TONE_SIGMA = 0.15
#: Clamp on the side-to-side tone ratio.
TONE_MAX = 3.0
#: Pixels per σ of the reduced copy the tone is read from.
TONE_PX_PER_SIGMA = 8.0
#: Fewest measured vertex pairs for a tone fit.
TONE_MIN_PAIRS = 20


def tone_colours(source_img: np.ndarray, source_lm: np.ndarray, eye_px: float,
                 outline: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """The source's colours low-passed within its face outline (σ = :data:`TONE_SIGMA`
    eye distances; nothing of the background counts), on a copy reduced to about
    :data:`TONE_PX_PER_SIGMA` pixels per σ: ``(low (h', w', 3) float32, k)`` with
    ``k`` the reduced copy's pixels per source pixel. Depends on the source alone
    (:func:`side_tone` reads it; a caller may keep it). ``outline``: as for
    :func:`side_tone`."""
    h, w = source_img.shape[:2]
    sigma = max(1.0, TONE_SIGMA * eye_px)
    k = min(1.0, TONE_PX_PER_SIGMA / sigma)
    small = (max(1, round(w * k)), max(1, round(h * k)))
    if outline is None:
        outline = outline_mask(source_lm, source_img.shape)
    face = cv2.resize(outline, small, interpolation=cv2.INTER_AREA)
    img = cv2.resize(np.asarray(source_img, np.float32), small, interpolation=cv2.INTER_AREA)
    num = cv2.GaussianBlur(img * each_channel(face), (0, 0), sigma * k)
    den = cv2.GaussianBlur(face, (0, 0), sigma * k)
    low: np.ndarray = num / each_channel(np.maximum(den, 1e-3))
    return low, k


def side_tone(source_img: np.ndarray, source_lm: np.ndarray, tris: np.ndarray,
              eye_px: float, occluders: np.ndarray | None = None,
              outline: np.ndarray | None = None,
              colours: tuple[np.ndarray, float] | None = None) -> np.ndarray:
    """Per vertex (468, 3): the source's lighting at vertex ``i`` over its lighting
    at the mirror vertex.

    The two halves of a face share their skin's colour, so the ratio of the
    colours low-passed within the face outline (σ = :data:`TONE_SIGMA` eye
    distances) at ``i`` and its
    mirror is the ratio of the photo's lighting on the two sides; it turns a
    mirrored sample into one lit as the side it is drawn on (a turned face's far
    cheek in the shade stays in the shade). Measured where both vertices are
    reliably skin, face the source's camera and are off its ``occluders`` ((H, W)
    > 0.5), the log ratio is fitted per channel as a linear function of the
    offset between the two vertices (a side-to-side lighting slope: odd in the
    offset, as the ratio is), which extends to the face's edges; all ones when
    fewer than :data:`TONE_MIN_PAIRS` pairs are measured. ``outline``: the source's
    (H, W) float32 face-outline mask when the caller has it (else computed);
    ``colours``: :func:`tone_colours` of this source when the caller kept it.
    """
    lm = np.asarray(source_lm[:MESH_POINTS], np.float64)
    h, w = source_img.shape[:2]
    low, k = colours if colours is not None else tone_colours(source_img, source_lm, eye_px,
                                                              outline)
    xs = np.clip(np.rint(lm[:, 0] * k).astype(np.intp), 0, low.shape[1] - 1)
    ys = np.clip(np.rint(lm[:, 1] * k).astype(np.intp), 0, low.shape[0] - 1)
    colour = np.maximum(low[ys, xs].astype(np.float64), 1.0)
    xi = np.clip(np.rint(lm[:, 0]).astype(np.intp), 0, w - 1)
    yi = np.clip(np.rint(lm[:, 1]).astype(np.intp), 0, h - 1)
    log_ratio = np.log(colour / colour[MIRROR_ORDER])
    offset = (lm[:, :2] - lm[MIRROR_ORDER, :2]) / max(eye_px, 1.0)
    ok = np.zeros(MESH_POINTS, bool)
    ok[skin_vertices(source_lm)] = True
    inside = (lm[:, 0] >= 0) & (lm[:, 0] < w) & (lm[:, 1] >= 0) & (lm[:, 1] < h)
    ok &= inside & (vertex_normals(lm, tris)[:, 2] > 0.5)
    if occluders is not None:
        ok &= occluders[yi, xi] <= 0.5
    ok &= ok[MIRROR_ORDER] & (np.arange(MESH_POINTS) != MIRROR_ORDER)
    if ok.sum() < TONE_MIN_PAIRS:
        return np.ones((MESH_POINTS, 3))
    slope, *_ = np.linalg.lstsq(offset[ok], log_ratio[ok], rcond=None)
    out: np.ndarray = np.exp(np.clip(offset @ slope, -np.log(TONE_MAX), np.log(TONE_MAX)))
    return out


def mix(direct: np.ndarray, d: np.ndarray, mirror: np.ndarray, m: np.ndarray) -> np.ndarray:
    """(h, w, 3) float32: the direct and mirrored layers in proportion to their
    weights (h, w); the direct layer where both weights are 0."""
    total = d + m
    share = np.where(total > 0, m / np.maximum(total, 1e-6), 0.0).astype(np.float32)
    out: np.ndarray = direct + each_channel(share) * (mirror - direct)
    return out


def outside_share(samples: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                  outline: np.ndarray, face: np.ndarray) -> float:
    """Share (0..1) of the ``face`` pixels ((h, w) bool) whose colour takes any
    part from beyond the source's ``outline`` ((H, W) float32 mask): per
    sample ``(weight (h, w), map_x, map_y)``, a pixel counts when its weight is
    above 0 and one of the four bilinear taps at its coordinate lies outside the
    outline (below half covered) or the image."""
    total = int(face.sum())
    if total == 0:
        return 0.0
    inside = outline >= 0.5
    h, w = inside.shape
    bad = np.zeros(face.shape, bool)
    for weight, mx, my in samples:
        use = face & (weight > 0)
        x, y = mx[use], my[use]
        x0, y0 = np.floor(x).astype(np.intp), np.floor(y).astype(np.intp)
        out = np.zeros(x.shape, bool)
        for dx in (0, 1):
            for dy in (0, 1):
                xi, yi = x0 + dx, y0 + dy
                ok = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
                # A tap with zero bilinear weight (integer coordinate) does not count.
                tap = ok.copy()
                tap[ok] = inside[yi[ok], xi[ok]]
                zero = ((dx == 1) & (x == x0)) | ((dy == 1) & (y == y0))
                out |= ~tap & ~zero
        bad[use] |= out
    return float(bad.sum() / total)
