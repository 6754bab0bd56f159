"""Photo-realism of the fused face at the photo's own resolution, before/after in one run.

Every ordered pair of distinct identities among the real sample photos, at their
native 1-3 MP size, and reproducible variants of each target (mirrored, tilted
±12°, relit by a side gradient). The base commit's ``src/`` (``--base``) and this
checkout each render in their own worker process (the same virtual environment
and models); the figures are computed here from the images they return:

* **detail ratio**: band-pass energy (luma − Gaussian σ 1.2) of the output's face
  skin over the target's, same pixels (the target's face oval, eroded, without
  eyes, brows and lips), at degree 100 — the goal counts pairs whose source face
  is at least 0.8× the target's (eye distance);
* **degree-1 PSNR** of the fused region against the target (dB);
* **hard patches** in the blend band: pixels of the band (0.05 < mask < 0.95)
  whose edge strength (gradient of the σ = 2 px low-passed luma) exceeds the
  target's own at the same place by more than :data:`EDGE_BOUND` grey levels
  per pixel, as a share of the band: a patch with a hard edge the photo does
  not have shows there;
* **fusion stage** ms (median) with targets resized to 0.5 / 1.5 / 4 MP, the two
  workers alternating job by job.

    .venv/bin/python bench/realism.py [--base REV] [--repeat 3]

Writes bench/results/realism.json, the "realism" section of BENCHMARKS.md and a
before/after sheet of 1:1 face crops (no downscaling), docs/realism_sheet.jpg:
per row target | before | after.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Variants of each target: name -> function of the RGB image.
VARIANTS = ("native", "mirrored", "tilt+12", "tilt-12", "relit")
#: Megapixels of the targets in the cost rows.
COST_MP = (0.5, 1.5, 4.0)
#: Edge strength (grey levels per pixel, σ = 2 px) above the target's own that
#: counts as a hard patch edge: a smooth mask over a 0-255 photo moves the
#: low-passed gradient by a fraction of that, a pasted patch by several times it.
EDGE_BOUND = 6.0
#: Pairs shown on the 1:1 sheet (source, target variant).
SHEET = (("obama", "biden", "native"), ("biden", "obama3", "native"),
         ("astronaut", "obama", "native"), ("obama2", "biden", "tilt+12"))


def variant(image: np.ndarray, name: str) -> np.ndarray:
    """A reproducible variant (RGB uint8) of ``image``: the same as
    :func:`facefuse.toolchain.synthetic.variant`, kept here because the render
    worker runs on the base commit's ``src/``, which may not have it."""
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
        return np.clip(image.astype(np.float32) * ramp, 0, 255).astype(np.uint8)
    raise ValueError(name)


def resize_mp(image: np.ndarray, mp: float) -> np.ndarray:
    h, w = image.shape[:2]
    s = (mp * 1e6 / (h * w)) ** 0.5
    return cv2.resize(image, (round(w * s), round(h * s)),
                      interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_CUBIC)


def _png(image: np.ndarray) -> str:
    ok, buf = cv2.imencode(".png", image)
    assert ok
    return base64.b64encode(buf.tobytes()).decode()


def _unpng(data: str) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(base64.b64decode(data), np.uint8), cv2.IMREAD_UNCHANGED)


# ---- the worker side: one process per code version ---------------------------------

def memo_free_fuser() -> tuple[Any, dict[str, np.ndarray]]:
    """A ``FaceFuser`` of the facefuse on the path, with the renderer's per-source
    memo off (where that tree has one: every request of a service brings its own
    source, so timed repeats must not reuse it), and the decoded sample photos."""
    from facefuse.fusion.engine import FaceFuser
    from facefuse.imaging.decode import decode_image
    from facefuse.toolchain.samples import fetch_samples

    fuser = FaceFuser()
    for swapper in getattr(fuser, "swappers", {}).values():
        if hasattr(swapper, "sources"):
            swapper.sources = None
    paths = fetch_samples(fuser.settings.samples_dir, fuser.settings.downloads_dir)
    return fuser, {n: decode_image(p) for n, p in paths.items()}


