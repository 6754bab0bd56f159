"""Reproducible synthetic variants of the sample photos, for tests and benchmarks.

* :func:`paste_occluder` — an occluder over a face, its pixels taken from another
  real image: a ``"bar"`` (a tilted band across the cheek and mouth) or
  ``"sunglasses"`` (two dark lenses and a bridge over the eyes), textured from
  the donor image away from its face (background, hair, clothes), or a ``"hand"``
  (palm and four fingers over the lower face) textured with the donor's skin. Returns the
  image and the occluder's exact footprint.
* :func:`relight_gradient` — the image lit by a known horizontal gradient across
  the face (a multiplicative ramp in linear gain).
* :func:`squinting` — the face with both upper lids lowered (the photo's own lid
  and brow pixels moved down over the eyes): a squinting source.
* :func:`variant` — the whole photo mirrored, tilted by ±12° or lit from one side
  (:data:`VARIANTS`).

Same inputs → same output: nothing is random but the seeded texture offsets.
"""

from __future__ import annotations

from typing import Literal

import cv2
import numpy as np

from facefuse.faces import topology as topo
from facefuse.fusion.geometry import eye_distance, eye_groups
from facefuse.fusion.mask import eyes_mask
from facefuse.fusion.swappers.classic.detail import LUMA
from facefuse.fusion.swappers.classic.eyes import iris_circle

#: The photo variants of :func:`variant`.
VARIANTS = ("native", "mirrored", "tilt+12", "tilt-12", "relit")

OccluderKind = Literal["bar", "sunglasses", "hand"]
OCCLUDER_KINDS: tuple[OccluderKind, ...] = ("bar", "sunglasses", "hand")
#: Lens transmission of the synthetic sunglasses (the donor pixels are dimmed by it).
LENS_TRANSMISSION = 0.3


