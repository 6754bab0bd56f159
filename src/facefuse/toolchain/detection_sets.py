"""Reproducible detection test sets built from the sample photos.

Every case is an RGB image and the boxes of the faces it shows, so detectors
can be scored for recall (faces found / faces present) and false positives.
The true face boxes of the sample photos are the 468-point mesh bounds of
each upright photo (checked by eye); every transform below maps them exactly.

Kinds of case (all deterministic, seeded where random):

* ``sample``: the five photos as they are;
* ``rotated``: each photo turned 90°, 180°, 270°;
* ``downscaled``: each photo shrunk so its face is 48, 28 or 18 px wide;
* ``group``: several portraits (head and shoulders) pasted on a face-free
  photo at face widths from 20 to 200 px;
* ``edge``: one portrait with up to a third of its face outside the frame,
  at each border;
* ``large``: the face filling most of the frame;
* ``face-free``: scikit-image photos with no face (coffee, a cat, a rocket,
  a motorcycle, a galaxy field): every detection there is a false positive.

Two more sets, apart from :func:`detection_cases`, for the frame's edge
(:func:`frame_cut_cases`, :func:`corner_cases`): a large face cut out of the photo
by its own frame, and small faces cut at the four corners of a 1–2 MP group.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from facefuse.toolchain.sources import SKIMAGE, materialise

#: Mesh bounds ``x0, y0, x1, y1`` (pixels) of the face in each upright sample photo.
SAMPLE_FACES: dict[str, tuple[float, float, float, float]] = {
    "astronaut": (177.0, 68.0, 273.0, 175.0),
    "biden": (421.0, 227.0, 708.0, 554.0),
    "obama": (375.0, 131.0, 614.0, 418.0),
    "obama2": (188.0, 276.0, 481.0, 620.0),
    "obama3": (636.0, 297.0, 912.0, 606.0),
}

#: name -> member of the pinned scikit-image wheel (photos without faces).
FACE_FREE: dict[str, str] = {
    "coffee": "skimage/data/coffee.png",
    "chelsea": "skimage/data/chelsea.png",
    "rocket": "skimage/data/rocket.jpg",
    "motorcycle": "skimage/data/motorcycle_left.png",
    "hubble": "skimage/data/hubble_deep_field.jpg",
}

#: Fractions of the face box pushed outside the frame in ``edge`` cases.
EDGE_CUTS = (0.15, 0.33)
#: Face widths (pixels) of ``downscaled`` cases.
DOWNSCALED_WIDTHS = (48, 28, 18)


@dataclass(frozen=True)
class Case:
    """One image and its faces.

    ``faces`` (K, 4) float64 ``x0, y0, x1, y1`` clipped to the image; per face,
    ``sources`` names the sample photo it comes from and ``maps`` (K, 2, 3)
    holds the affine from that photo's pixels to this image's, so any point
    known on the photo (a reference landmark) can be placed here.
    """

    name: str
    kind: str
    image: np.ndarray
    faces: np.ndarray
    sources: tuple[str, ...] = ()
    maps: np.ndarray = field(default_factory=lambda: np.zeros((0, 2, 3)))


def affine(scale: float = 1.0, tx: float = 0.0, ty: float = 0.0) -> np.ndarray:
    """(2, 3) ``p -> scale * p + (tx, ty)``."""
    return np.array([[scale, 0.0, tx], [0.0, scale, ty]])


def compose(outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """(2, 3) affine applying ``inner`` then ``outer``."""
    out: np.ndarray = outer[:, :2] @ inner
    out[:, 2] += outer[:, 2]
    return out


def apply(m: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Points (..., 2) through the (2, 3) affine ``m``."""
    p = np.asarray(points, np.float64)
    out: np.ndarray = p @ m[:, :2].T + m[:, 2]
    return out


def map_box(m: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The bounds of a box's corners through ``m`` (exact for scales, shifts, quarter turns)."""
    x0, y0, x1, y1 = box
    q = apply(m, np.array([[x0, y0], [x1, y0], [x0, y1], [x1, y1]]))
    return np.array([*q.min(axis=0), *q.max(axis=0)])


def fetch_face_free(dest_dir: Path, downloads_dir: Path) -> dict[str, Path]:
    """Fetch (if needed) and verify the face-free photos; name -> path."""
    return {
        name: materialise(SKIMAGE, member, dest_dir / Path(member).name, downloads_dir)
        for name, member in FACE_FREE.items()
    }


def _resize(image: np.ndarray, scale: float) -> np.ndarray:
    h, w = image.shape[:2]
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    return cv2.resize(image, size, interpolation=interp)


def turn_map(k: int, w: int, h: int) -> np.ndarray:
    """(2, 3) affine from a W×H image's pixels to the image turned k×90°
    counter-clockwise (``np.rot90``); continuous coordinates."""
    m = affine()
    for _ in range(k % 4):
        m = compose(np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, float(w)]]), m)
        w, h = h, w
    return m