def render_worker() -> None:
    """Answer one JSON line per request ``{"source", "target", "variant", "degree",
    "mp", "repeat"}``: the fused image and blend mask over the fused region (PNG,
    base64), the region and the fusion stage's median ms."""
    from facefuse.fusion.types import FuseOptions
    from report import answer_requests, median_ms

    fuser, photos = memo_free_fuser()
    faces: dict[tuple[str, str, float], Any] = {}

    def handle(q: dict[str, Any]) -> dict[str, Any]:
        tgt = variant(photos[q["target"]], q["variant"])
        if q["mp"]:
            tgt = resize_mp(tgt, q["mp"])
        src = photos[q["source"]]
        key = (q["target"], q["variant"], q["mp"])
        if key not in faces:
            faces[key] = fuser.analyser.analyse(tgt)
        sf = fuser.analyser.analyse(src)[0]
        tf = faces[key]
        opts = FuseOptions(degree=q["degree"], evaluate=False)

        def run(sf: Any = sf, tf: Any = tf, src: np.ndarray = src, tgt: np.ndarray = tgt,
                opts: Any = opts) -> Any:
            return fuser.fuse_faces(src, sf, tgt, tf, [0], opts)

        ms = median_ms(run, q["repeat"], warmup=1) if q["repeat"] else None
        res = run()
        x0, y0, x1, y1 = res.fused[0].region
        mask = np.clip(np.rint(res.fused[0].mask * 255), 0, 255).astype(np.uint8)
        return {"ms": ms, "region": [x0, y0, x1, y1],
                "image": _png(cv2.cvtColor(res.image[y0:y1, x0:x1], cv2.COLOR_RGB2BGR)),
                "mask": _png(mask)}

    answer_requests(handle, ready=False)


def render_worker_at(src: Path) -> AbstractContextManager[tuple[IO[str], IO[str]]]:
    """A ``--render-worker`` process importing facefuse from ``src``."""
    from report import worker_at

    return worker_at(__file__, "--render-worker", src, wait_s=120.0)


# ---- the figures -------------------------------------------------------------------

def _luma(rgb: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY).astype(np.float32)


def skin_mask(shape: tuple[int, ...], landmarks: np.ndarray) -> np.ndarray:
    """(H, W) bool: the face oval eroded by a feather width, without eyes, brows,
    lips (the features' own edges are not skin detail)."""
    from facefuse.faces import topology as topo
    from facefuse.fusion import mask as masks

    h, w = shape[:2]
    region = (0, 0, w, h)
    f = masks.feather_px(landmarks)
    skin = masks.oval_mask(landmarks, region, f) > 0.99
    canvas = np.zeros((h, w), np.uint8)
    for idx in (topo.EYE_IMAGE_LEFT, topo.EYE_IMAGE_RIGHT, topo.BROW_IMAGE_LEFT,
                topo.BROW_IMAGE_RIGHT, topo.LIPS_OUTER):
        pts = np.round(landmarks[list(idx), :2]).astype(np.int32)
        cv2.fillPoly(canvas, [cv2.convexHull(pts)], 255)
    canvas = cv2.dilate(canvas, np.ones((3, 3), np.uint8), iterations=max(1, round(0.25 * f)))
    out: np.ndarray = skin & (canvas == 0)
    return out


def band_energy(rgb: np.ndarray, where: np.ndarray) -> float:
    y = _luma(rgb)
    band = y - cv2.GaussianBlur(y, (0, 0), 1.2)
    return float(np.mean(np.square(band[where])))