def _footprint(kind: OccluderKind, lm: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Binary (H, W) bool footprint of an occluder over the face ``lm`` (N, 3)."""
    d = eye_distance(lm)
    m = np.zeros(shape, np.uint8)
    eyes = [lm[list(e), :2].mean(0) for e in (topo.EYE_IMAGE_LEFT, topo.EYE_IMAGE_RIGHT)]
    if kind == "bar":
        a = lm[topo.FACE_EDGE_IMAGE_LEFT, :2] + np.array([-0.2 * d, 0.45 * d])
        b = lm[topo.FACE_EDGE_IMAGE_RIGHT, :2] + np.array([0.2 * d, 0.05 * d])
        cv2.line(m, tuple(np.round(a).astype(int)), tuple(np.round(b).astype(int)), 255,
                 max(2, round(0.22 * d)))
    elif kind == "sunglasses":
        for c in eyes:
            cv2.ellipse(m, (round(c[0]), round(c[1])), (round(0.3 * d), round(0.22 * d)),
                        0, 0, 360, 255, -1)
        cv2.line(m, tuple(np.round(eyes[0]).astype(int)), tuple(np.round(eyes[1]).astype(int)),
                 255, max(2, round(0.05 * d)))
    else:  # a hand over the lower face, fingers pointing up-right
        chin = lm[topo.CHIN, :2]
        mouth = lm[list(topo.MOUTH_CORNERS), :2].mean(0)
        palm = chin + np.array([-0.25 * d, 0.1 * d])
        cv2.ellipse(m, (round(palm[0]), round(palm[1])), (round(0.42 * d), round(0.3 * d)),
                    -20, 0, 360, 255, -1)
        for k in range(4):
            base = palm + np.array([(-0.25 + 0.17 * k) * d, -0.15 * d])
            tip = mouth + np.array([(-0.35 + 0.2 * k) * d, (-0.25 + 0.05 * abs(k - 1.5)) * d])
            cv2.line(m, tuple(np.round(base).astype(int)), tuple(np.round(tip).astype(int)), 255,
                     max(2, round(0.13 * d)))
    return m > 127


def _texture(kind: OccluderKind, donor: np.ndarray, donor_lm: np.ndarray | None,
             shape: tuple[int, int], seed: int) -> np.ndarray:
    """An (H, W, 3) uint8 texture from the donor's real pixels."""
    h, w = shape
    rng = np.random.default_rng(seed)
    if kind == "hand" and donor_lm is not None:
        # Skin: a patch of the donor's cheek, scaled up to cover the frame.
        d = eye_distance(donor_lm)
        c = donor_lm[topo.NOSE_TIP, :2] + np.array([-0.45 * d, 0.05 * d])
        r = 0.14 * d
        x0, y0 = int(max(0, c[0] - r)), int(max(0, c[1] - r))
        patch = donor[y0:int(c[1] + r), x0:int(c[0] + r)]
        tex: np.ndarray = cv2.resize(patch, (w, h), interpolation=cv2.INTER_CUBIC)
        return tex
    if donor_lm is not None:
        # Not the donor's face: the larger strip above its forehead or below its chin.
        d = eye_distance(donor_lm)
        top = int(max(0, donor_lm[topo.FOREHEAD, 1] - 0.6 * d))
        bottom = int(min(donor.shape[0], donor_lm[topo.CHIN, 1] + 0.3 * d))
        strips = [donor[:top], donor[bottom:]]
        donor = max(strips, key=lambda a: a.shape[0])
    dh, dw = donor.shape[:2]
    scale = max(h / dh, w / dw, 1.0)
    big = cv2.resize(donor, (int(np.ceil(dw * scale)), int(np.ceil(dh * scale))))
    oy = int(rng.integers(0, big.shape[0] - h + 1))
    ox = int(rng.integers(0, big.shape[1] - w + 1))
    tex = big[oy:oy + h, ox:ox + w]
    if kind == "sunglasses":
        tex = (tex.astype(np.float32) * LENS_TRANSMISSION).astype(np.uint8)
    return np.ascontiguousarray(tex)


def paste_occluder(
    image: np.ndarray,
    landmarks: np.ndarray,
    kind: OccluderKind,
    donor: np.ndarray,
    donor_landmarks: np.ndarray | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``image`` (H, W, 3) uint8 with an occluder over the face ``landmarks`` (N, 3).

    Args:
        kind: ``"bar"``, ``"sunglasses"`` or ``"hand"``.
        donor: (H', W', 3) uint8 RGB of another image whose pixels texture it.
        donor_landmarks: the donor's face mesh (a hand takes its skin from there).
        seed: picks the texture's offset in the donor.
    Returns:
        (the occluded copy, (H, W) bool footprint of the occluder).
    """
    fp = _footprint(kind, np.asarray(landmarks, np.float64), image.shape[:2])
    tex = _texture(kind, donor, donor_landmarks, image.shape[:2], seed)
    out = image.copy()
    out[fp] = tex[fp]
    return out, fp


def relight_gradient(image: np.ndarray, landmarks: np.ndarray, strength: float) -> np.ndarray:
    """``image`` (H, W, 3) uint8 multiplied by ``1 + strength·(x − cx)/d`` (clipped to
    [0.2, 2]): light from the image-right side when ``strength`` > 0. ``cx`` is the
    face centre and ``d`` its outer-eye-corner distance, so a face's two sides differ
    by about ±``strength`` in gain."""
    d = eye_distance(landmarks)
    cx = float(landmarks[topo.NOSE_TIP, 0])
    x = np.arange(image.shape[1], dtype=np.float32)
    gain = np.clip(1.0 + strength * (x - cx) / d, 0.2, 2.0)
    out: np.ndarray = np.clip(image.astype(np.float32) * gain[None, :, None], 0, 255)
    return out.astype(np.uint8)


def _face_axes(lm: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(eye midpoint (2,), unit across (2,) image-left → right, unit down (2,),
    eye-midpoint-to-mouth distance in pixels) of the face ``lm`` (N, 3)."""
    a = lm[list(topo.EYE_IMAGE_LEFT), :2].mean(0)
    b = lm[list(topo.EYE_IMAGE_RIGHT), :2].mean(0)
    across = (b - a) / max(1e-6, float(np.linalg.norm(b - a)))
    down = np.array([-across[1], across[0]])
    mid = 0.5 * (a + b)
    mouth = lm[list(topo.MOUTH_CORNERS), :2].mean(0)
    return mid, across, down, max(1.0, float((mouth - mid) @ down))


FacialHairKind = Literal["beard", "moustache", "stubble"]
FACIAL_HAIR_KINDS: tuple[FacialHairKind, ...] = ("beard", "moustache", "stubble")
#: Opacity of the transplanted hair: a beard and a moustache cover the skin, stubble
#: lets about half of it through.
FACIAL_HAIR_OPACITY = {"beard": 0.95, "moustache": 0.95, "stubble": 0.5}
#: Upper lip between the nostrils and the outer upper lip, in polygon order.
_MOUSTACHE = (98, 2, 327, 291, 409, 270, 269, 267, 0, 37, 39, 40, 185, 61)


def facial_hair_alpha(lm: np.ndarray, shape: tuple[int, int],
                      kind: FacialHairKind) -> np.ndarray:
    """(H, W) float32 soft coverage in [0, 1] of a synthetic beard, moustache or
    stubble over the face ``lm`` (N, 3): the moustache fills the upper lip; a beard
    and stubble also the chin and the jaw up the cheeks to the sideburns (its top
    edge rises from the nose base at the middle to half the nose's height at the
    face's sides), the lips left bare."""
    lm = np.asarray(lm, np.float64)
    d = eye_distance(lm)
    h, w = shape
    m = np.zeros(shape, np.uint8)
    cv2.fillPoly(m, [np.round(lm[list(_MOUSTACHE), :2]).astype(np.int32)], 255)
    m = np.asarray(cv2.dilate(
        m, cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * round(0.04 * d) + 1,) * 2)), np.uint8)
    if kind != "moustache":
        mid, across, down, mouth = _face_axes(lm)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        px, py = xx - np.float32(mid[0]), yy - np.float32(mid[1])
        t = (px * np.float32(down[0]) + py * np.float32(down[1])) / np.float32(mouth)
        half = 0.5 * float(np.ptp(lm[list(topo.FACE_OVAL), :2] @ across))
        lat = (px * np.float32(across[0]) + py * np.float32(across[1])) / np.float32(half)
        oval = np.zeros(shape, np.uint8)
        cv2.fillPoly(oval, [np.round(lm[list(topo.FACE_OVAL), :2]).astype(np.int32)], 255)
        top = 0.72 - 0.3 * np.clip(np.abs(lat), 0.0, 1.0) ** 2
        m = np.maximum(m, ((t > top) & (oval > 0)).astype(np.uint8) * 255)
    lips = np.zeros(shape, np.uint8)
    cv2.fillPoly(lips, [np.round(lm[list(topo.LIPS_OUTER), :2]).astype(np.int32)], 255)
    m[lips > 0] = 0
    alpha: np.ndarray = cv2.GaussianBlur(m.astype(np.float32) / 255.0, (0, 0), 0.02 * d)
    return alpha