def portrait(
    photo: np.ndarray, face: np.ndarray, face_width: float
) -> tuple[np.ndarray, np.ndarray]:
    """Head and shoulders around ``face`` scaled so the face is ``face_width`` px wide.

    Returns ``(crop RGB uint8, (2, 3) affine from the photo's pixels to the crop's)``.
    """
    x0, y0, x1, y1 = face
    fw, fh = x1 - x0, y1 - y0
    h, w = photo.shape[:2]
    cx0, cy0 = max(0, int(x0 - 0.6 * fw)), max(0, int(y0 - 0.5 * fh))
    cx1, cy1 = min(w, int(x1 + 0.6 * fw)), min(h, int(y1 + 0.9 * fh))
    scale = face_width / fw
    crop = _resize(photo[cy0:cy1, cx0:cx1], scale)
    return crop, affine(scale, -cx0 * scale, -cy0 * scale)


def _background(face_free: dict[str, np.ndarray], name: str, w: int, h: int) -> np.ndarray:
    img = face_free[name]
    return cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA)


def _paste(canvas: np.ndarray, crop: np.ndarray, x: int, y: int) -> None:
    """Paste ``crop`` with its top-left at (x, y), clipped to the canvas."""
    h, w = canvas.shape[:2]
    ch, cw = crop.shape[:2]
    sx0, sy0 = max(0, -x), max(0, -y)
    dx0, dy0 = max(0, x), max(0, y)
    dx1, dy1 = min(w, x + cw), min(h, y + ch)
    if dx1 > dx0 and dy1 > dy0:
        canvas[dy0:dy1, dx0:dx1] = crop[sy0 : sy0 + dy1 - dy0, sx0 : sx0 + dx1 - dx0]


def _case(name: str, kind: str, image: np.ndarray,
          placed: list[tuple[str, np.ndarray]]) -> Case:
    """A case whose faces are the sample faces ``(source, affine)`` placed in ``image``."""
    h, w = image.shape[:2]
    boxes = [map_box(m, np.array(SAMPLE_FACES[src])) for src, m in placed]
    faces = np.array(boxes, np.float64).reshape(-1, 4)
    faces[:, [0, 2]] = faces[:, [0, 2]].clip(0, w)
    faces[:, [1, 3]] = faces[:, [1, 3]].clip(0, h)
    maps = np.array([m for _, m in placed], np.float64).reshape(-1, 2, 3)
    return Case(name, kind, image, faces, tuple(src for src, _ in placed), maps)


