"""The picture on strangers: identity and defects of degree-100 fusions of real people.

Every ordered pair of distinct people among the single-face portraits of a folder of
real photos (``--photos``, by default ``../shared/faces``: ``NAME_1.jpg``,
``NAME_2.jpg``, ... are one person; ``group_*`` and ``*partial*`` photos are left
out) and the five sample photos, each at its own size, fused at degree 100 with the
default options (``--option key=value`` changes one). Each source is its person's
first photo. Figures per pair:

* **identity** by dlib's own pipeline (HOG detector, 5-point chip, ResNet: not the
  engine's analysis), the output against a *different* photo of the source person
  where one exists (``d_src``) and against the target photo (``d_tgt``):
  *nearer source* ``d_src < d_tgt``, *same person* ``d_src < 0.6`` (dlib's rule),
  *still the target* ``d_tgt < 0.6``; pairs whose source has one photo only count
  in *nearer the fused photo* (against the source photo itself);
* **detail ratio** (band-pass energy of the output's face skin over the target's,
  ``bench/realism.py``'s), **degree-1 PSNR** of the face region (dB), **tone** (ΔE
  of the face skin's mean Lab, output against target);
* **defect detectors**, each a share or a difference against the target's own photo
  at the same pixels: *dark lines* (new thin dark structures around the eyes: the
  share of the glasses zone's pixels whose black-hat response grew by over
  :data:`DARK_LINE_BOUND` grey levels: carried frames, painted liner), *beard luma*
  (the output's mean luma in the beard zone minus the target's, grey levels: a
  carried beard darkens it), *hard patches* (the share of the face's pixels whose
  edge strength exceeds the target's by over ``realism.EDGE_BOUND``), *teeth*
  (where the target's lips are closed: the share of the lips' pixels that turned
  bright and grey).

With ``--sheet DIR`` it writes one 1:1 crop per pair (target | output, no
downscaling) for a reviewer.

    .venv/bin/python bench/people.py [--photos DIR] [--sheet DIR] [--option k=v ...]

Writes bench/results/people.json and the "people" section of BENCHMARKS.md
(``--out DIR``: only the JSON, there).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

#: dlib's same-person rule.
SAME_PERSON = 0.6
#: Black-hat growth (grey levels) that counts as a new dark line around the eyes,
#: and the share of the glasses zone that makes a pair count.
DARK_LINE_BOUND = 20.0
DARK_LINE_SHARE = 0.03


@dataclass
class Photo:
    """One portrait: ``person``, ``rgb`` (H, W, 3) uint8, the engine's face, dlib's
    descriptor (128,) or None when dlib finds no face."""

    name: str
    person: str
    rgb: np.ndarray
    face: Any
    dlib: np.ndarray | None


def person_of(stem: str) -> str:
    """``kit_harington_2`` → ``kit_harington``; a name without a number is its own."""
    head, _, tail = stem.rpartition("_")
    return head if head and tail.isdigit() else stem


def portraits(folder: Path) -> list[Path]:
    """The single-face portraits of ``folder`` (no groups, no cut-off faces)."""
    return sorted(p for p in folder.iterdir()
                  if p.suffix.lower() in (".jpg", ".jpeg", ".png")
                  and not p.name.startswith("group_") and "partial" not in p.name)


def _luma(rgb: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY).astype(np.float32)


def _poly_mask(shape: tuple[int, ...], landmarks: np.ndarray,
               contours: tuple[tuple[int, ...], ...]) -> np.ndarray:
    canvas = np.zeros(shape[:2], np.uint8)
    for idx in contours:
        pts = np.round(landmarks[list(idx), :2]).astype(np.int32)
        cv2.fillPoly(canvas, [cv2.convexHull(pts)], 255)
    return canvas > 0


def dark_lines(out: np.ndarray, tgt: np.ndarray, landmarks: np.ndarray) -> float:
    """Share of the glasses zone's pixels (the rings around the eyes, the nose
    bridge, the temples; not the eyes or brows themselves) whose black-hat (thin
    dark structure) response grew by over :data:`DARK_LINE_BOUND` from the target
    to the output: a carried frame, a painted liner's wing, a strand of hair."""
    from facefuse.fusion.geometry import eye_distance
    from facefuse.fusion.swappers.classic import regions

    d = eye_distance(landmarks)
    k = max(3, round(0.08 * d) | 1)
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (k, k))
    zone = regions.glasses_zone(landmarks, tgt.shape[:2])[0]
    grew = (cv2.morphologyEx(_luma(out), cv2.MORPH_BLACKHAT, kernel)
            - cv2.morphologyEx(_luma(tgt), cv2.MORPH_BLACKHAT, kernel))
    return float(np.mean(grew[zone] > DARK_LINE_BOUND)) if zone.any() else 0.0