def scalp_hair_texture(donor: np.ndarray, donor_lm: np.ndarray, shape: tuple[int, int],
                       scale: float, seed: int = 0) -> np.ndarray:
    """(H, W, 3) uint8: the donor's real scalp hair (a patch above its forehead),
    resampled by ``scale`` and mirror-tiled to ``shape``; ``seed`` shifts the tiling.

    Only a donor with hair there serves (of the samples: obama's dark short hair,
    astronaut's brown hair; obama3's head is cut by the frame, biden's is bald there)."""
    d = eye_distance(donor_lm)
    c = donor_lm[topo.FOREHEAD, :2] - np.array([0.0, 0.5 * d])
    x0, x1 = int(max(0, c[0] - 0.25 * d)), int(min(donor.shape[1], c[0] + 0.25 * d))
    y0, y1 = int(max(0, c[1] - 0.08 * d)), int(min(donor.shape[0], c[1] + 0.08 * d))
    patch = donor[y0:y1, x0:x1]
    patch = cv2.resize(patch, (max(2, round(patch.shape[1] * scale)),
                               max(2, round(patch.shape[0] * scale))),
                       interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
    ph, pw = patch.shape[:2]
    rng = np.random.default_rng(seed)
    oy, ox = int(rng.integers(0, ph)), int(rng.integers(0, pw))
    reps = (shape[0] + oy) // ph + 2, (shape[1] + ox) // pw + 2
    row = np.concatenate([patch if k % 2 == 0 else patch[:, ::-1] for k in range(reps[1])], 1)
    tile = np.concatenate([row if k % 2 == 0 else row[::-1] for k in range(reps[0])], 0)
    return np.ascontiguousarray(tile[oy:oy + shape[0], ox:ox + shape[1]])


def paste_facial_hair(
    image: np.ndarray,
    landmarks: np.ndarray,
    kind: FacialHairKind,
    donor: np.ndarray,
    donor_landmarks: np.ndarray,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``image`` (H, W, 3) uint8 with the donor's real scalp hair transplanted into the
    beard, moustache or stubble zone of the face ``landmarks`` through a soft mask
    (:func:`facial_hair_alpha`; the hair scaled by the two faces' size ratio).

    Returns:
        (the copy, (H, W) bool footprint: where the hair covers at least half as
        much as it does at its densest).
    """
    lm = np.asarray(landmarks, np.float64)
    alpha = facial_hair_alpha(lm, image.shape[:2], kind)
    scale = eye_distance(lm) / eye_distance(donor_landmarks)
    tex = scalp_hair_texture(donor, donor_landmarks, image.shape[:2], scale, seed)
    a = (alpha * FACIAL_HAIR_OPACITY[kind])[..., None]
    out = image.astype(np.float32) * (1.0 - a) + tex.astype(np.float32) * a
    return np.clip(out + 0.5, 0, 255).astype(np.uint8), alpha > 0.5


#: Synthetic hair inside the face outline at its upper edge: the band's depth
#: (eye distances inward from the outline, at most) and its lowest point (eyes 0,
#: mouth 1: the temples, above the eye line).
HAIRLINE_DEPTH = 0.1
HAIRLINE_LOW = -0.1


def paste_hairline(image: np.ndarray, landmarks: np.ndarray, donor: np.ndarray,
                   donor_landmarks: np.ndarray, seed: int = 0
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``image`` (H, W, 3) uint8 with the donor's real scalp hair reaching into the
    face outline of ``landmarks`` from its upper edge — a hairline or fringe that
    the mesh's outline runs across: a band along the outline above the temples,
    its depth varying along it (strands), up to :data:`HAIRLINE_DEPTH`.

    Returns:
        (the copy, (H, W) bool footprint of the hair inside the outline).
    """
    lm = np.asarray(landmarks, np.float64)
    d = eye_distance(lm)
    h, w = image.shape[:2]
    oval = np.zeros((h, w), np.uint8)
    cv2.fillPoly(oval, [np.round(lm[list(topo.FACE_OVAL), :2]).astype(np.int32)], 1)
    inward = cv2.distanceTransform(oval, cv2.DIST_L2, 3)
    mid, across, down, mouth = _face_axes(lm)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    px, py = xx - np.float32(mid[0]), yy - np.float32(mid[1])
    t = (px * np.float32(down[0]) + py * np.float32(down[1])) / np.float32(mouth)
    angle = np.arctan2(px * np.float32(across[1]) - py * np.float32(across[0]),
                       px * np.float32(across[0]) + py * np.float32(across[1]))
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * np.pi, 3)
    # Strands: the depth swings along the outline (a few cycles across the forehead).
    depth = HAIRLINE_DEPTH * d * (0.55 + 0.45 * np.cos(9.0 * angle + phase[0])
                                  * np.cos(4.0 * angle + phase[1]))
    m = (oval > 0) & (inward <= depth) & (t < HAIRLINE_LOW)
    alpha = cv2.GaussianBlur(m.astype(np.float32), (0, 0), max(0.5, 0.008 * d))
    tex = scalp_hair_texture(donor, donor_landmarks, (h, w),
                             d / eye_distance(donor_landmarks), seed)
    a = (0.95 * alpha)[..., None]
    out = image.astype(np.float32) * (1.0 - a) + tex.astype(np.float32) * a
    return np.clip(out + 0.5, 0, 255).astype(np.uint8), (alpha > 0.5) & (oval > 0)


FrameKind = Literal["metal", "plastic"]
FRAME_KINDS: tuple[FrameKind, ...] = ("metal", "plastic")
#: Frame thickness (eye distances) and mean luma of its darkened donor pixels.
FRAME_THICKNESS = {"metal": 0.018, "plastic": 0.045}
FRAME_LUMA = {"metal": 55.0, "plastic": 30.0}
#: Exponent on the donor texture's relative luma (its grain kept, its contrast tamed).
FRAME_GRAIN = 0.33
#: Lens half-axes (eye distances) around each eye's centre, raised by LENS_RAISE.
LENS_AXES = (0.25, 0.17)
LENS_RAISE = 0.03
#: Peak share of the way to white of the lens reflections.
REFLECTION_STRENGTH = 0.35


def paste_glasses(
    image: np.ndarray,
    landmarks: np.ndarray,
    kind: FrameKind,
    donor: np.ndarray,
    donor_landmarks: np.ndarray,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``image`` (H, W, 3) uint8 with clear glasses over the face ``landmarks``: two
    lens rims around the eyes (following the face's roll), a bridge over the nose
    and the temple arms to the face's edges, thin (``"metal"``) or thick
    (``"plastic"``), textured with the donor's real pixels (away from its face)
    darkened to a frame's tone; the clear lenses carry a diagonal reflection.

    Returns:
        (the copy, (H, W) bool footprint of the frame; the reflections not included).
    """
    lm = np.asarray(landmarks, np.float64)
    d = eye_distance(lm)
    shape = image.shape[:2]
    _, across, down, _ = _face_axes(lm)
    angle = float(np.degrees(np.arctan2(across[1], across[0])))
    ax, ay = LENS_AXES[0] * d, LENS_AXES[1] * d
    thick = max(2, round(FRAME_THICKNESS[kind] * d * 4)) / 4.0
    frame = np.zeros(shape, np.uint8)
    lens = np.zeros(shape, np.uint8)
    s = 4  # sub-pixel shift of the anti-aliased drawing

    def pt(p: np.ndarray) -> tuple[int, int]:
        return round(p[0] * s), round(p[1] * s)

    centres = [lm[list(e), :2].mean(0) - LENS_RAISE * d * down
               for e in (topo.EYE_IMAGE_LEFT, topo.EYE_IMAGE_RIGHT)]
    for c in centres:
        cv2.ellipse(frame, pt(c), (round(ax * s), round(ay * s)), angle, 0, 360, 255,
                    max(1, round(thick)), cv2.LINE_AA, 2)
        cv2.ellipse(lens, pt(c), (round(ax * s), round(ay * s)), angle, 0, 360, 255, -1,
                    cv2.LINE_AA, 2)
    # The bridge: an arc between the lenses' inner upper edges, over the nose.
    a = centres[0] + across * ax * 0.85 - down * ay * 0.45
    b = centres[1] - across * ax * 0.85 - down * ay * 0.45
    top = 0.5 * (a + b) - down * 0.04 * d
    bridge = np.array([(1 - u) ** 2 * a + 2 * u * (1 - u) * top + u**2 * b
                       for u in np.linspace(0, 1, 16)])
    cv2.polylines(frame, [np.array([pt(p) for p in bridge], np.int32)], False, 255,
                  max(1, round(thick)), cv2.LINE_AA, 2)
    # Temple arms from each lens's outer edge to the face's edge at that height.
    for c, edge, sign in ((centres[0], topo.FACE_EDGE_IMAGE_LEFT, -1.0),
                          (centres[1], topo.FACE_EDGE_IMAGE_RIGHT, 1.0)):
        start = c + sign * across * ax * 0.97 - down * ay * 0.25
        reach = abs(float((lm[edge, :2] - start) @ across)) + 0.05 * d
        end = start + sign * across * reach
        cv2.line(frame, pt(start), pt(end), 255, max(1, round(thick)), cv2.LINE_AA, 2)
    tex = _texture("bar", donor, donor_landmarks, shape, seed).astype(np.float32)
    # The donor's grain and tint at a frame's tone: each pixel's luma brought to
    # FRAME_LUMA with its deviation from the mean compressed (a cube root).
    luma = np.maximum(tex @ np.array([0.299, 0.587, 0.114], np.float32), 1.0)
    level = FRAME_LUMA[kind] * (luma / float(luma.mean())) ** FRAME_GRAIN
    tex *= (level / luma)[..., None]
    # A reflection: a soft diagonal band across each lens (brighter toward white).
    yy, xx = np.mgrid[0:shape[0], 0:shape[1]].astype(np.float32)
    band = np.zeros(shape, np.float32)
    for c in centres:
        u = ((xx - c[0]) * 0.7 + (yy - c[1]) * 0.7) / (0.08 * d) + 1.2
        band = np.maximum(band, np.exp(-0.5 * u * u))
    band *= REFLECTION_STRENGTH * (lens.astype(np.float32) / 255.0)
    out = image.astype(np.float32)
    out += (255.0 - out) * band[..., None]
    fa = (frame.astype(np.float32) / 255.0)[..., None]
    out = out * (1.0 - fa) + np.clip(tex, 0, 255) * fa
    return np.clip(out + 0.5, 0, 255).astype(np.uint8), frame > 127


def squinting(image: np.ndarray, landmarks: np.ndarray, closure: float = 0.6) -> np.ndarray:
    """``image`` (H, W, 3) uint8 with both upper lids of the face ``landmarks``
    (N, 3) lowered by ``closure`` × the lid gap: the lid, crease and brow above
    each eye slide down over it (a smooth vertical displacement, fading above the
    brow and just below the eye's centre line), as a squint looks."""
    h, w = image.shape[:2]
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    dy = np.zeros((h, w), np.float32)
    for eye, (upper, lower) in ((topo.EYE_IMAGE_LEFT, topo.EYE_LID_IMAGE_LEFT),
                                (topo.EYE_IMAGE_RIGHT, topo.EYE_LID_IMAGE_RIGHT)):
        pts = landmarks[list(eye), :2]
        cx, cy = pts.mean(0)
        width = float(np.ptp(pts[:, 0]))
        gap = max(1.0, abs(float(landmarks[lower, 1] - landmarks[upper, 1])))
        top = float(landmarks[upper, 1]) - 2.5 * gap
        across = np.exp(-(((xx - cx) / (0.45 * width)) ** 2))
        rise = np.clip((yy - top) / (2.5 * gap), 0.0, 1.0)
        fall = np.clip(1.0 - (yy - (cy + 0.1 * gap)) / (0.4 * gap + 1.0), 0.0, 1.0)
        dy += closure * gap * across * rise * fall
    out: np.ndarray = cv2.remap(image, xx, yy - dy, cv2.INTER_CUBIC,
                                borderMode=cv2.BORDER_REFLECT_101)
    return out


#: A light blue-grey iris (RGB at the iris's median luma).
LIGHT_IRIS = (120.0, 150.0, 175.0)


def light_irises(image: np.ndarray, landmarks: np.ndarray,
                 colour: tuple[float, float, float] = LIGHT_IRIS) -> np.ndarray:
    """``image`` (H, W, 3) uint8 with the irises of the face ``landmarks`` (478, 3)
    recoloured ``colour``: each pixel of the iris (0.35-0.95 of its radius, inside
    the lids) takes the colour scaled by its own luma over the iris's median, so
    the iris keeps its texture; the pupil and the catchlights (1.4 times the
    median and brighter) keep theirs."""
    out = image.astype(np.float32)
    h, w = image.shape[:2]
    yy, xx = np.mgrid[0:h, 0:w]
    inside = eyes_mask(landmarks, (0, 0, w, h)) > 0.5
    for _, iris in eye_groups(landmarks):
        c, r = iris_circle(landmarks, iris)
        d = np.hypot(xx - c[0], yy - c[1])
        ring = (d > 0.35 * r) & (d < 0.95 * r) & inside
        if not ring.any():
            continue
        px = out[ring]
        luma = px @ LUMA
        rel = luma / max(1.0, float(np.median(luma)))
        keep = rel < 1.4
        px[keep] = np.array(colour, np.float32)[None] * rel[keep, None]
        out[ring] = px
    painted: np.ndarray = np.clip(out + 0.5, 0, 255).astype(np.uint8)
    return painted


def variant(image: np.ndarray, name: str) -> np.ndarray:
    """A reproducible variant (RGB uint8) of ``image``: one of :data:`VARIANTS`
    ("native" is the image itself; "relit" a gain ramp 0.65-1.25 left to right)."""
    if name == "native":
        return image
    if name == "mirrored":
        return np.ascontiguousarray(image[:, ::-1])
    h, w = image.shape[:2]
    if name.startswith("tilt"):
        rot = cv2.getRotationMatrix2D((w / 2, h / 2), float(name[4:]), 1.0)
        return cv2.warpAffine(image, rot, (w, h), flags=cv2.INTER_CUBIC,
                              borderMode=cv2.BORDER_REFLECT_101)
    if name == "relit":
        ramp = np.linspace(0.65, 1.25, w, dtype=np.float32)[None, :, None]
        out: np.ndarray = np.clip(image.astype(np.float32) * ramp, 0, 255).astype(np.uint8)
        return out
    raise ValueError(name)