def hard_patch_share(out: np.ndarray, tgt: np.ndarray, mask: np.ndarray) -> float:
    band = (mask > 0.05 * 255) & (mask < 0.95 * 255)
    if not band.any():
        return 0.0

    def edges(rgb: np.ndarray) -> np.ndarray:
        y = cv2.GaussianBlur(_luma(rgb), (0, 0), 2.0)
        return np.hypot(cv2.Sobel(y, cv2.CV_32F, 1, 0, ksize=3) / 8,
                        cv2.Sobel(y, cv2.CV_32F, 0, 1, ksize=3) / 8)

    excess = edges(out) - edges(tgt)
    return float(np.mean(excess[band] > EDGE_BOUND))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def evaluate(side: dict[str, Any], tgt: np.ndarray, skin: np.ndarray) -> dict[str, float]:
    x0, y0, x1, y1 = side["region"]
    out = cv2.cvtColor(_unpng(side["image"]), cv2.COLOR_BGR2RGB)
    ref = tgt[y0:y1, x0:x1]
    where = skin[y0:y1, x0:x1]
    return {"detail": band_energy(out, where) / max(band_energy(ref, where), 1e-9),
            "psnr": psnr(out, ref),
            "patch": hard_patch_share(out, ref, _unpng(side["mask"]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD~1", help="the commit to compare with")
    ap.add_argument("--repeat", type=int, default=3, help="timing repeats per cost job")
    ap.add_argument("--render-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="native variants only, no cost rows")
    args = ap.parse_args()
    if args.render_worker:
        render_worker()
        return
    from facefuse.fusion.engine import FaceFuser
    from facefuse.fusion.geometry import eye_distance
    from facefuse.imaging.decode import decode_image
    from facefuse.toolchain.samples import fetch_samples, identity_of
    from report import (
        ROOT,
        ask,
        export_src,
        machine,
        machine_line,
        short_rev,
        write_json,
        write_section,
    )

    fuser = FaceFuser()
    paths = fetch_samples(fuser.settings.samples_dir, fuser.settings.downloads_dir)
    photos = {n: decode_image(p) for n, p in paths.items()}
    names = sorted(photos)
    pairs = [(s, t) for s in names for t in names if identity_of(s) != identity_of(t)]
    variants = ("native",) if args.quick else VARIANTS
    eyes = {n: eye_distance(fuser.analyser.analyse(photos[n])[0].landmarks) for n in names}
    rows: list[dict[str, Any]] = []
    sheet: list[np.ndarray] = []
    cost: dict[str, dict[float, list[float]]] = {"before": {}, "after": {}}
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp, \
            render_worker_at(export_src(args.base, Path(tmp))) as old, \
            render_worker_at(ROOT / "src") as new:
        sides = {"before": old, "after": new}
        for t in names:
            for v in variants:
                tgt = variant(photos[t], v)
                faces = fuser.analyser.analyse(tgt)
                if not faces or faces[0].landmarks is None:
                    continue
                skin = skin_mask(tgt.shape, faces[0].landmarks)
                for s in (p[0] for p in pairs if p[1] == t):
                    row: dict[str, Any] = {"source": s, "target": t, "variant": v,
                                           "size_ratio": eyes[s] / eyes[t]}
                    for name, w in sides.items():
                        hi = ask(w, dict(source=s, target=t, variant=v, degree=100, mp=0, repeat=0))
                        lo = ask(w, dict(source=s, target=t, variant=v, degree=1, mp=0, repeat=0))
                        e = evaluate(hi, tgt, skin)
                        row[name] = {"detail": e["detail"], "patch": e["patch"],
                                     "psnr_degree1": evaluate(lo, tgt, skin)["psnr"]}
                        if (s, t, v) in SHEET:
                            hi["_img"] = cv2.cvtColor(_unpng(hi["image"]), cv2.COLOR_BGR2RGB)
                            row.setdefault("_sheet", {})[name] = hi
                    if "_sheet" in row:
                        x0, y0, x1, y1 = row["_sheet"]["after"]["region"]
                        parts = [tgt[y0:y1, x0:x1]]
                        for name in ("before", "after"):
                            part = row["_sheet"][name]["_img"]
                            parts.append(cv2.resize(part, (x1 - x0, y1 - y0))
                                         if part.shape[:2] != (y1 - y0, x1 - x0) else part)
                        sheet.append(np.concatenate(parts, 1))
                        del row["_sheet"]
                    rows.append(row)
                    print(s, t, v, {k: row[k] for k in ("before", "after")}, flush=True)
        if not args.quick:
            for _ in range(args.repeat):
                for mp in COST_MP:
                    for name, w in sides.items():
                        ms = [ask(w, dict(source=s, target=t, variant="native", degree=100,
                                          mp=mp, repeat=args.repeat))["ms"]
                              for s, t in (("obama", "biden"), ("biden", "obama3"))]
                        cost[name].setdefault(mp, []).append(statistics.median(ms))
    report(rows, cost, short_rev(args.base), machine(), time.time() - t0, sheet, ROOT,
           machine_line, write_json, write_section)


def _summary(rows: list[dict[str, Any]], side: str, key: str) -> tuple[float, float]:
    vals = [r[side][key] for r in rows]
    return statistics.median(vals), min(vals) if key != "patch" else max(vals)


def report(rows: list[dict[str, Any]], cost: dict[str, dict[float, list[float]]], base: str,
           m: dict[str, Any], seconds: float, sheet: list[np.ndarray], root: Path,
           machine_line: Any, write_json: Any, write_section: Any) -> None:
    goal = [r for r in rows if r["size_ratio"] >= 0.8]
    lines = [
        f"{machine_line(m)} Base {base} against this checkout, each in its own "
        f"worker process, {len(rows)} pair × variant rows ({len(goal)} with the source face "
        f"≥ 0.8× the target's), native sizes (0.3-3.3 MP), {seconds:.0f} s.",
        "Command: `.venv/bin/python bench/realism.py --base " + base + "`.",
        "",
        "| figure | before | after | goal |",
        "|---|---:|---:|---|",
    ]
    for label, key, which, fmt, g in (
            ("detail ratio, median (source ≥ 0.8× target)", "detail", 0, ".2f", "≥ 0.8"),
            ("detail ratio, worst (source ≥ 0.8× target)", "detail", 1, ".2f", "≥ 0.5"),
            ("degree-1 PSNR of the region, median (dB)", "psnr_degree1", 0, ".1f", ""),
            ("degree-1 PSNR of the region, worst (dB)", "psnr_degree1", 1, ".1f", "≥ 45"),
            ("hard-patch share of the blend band, median", "patch", 0, ".4f", ""),
            ("hard-patch share of the blend band, worst", "patch", 1, ".4f", "")):
        sel = goal if key == "detail" else rows
        b, a = _summary(sel, "before", key)[which], _summary(sel, "after", key)[which]
        lines.append(f"| {label} | {b:{fmt}} | {a:{fmt}} | {g} |")
    small = [r for r in rows if r["size_ratio"] < 0.8]
    if small:
        lines.append(f"| detail ratio, median (smaller sources, {len(small)} rows) | "
                     f"{_summary(small, 'before', 'detail')[0]:.2f} | "
                     f"{_summary(small, 'after', 'detail')[0]:.2f} | |")
    if cost["after"]:
        lines += ["", "Fusion stage (ms, median of rounds of the median of two pairs; "
                  "degree 100, 1 face; the workers alternate job by job):", "",
                  "| target | before | after | after / before |", "|---:|---:|---:|---:|"]
        for mp in sorted(cost["after"]):
            b = statistics.median(cost["before"][mp])
            a = statistics.median(cost["after"][mp])
            lines.append(f"| {mp:g} MP | {b:.1f} | {a:.1f} | {a / b:.2f} |")
    if sheet:
        width = max(s.shape[1] for s in sheet)
        padded = [np.pad(s, ((0, 8), (0, width - s.shape[1]), (0, 0)), constant_values=255)
                  for s in sheet]
        path = root / "docs" / "realism_sheet.jpg"
        cv2.imwrite(str(path), cv2.cvtColor(np.concatenate(padded, 0), cv2.COLOR_RGB2BGR),
                    [cv2.IMWRITE_JPEG_QUALITY, 90])
        lines += ["", "1:1 crops (no downscaling), per row target | before | after: "
                  "docs/realism_sheet.jpg."]
    write_json("realism", {"base": base, "machine": m, "rows": rows,
                           "cost": {k: {str(mp): v for mp, v in d.items()}
                                    for k, d in cost.items()}})
    write_section("realism", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