def beard_luma(out: np.ndarray, tgt: np.ndarray, landmarks: np.ndarray) -> float:
    """Mean luma of the beard zone, output minus target (grey levels)."""
    from facefuse.fusion.swappers.classic import regions

    zone = regions.beard_zone(landmarks, tgt.shape[:2]) > 0.5
    if not zone.any():
        return 0.0
    return float(_luma(out)[zone].mean() - _luma(tgt)[zone].mean())


def teeth(out: np.ndarray, tgt: np.ndarray, landmarks: np.ndarray) -> float:
    """Where the target's lips are closed: the share of the lips' pixels that are
    bright and grey in the output but not in the target (0 for an open mouth)."""
    from facefuse.faces import topology as topo
    from facefuse.fusion import mask as masks

    if masks.mouth_open(landmarks):
        return 0.0
    lips = _poly_mask(tgt.shape, landmarks, (topo.LIPS_OUTER,))

    def toothy(rgb: np.ndarray) -> np.ndarray:
        hsv = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)
        return (hsv[..., 2] > 170) & (hsv[..., 1] < 60)

    return float(np.mean(toothy(out)[lips] & ~toothy(tgt)[lips])) if lips.any() else 0.0


def tone(out: np.ndarray, tgt: np.ndarray, skin: np.ndarray) -> float:
    """ΔE (CIE76) of the mean Lab over ``skin``, output against target."""
    def mean_lab(rgb: np.ndarray) -> np.ndarray:
        lab = cv2.cvtColor(rgb.astype(np.float32) / 255.0, cv2.COLOR_RGB2LAB)
        m: np.ndarray = lab[skin].mean(0)
        return m

    return float(np.linalg.norm(mean_lab(out) - mean_lab(tgt))) if skin.any() else 0.0


