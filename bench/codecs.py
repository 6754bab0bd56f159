"""Benchmark: the output encoders at 1–2 MP, in process, CPU time per image.

For distinct portraits (bench/serve.py's, ``--megapixels``), interleaved per image:
JPEG through Pillow (what ``imaging/encode.py`` writes) and through simplejpeg (4:2:0,
the same quality), with each one's mean absolute error against the pixels; PNG at
several zlib levels, with the file size. Times are CPU seconds of this thread
(``time.thread_time``): the encoders are single-threaded, so this is their cost even on
a shared machine, where wall times swing with the other work.

    .venv/bin/python bench/codecs.py [--images 10] [--megapixels 2] [--png 1,2,6]

Writes bench/results/codecs.json.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.imaging.decode import decode_image
from report import machine, write_json
from serve import Inputs


def cpu_ms(fn: Callable[[], bytes], repeat: int = 3) -> tuple[float, bytes]:
    """The least CPU milliseconds of ``repeat`` calls, and the last result."""
    best, out = float("inf"), b""
    for _ in range(repeat):
        t = time.thread_time()
        out = fn()
        best = min(best, (time.thread_time() - t) * 1000)
    return best, out


def pil(rgb: np.ndarray, fmt: str, **kw: Any) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format=fmt, **kw)
    return buf.getvalue()


def measure(rgb: np.ndarray, q: int, levels: list[int]) -> dict[str, Any]:
    """One image's row: each encoder's CPU ms and bytes (JPEG: and its error)."""
    row: dict[str, Any] = {"mp": round(rgb.shape[0] * rgb.shape[1] / 1e6, 2)}
    for name, fn in (
        ("jpeg_pillow", lambda: pil(rgb, "JPEG", quality=q, optimize=False)),
        ("jpeg_simplejpeg", lambda: simplejpeg.encode_jpeg(
            rgb, quality=q, colorspace="RGB", colorsubsampling="420")),
    ):
        ms, data = cpu_ms(fn)
        back = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), np.int16)
        row[name] = {"ms": round(ms, 2), "bytes": len(data),
                     "mean_abs": round(float(np.abs(back - rgb).mean()), 4)}
    for level in levels:
        ms, data = cpu_ms(lambda lv=level: pil(rgb, "PNG", compress_level=lv), 2)
        row[f"png{level}"] = {"ms": round(ms, 1), "bytes": len(data)}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=10)
    ap.add_argument("--megapixels", type=float, default=2.0)
    ap.add_argument("--png", default="1,2,6", help="zlib levels to time")
    ap.add_argument("--quality", type=int, default=92)
    args = ap.parse_args()
    levels = [int(x) for x in args.png.split(",")]
    inputs = Inputs(Settings.from_env(), seed=7, megapixels=args.megapixels)
    rows: list[dict[str, Any]] = []
    for _ in range(args.images):
        row = measure(decode_image(inputs.image()), args.quality, levels)
        rows.append(row)
        print(row, flush=True)
    keys = [k for k in rows[0] if k != "mp"]
    summary = {k: {m: statistics.median(r[k][m] for r in rows) for m in rows[0][k]}
               for k in keys}
    write_json("codecs", {"machine": machine(), "megapixels": args.megapixels,
                          "quality": args.quality, "rows": rows, "summary": summary})
    for k, v in summary.items():
        print(k, v)


if __name__ == "__main__":
    main()
