"""Benchmark: the container image — size, what fills it, cold start.

Builds (in the same run, from the same prepared context and base) the slim image of
``deploy/Dockerfile`` and the naive single-stage image of ``bench/Dockerfile.naive``,
then reports for each: the image size (``podman image inspect``), the largest layers
(``podman history``), the virtual environment's size by package (a ``du`` of the
mounted image) and the cold start — process start to ``/readyz`` 200 — of the
image's entrypoint started from its own root filesystem under chroot (medians of
``--runs``; see tests/integration/image_rootfs.py for how it is started).

    .venv/bin/python bench/image_size.py [--runs 3] [--slim REF] [--naive REF]

Writes bench/results/image.json and the "image" section of BENCHMARKS.md. Needs root,
podman, buildah and network access to the Debian mirror (the naive image installs
build-essential with apt).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from report import ROOT, machine, machine_line, write_json, write_section

sys.path.insert(0, str(ROOT / "tests" / "integration"))
from image_rootfs import ChrootProcess, inspect, mounted
from server_harness import free_port


def build(dockerfile: str, name: str, extra: str = "") -> tuple[str, float]:
    # (The naive image installs what a plain pip install gives: the PyPI OpenCV.)
    env = {**os.environ, "IMAGE_NAME": name, "EXTRA_WHEELS": extra,
           **({"SLIM_OPENCV": "0"} if extra else {})}
    t0 = time.monotonic()
    out = subprocess.run(["bash", "scripts/build-image.sh", "--dockerfile", dockerfile],
                         cwd=ROOT, env=env, check=True, stdout=subprocess.PIPE, text=True)
    return out.stdout.strip().splitlines()[-1], time.monotonic() - t0


def size_bytes(ref: str) -> int:
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", ref],
                         check=True, capture_output=True, text=True).stdout
    return int(out.strip())


def layers(ref: str, top: int = 5) -> list[tuple[int, str]]:
    out = subprocess.run(["podman", "history", "--no-trunc", "--format", "json", ref],
                         check=True, capture_output=True, text=True).stdout
    rows = [(int(h.get("size", 0)), " ".join(str(h.get("CreatedBy", "")).split())[:90])
            for h in json.loads(out)]
    return sorted(rows, reverse=True)[:top]


def du_kib(path: Path) -> int:
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True).stdout
    return int(out.split()[0]) if out else 0


def venv_packages(root: Path, venv: str, top: int = 10) -> list[tuple[int, str]]:
    site = next((root / venv.lstrip("/") / "lib").glob("python3*/site-packages"))
    sizes = [(du_kib(p), p.name) for p in site.iterdir()]
    return sorted(sizes, reverse=True)[:top]


def cold_starts(ref: str, runs: int) -> list[float]:
    config = inspect(ref)
    times = []
    with mounted(ref) as root, tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            port = free_port()
            proc = ChrootProcess(root, config, ["--host", "127.0.0.1", "--port", str(port)],
                                 Path(tmp) / f"run{i}.log")
            try:
                times.append(proc.wait_ready(f"http://127.0.0.1:{port}/readyz"))
            finally:
                proc.stop()
    return times


def measure(ref: str, venv: str, runs: int) -> dict[str, Any]:
    with mounted(ref) as root:
        packages = venv_packages(root, venv)
        venv_kib = du_kib(root / venv.lstrip("/"))
        models_kib = du_kib(root / "models")
    starts = cold_starts(ref, runs)
    return {"ref": ref, "size": size_bytes(ref), "layers": layers(ref), "venv_kib": venv_kib,
            "models_kib": models_kib, "packages": packages, "cold_start_s": starts}


def mb(n: float) -> str:
    return f"{n / 1e6:.0f} MB"


def markdown(m: dict[str, Any], res: dict[str, dict[str, Any]], cmd: str) -> str:
    slim, naive = res["slim"], res.get("naive")
    lines = [
        "## Container image (`bench/image_size.py`)", "",
        machine_line(m) + " Shared machine; podman 4.3 `build --isolation chroot`.",
        f"Command: `{cmd}` — both images from the same context and the same local base "
        "(Debian bookworm minbase + python3.11, `scripts/build-base.sh`).", "",
        "| image | size | venv | models | cold start to /readyz 200 (median, runs) | build s |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name, r in res.items():
        starts = ", ".join(f"{s:.1f}" for s in r["cold_start_s"])
        median = statistics.median(r["cold_start_s"])
        lines.append(f"| {name} (`{r['ref']}`) | **{mb(r['size'])}** "
                     f"| {r['venv_kib'] / 1024:.0f} MiB | {r['models_kib'] / 1024:.0f} MiB "
                     f"| {median:.1f} s ({starts}) | {r['build_s']:.0f} |")
    if naive:
        lines.append(f"\nSlim vs naive: **{naive['size'] / slim['size']:.1f}× smaller** "
                     f"({mb(naive['size'])} → {mb(slim['size'])}).")
    for name, r in res.items():
        lines += ["", f"Largest layers, {name} (`podman history`):", "",
                  "| size | created by |", "|---:|---|"]
        lines += [f"| {mb(s)} | `{c.replace('|', '/')}` |" for s, c in r["layers"]]
        lines += ["", f"Largest entries of the venv's site-packages, {name} (`du -sk`):", "",
                  "| MiB | package |", "|---:|---|"]
        lines += [f"| {k / 1024:.1f} | {p} |" for k, p in r["packages"]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--slim", help="an already built slim image (skip its build)")
    ap.add_argument("--naive", help="an already built naive image (skip its build)")
    ap.add_argument("--no-naive", action="store_true", help="measure the slim image only")
    ap.add_argument("--benchmarks", action="store_true", help="write BENCHMARKS.md")
    args = ap.parse_args()
    res: dict[str, dict[str, Any]] = {}
    slim, t = (args.slim, 0.0) if args.slim else build("deploy/Dockerfile", "localhost/facefuse")
    res["slim"] = {**measure(slim, "/opt/facefuse", args.runs), "build_s": t}
    if not args.no_naive:
        naive, t = ((args.naive, 0.0) if args.naive else
                    build("bench/Dockerfile.naive", "localhost/facefuse-naive", "opencv-python"))
        res["naive"] = {**measure(naive, "/opt/venv", args.runs), "build_s": t}
    m = machine()
    write_json("image", {"machine": m, "images": res})
    cmd = ".venv/bin/python bench/image_size.py " + " ".join(sys.argv[1:])
    text = markdown(m, res, cmd.strip())
    print(text)
    if args.benchmarks:
        write_section("image", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