def crop_box(face: Any, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The face's box grown a quarter to the sides, a third up, a sixth down."""
    x0, y0, x1, y1 = (int(v) for v in face.bbox)
    w, h = x1 - x0, y1 - y0
    return (max(0, x0 - w // 4), max(0, y0 - h // 3),
            min(shape[1], x1 + w // 4), min(shape[0], y1 + h // 6))


def parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` with ``true``/``false`` and numbers read as such."""
    key, _, value = text.partition("=")
    lowered = value.lower()
    if lowered in ("true", "false"):
        return key, lowered == "true"
    try:
        return key, float(value)
    except ValueError:
        return key, value


def main() -> None:
    from dlib_ref import reference

    import facefuse
    from facefuse.fusion import mask as masks
    from facefuse.fusion.types import FuseOptions
    from facefuse.toolchain.samples import fetch_samples, identity_of
    from realism import band_energy, hard_patch_share, psnr, skin_mask
    from report import machine, publish, write_json

    root = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--photos", type=Path, default=root.parent / "shared" / "faces")
    ap.add_argument("--sheet", type=Path, help="write 1:1 crops (target | output) here")
    ap.add_argument("--option", action="append", default=[], help="a FuseOptions field=value")
    ap.add_argument("--no-samples", action="store_true", help="leave the five samples out")
    ap.add_argument("--out", help="write only the JSON, into this folder")
    ap.add_argument("--before", type=Path,
                    help="a people.json of another tree (same photos): its figures beside")
    args = ap.parse_args()
    options = FuseOptions(**dict(parse_option(o) for o in args.option))
    fuser = facefuse.default_fuser()
    settings = fuser.settings
    dref = reference(settings)

    def load(name: str, person: str, path: Path) -> Photo | None:
        bgr = cv2.imread(str(path))
        if bgr is None:
            return None
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        faces = fuser.analyser.analyse(rgb, embed=False)
        if not faces:
            return None
        try:
            desc: np.ndarray | None = dref.face(rgb).descriptor
        except AssertionError:
            desc = None
        return Photo(name, person, rgb, faces[0], desc)

    paths = {p.stem: (person_of(p.stem), p) for p in portraits(args.photos)}
    if not args.no_samples:
        for name, path in fetch_samples(settings.samples_dir, settings.downloads_dir).items():
            paths[f"sample_{name}"] = (identity_of(name).lower().replace(" ", "_"), path)
    photos = [ph for name, (person, path) in sorted(paths.items())
              if (ph := load(name, person, path)) is not None]
    people: dict[str, list[Photo]] = {}
    for ph in photos:
        people.setdefault(ph.person, []).append(ph)
    if args.sheet:
        args.sheet.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for src_person, src_photos in people.items():
        src = src_photos[0]
        other = src_photos[1] if len(src_photos) > 1 else None
        for tgt_person, tgt_photos in people.items():
            if tgt_person == src_person:
                continue
            tgt = tgt_photos[0]
            out = fuser.fuse_faces(src.rgb, src.face, tgt.rgb.copy(), [tgt.face], [0],
                                   options).image
            faint = fuser.fuse_faces(src.rgb, src.face, tgt.rgb.copy(), [tgt.face], [0],
                                     dataclasses.replace(options, degree=1.0)).image
            lm = tgt.face.landmarks.astype(np.float64)
            skin = skin_mask(tgt.rgb.shape, lm)
            x0, y0, x1, y1 = crop_box(tgt.face, tgt.rgb.shape)
            mask = (masks.oval_mask(lm, (0, 0, tgt.rgb.shape[1], tgt.rgb.shape[0]))
                    * 255.0)
            row: dict[str, Any] = {
                "source": src.name, "target": tgt.name,
                "detail": band_energy(out, skin) / max(band_energy(tgt.rgb, skin), 1e-9),
                "psnr_degree1": psnr(faint[y0:y1, x0:x1], tgt.rgb[y0:y1, x0:x1]),
                "tone_de": tone(out, tgt.rgb, skin),
                "dark_lines": dark_lines(out, tgt.rgb, lm),
                "beard_luma": beard_luma(out, tgt.rgb, lm),
                "hard_patches": hard_patch_share(out, tgt.rgb, mask),
                "teeth": teeth(out, tgt.rgb, lm),
            }
            try:
                got: np.ndarray | None = dref.face(out).descriptor
            except AssertionError:
                got = None
            if got is not None and tgt.dlib is not None and src.dlib is not None:
                row["d_tgt"] = float(np.linalg.norm(got - tgt.dlib))
                row["d_fused_source"] = float(np.linalg.norm(got - src.dlib))
                if other is not None and other.dlib is not None:
                    row["d_src"] = float(np.linalg.norm(got - other.dlib))
            rows.append(row)
            if args.sheet:
                pair = np.concatenate([tgt.rgb[y0:y1, x0:x1], out[y0:y1, x0:x1]], axis=1)
                cv2.imwrite(str(args.sheet / f"{src.name}__{tgt.name}.png"),
                            cv2.cvtColor(pair, cv2.COLOR_RGB2BGR))
    summary = summarise(rows)
    m = machine()
    data = {"machine": m, "options": {k: v for k, v in vars(options).items()},
            "summary": summary, "rows": rows}
    write_json("people", data, args.out)
    before = None
    if args.before is not None:
        import json

        before = json.loads(args.before.read_text())["summary"]
    lines = report_lines(summary, m, args.option, before)
    if args.out is None:
        publish("people", lines)
    else:
        print("\n".join(lines))


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and medians over the pairs (see the module doc)."""
    judged = [r for r in rows if "d_src" in r]
    seen = [r for r in rows if "d_tgt" in r]

    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in rows)) if rows else float("nan")

    return {
        "pairs": len(rows),
        "identity_pairs": len(judged),
        "nearer_source": sum(r["d_src"] < r["d_tgt"] for r in judged),
        "same_person": sum(r["d_src"] < SAME_PERSON for r in judged),
        "still_target": sum(r["d_tgt"] < SAME_PERSON for r in judged),
        "seen_pairs": len(seen),
        "nearer_fused_photo": sum(r["d_fused_source"] < r["d_tgt"] for r in seen),
        "still_target_all": sum(r["d_tgt"] < SAME_PERSON for r in seen),
        "detail_median": med("detail"),
        "detail_worst": min((r["detail"] for r in rows), default=float("nan")),
        "psnr_degree1_worst": min((r["psnr_degree1"] for r in rows), default=float("nan")),
        "tone_de_median": med("tone_de"),
        "dark_lines_pairs": sum(r["dark_lines"] > DARK_LINE_SHARE for r in rows),
        "beard_darkened_pairs": sum(r["beard_luma"] < -8.0 for r in rows),
        "hard_patch_median": med("hard_patches"),
        "teeth_pairs": sum(r["teeth"] > 0.02 for r in rows),
    }


def report_lines(s: dict[str, Any], m: dict[str, Any], opts: list[str],
                 before: dict[str, Any] | None = None) -> list[str]:
    """The figures of :func:`summarise` as a BENCHMARKS.md table (with ``before``,
    another tree's summary, in a column beside)."""
    from report import machine_line

    def row(label: str, fmt: Any) -> str:
        cells = [fmt(s)] if before is None else [fmt(before), fmt(s)]
        return f"| {label} | " + " | ".join(cells) + " |"

    def n(x: dict[str, Any]) -> int:
        return int(x["identity_pairs"])

    flags = "".join(f" --option {o}" for o in opts)
    head = ["| figure | value |", "|---|---:|"] if before is None else [
        "| figure | before | after |", "|---|---:|---:|"]
    figures: list[tuple[str, Any]] = [
        ("pairs (identity judged against another photo of the source)",
         lambda x: f"{x['pairs']} ({n(x)})"),
        ("nearer the source's other photo than the target",
         lambda x: f"{x['nearer_source']}/{n(x)}"),
        ("same person as the source (d < 0.6)", lambda x: f"{x['same_person']}/{n(x)}"),
        ("still the target (d < 0.6)", lambda x: f"{x['still_target']}/{n(x)}"),
        ("nearer the fused source photo, all pairs",
         lambda x: f"{x['nearer_fused_photo']}/{x['seen_pairs']}"),
        ("detail ratio median / worst",
         lambda x: f"{x['detail_median']:.2f} / {x['detail_worst']:.2f}"),
        ("degree-1 PSNR worst", lambda x: f"{x['psnr_degree1_worst']:.1f} dB"),
        ("tone ΔE median", lambda x: f"{x['tone_de_median']:.2f}"),
        ("new dark lines around the eyes (> 3 % of the glasses zone)",
         lambda x: str(x["dark_lines_pairs"])),
        ("beard zone darkened (> 8 grey levels)", lambda x: str(x["beard_darkened_pairs"])),
        ("hard-patch share median", lambda x: f"{x['hard_patch_median']:.4f}"),
        ("closed lips with teeth pixels (> 2 %)", lambda x: str(x["teeth_pairs"])),
    ]
    return [
        "Degree-100 fusions of real strangers: `.venv/bin/python bench/people.py"
        + flags + (" --before OTHER/people.json" if before is not None else "") + "`.",
        "",
        machine_line(m),
        "",
        *head,
        *(row(label, fmt) for label, fmt in figures),
    ]


if __name__ == "__main__":
    main()