def group_photo(
    photos: dict[str, np.ndarray], face_free: dict[str, np.ndarray], seed: int,
    size: tuple[int, int] = (1280, 720), count: int = 6,
) -> Case:
    """``count`` portraits on a face-free photo, face widths 20–200 px (log-uniform)."""
    rng = np.random.default_rng(seed)
    w, h = size
    canvas = _background(face_free, ("rocket", "motorcycle", "coffee")[seed % 3], w, h)
    cols = 3
    rows = -(-count // cols)
    cell_w, cell_h = w // cols, h // rows
    names = sorted(photos)
    placed: list[tuple[str, np.ndarray]] = []
    for i in range(count):
        name = names[(i + seed) % len(names)]
        fw = float(np.exp(rng.uniform(np.log(20), np.log(200))))
        crop, m = portrait(photos[name], np.array(SAMPLE_FACES[name]), fw)
        fit = min(1.0, cell_w / crop.shape[1], cell_h / crop.shape[0])
        if fit < 1.0:
            crop, m = _resize(crop, fit), compose(affine(fit), m)
        r, c = divmod(i, cols)
        x = c * cell_w + int(rng.integers(0, max(1, cell_w - crop.shape[1] + 1)))
        y = r * cell_h + int(rng.integers(0, max(1, cell_h - crop.shape[0] + 1)))
        _paste(canvas, crop, x, y)
        placed.append((name, compose(affine(1.0, x, y), m)))
    return _case(f"group-{seed}", "group", canvas, placed)


def lineup(
    photos: dict[str, np.ndarray], faces: Sequence[tuple[str, float]],
    height: int = 560, grey: int = 118,
) -> Case:
    """Portraits side by side on a flat grey canvas, bottoms aligned: ``faces`` lists
    ``(sample name, face width px)`` left to right. A reproducible group photo whose
    faces have known, chosen sizes (say one deliberately below the fusion's limit)."""
    crops = [(name, *portrait(photos[name], np.array(SAMPLE_FACES[name]), fw))
             for name, fw in faces]
    gap = 24
    w = gap + sum(c.shape[1] + gap for _, c, _ in crops)
    canvas = np.full((height, w, 3), grey, np.uint8)
    placed: list[tuple[str, np.ndarray]] = []
    x = gap
    for name, crop, m in crops:
        y = height - crop.shape[0]
        _paste(canvas, crop, x, y)
        placed.append((name, compose(affine(1.0, x, y), m)))
        x += crop.shape[1] + gap
    return _case("lineup-" + "-".join(f"{n}{fw:.0f}" for n, fw in faces), "group", canvas,
                 placed)


def edge_cases(photos: dict[str, np.ndarray], face_free: dict[str, np.ndarray]) -> Iterator[Case]:
    """Each portrait pushed over each border by each fraction of :data:`EDGE_CUTS`."""
    w, h = 640, 480
    for n, name in enumerate(sorted(photos)):
        crop, m = portrait(photos[name], np.array(SAMPLE_FACES[name]), 150.0)
        face = map_box(m, np.array(SAMPLE_FACES[name]))
        fw, fh = face[2] - face[0], face[3] - face[1]
        for side in ("left", "right", "top", "bottom"):
            for cut in EDGE_CUTS:
                canvas = _background(face_free, ("motorcycle", "rocket")[n % 2], w, h)
                # Face centred on the other axis; pushed out by `cut` of its size on this one.
                x = int(w / 2 - (face[0] + face[2]) / 2)
                y = int(h / 2 - (face[1] + face[3]) / 2)
                if side == "left":
                    x = int(-face[0] - cut * fw)
                elif side == "right":
                    x = int(w - face[2] + cut * fw)
                elif side == "top":
                    y = int(-face[1] - cut * fh)
                else:
                    y = int(h - face[3] + cut * fh)
                _paste(canvas, crop, x, y)
                yield _case(f"{name}-{side}-{cut:.2f}", "edge", canvas,
                            [(name, compose(affine(1.0, x, y), m))])


#: Fractions of the face cut off by the frame in :func:`frame_cut_cases`.
FRAME_CUTS = (0.2, 0.3, 0.4)
#: Frame side / face side in :func:`frame_cut_cases` (1.3: the face fills the frame).
FRAME_SPANS = (1.3, 2.0)


def frame_cut_cases(photos: dict[str, np.ndarray]) -> list[Case]:
    """Each photo cropped so ``cut`` of its face lies outside the left, right, top or
    bottom edge (kind ``cut``): a frame :data:`FRAME_SPANS` times the face's size
    (1.25 times taller), clipped to the photo on the other sides. Native pixels,
    no resampling: what a close selfie or a tight crop does to a face."""
    out: list[Case] = []
    for name in sorted(photos):
        img = photos[name]
        h, w = img.shape[:2]
        f = np.array(SAMPLE_FACES[name])
        fw, fh = f[2] - f[0], f[3] - f[1]
        for span in FRAME_SPANS:
            cw, ch = span * fw, span * fh * 1.25
            for side in ("left", "right", "top", "bottom"):
                for cut in FRAME_CUTS:
                    x0 = {"left": f[0] + cut * fw,
                          "right": f[2] - cut * fw - cw}.get(side, (f[0] + f[2] - cw) / 2)
                    y0 = {"top": f[1] + cut * fh,
                          "bottom": f[3] - cut * fh - ch}.get(side, (f[1] + f[3] - ch) / 2)
                    x1, y1 = min(w, round(x0 + cw)), min(h, round(y0 + ch))
                    x0, y0 = max(0, round(x0)), max(0, round(y0))
                    crop = np.ascontiguousarray(img[y0:y1, x0:x1])
                    out.append(_case(f"{name}-span{span}-{side}-{cut:.2f}", "cut", crop,
                                     [(name, affine(1.0, -x0, -y0))]))
    return out


#: Face widths (pixels) and the fraction cut off on both axes in :func:`corner_cases`.
CORNER_WIDTHS = (50, 90, 160)
CORNER_CUTS = (0.0, 0.2, 0.35)
#: Image sizes of :func:`corner_cases` (0.9 and 2.1 MP; the second is tiled).
CORNER_SIZES = ((1280, 720), (1920, 1080))


def corner_cases(photos: dict[str, np.ndarray], face_free: dict[str, np.ndarray]) -> list[Case]:
    """Group photos with a face in each corner (kind ``corner``): four portraits
    ``face width`` px wide pushed out of the frame by ``cut`` of their size on both
    axes, and three whole faces (40, 80, 120 px) along the middle, on a face-free
    photo; every size × width × cut of :data:`CORNER_SIZES`, :data:`CORNER_WIDTHS`,
    :data:`CORNER_CUTS`. The corner faces come first in ``faces``."""
    names = sorted(photos)
    out: list[Case] = []
    for n, (w, h) in enumerate(CORNER_SIZES):
        for fwid in CORNER_WIDTHS:
            for cut in CORNER_CUTS:
                canvas = _background(face_free, ("rocket", "motorcycle", "coffee")[n % 3], w, h)
                placed: list[tuple[str, np.ndarray]] = []
                for k, (right, below) in enumerate(((0, 0), (1, 0), (0, 1), (1, 1))):
                    name = names[k % len(names)]
                    crop, m = portrait(photos[name], np.array(SAMPLE_FACES[name]), fwid)
                    face = map_box(m, np.array(SAMPLE_FACES[name]))
                    fw, fh = face[2] - face[0], face[3] - face[1]
                    x = int(w - face[2] + cut * fw) if right else int(-face[0] - cut * fw)
                    y = int(h - face[3] + cut * fh) if below else int(-face[1] - cut * fh)
                    _paste(canvas, crop, x, y)
                    placed.append((name, compose(affine(1.0, x, y), m)))
                for k, fw in enumerate((40.0, 80.0, 120.0)):
                    name = names[(k + 4) % len(names)]
                    crop, m = portrait(photos[name], np.array(SAMPLE_FACES[name]), fw)
                    x = int((k + 1) * w / 4 - crop.shape[1] / 2)
                    y = int(h / 2 - crop.shape[0] / 2)
                    _paste(canvas, crop, x, y)
                    placed.append((name, compose(affine(1.0, x, y), m)))
                out.append(_case(f"corners-{w}x{h}-face{fwid}-cut{cut:.2f}", "corner", canvas,
                                 placed))
    return out


def detection_cases(
    photos: dict[str, np.ndarray], face_free: dict[str, np.ndarray]
) -> list[Case]:
    """Every case of every kind (see the module docstring), in a fixed order."""
    cases: list[Case] = []
    for name in sorted(photos):
        img, face = photos[name], np.array(SAMPLE_FACES[name])
        h, w = img.shape[:2]
        cases.append(_case(name, "sample", img, [(name, affine())]))
        for k in (1, 2, 3):
            turned = np.ascontiguousarray(np.rot90(img, k))
            cases.append(_case(f"{name}-rot{90 * k}", "rotated", turned,
                               [(name, turn_map(k, w, h))]))
        for fw in DOWNSCALED_WIDTHS:
            small = _resize(img, fw / (face[2] - face[0]))
            # Each axis scaled by its own rounded ratio; equal within a pixel.
            m = np.array([[small.shape[1] / w, 0.0, 0.0], [0.0, small.shape[0] / h, 0.0]])
            cases.append(_case(f"{name}-face{fw}px", "downscaled", small, [(name, m)]))
        for margin in (0.05, 0.25):
            fw, fh = face[2] - face[0], face[3] - face[1]
            x0, y0 = max(0, int(face[0] - margin * fw)), max(0, int(face[1] - margin * fh))
            x1, y1 = min(w, int(face[2] + margin * fw)), min(h, int(face[3] + margin * fh))
            crop = np.ascontiguousarray(img[y0:y1, x0:x1])
            cases.append(_case(f"{name}-large{margin:.2f}", "large", crop,
                               [(name, affine(1.0, -x0, -y0))]))
    cases.extend(group_photo(photos, face_free, seed) for seed in range(3))
    cases.extend(edge_cases(photos, face_free))
    for name in sorted(face_free):
        cases.append(Case(name, "face-free", face_free[name], np.zeros((0, 4))))
    return cases


def pairs(found: np.ndarray, truth: np.ndarray) -> list[tuple[int, int]]:
    """``(detection, true face)`` index pairs: each box contains the other's centre;
    each true face and each detection is used at most once, best IoU first."""
    candidates: list[tuple[float, int, int]] = []
    for i, d in enumerate(found):
        dc = (d[:2] + d[2:]) / 2
        for j, t in enumerate(truth):
            tc = (t[:2] + t[2:]) / 2
            if _inside(dc, t) and _inside(tc, d):
                candidates.append((-_iou(d, t), i, j))
    out: list[tuple[int, int]] = []
    used_d: set[int] = set()
    used_t: set[int] = set()
    for _, i, j in sorted(candidates):
        if i not in used_d and j not in used_t:
            used_d.add(i)
            used_t.add(j)
            out.append((i, j))
    return out


def match(found: np.ndarray, truth: np.ndarray) -> tuple[int, int]:
    """``(faces found, false positives)`` of detected boxes (K, 4) against true boxes."""
    n = len(pairs(found, truth))
    return n, len(found) - n


def _inside(p: np.ndarray, box: np.ndarray) -> bool:
    return bool(box[0] <= p[0] <= box[2] and box[1] <= p[1] <= box[3])


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0
