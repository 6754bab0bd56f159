"""Probe a live ``facefuse serve`` with a hostile mix; report statuses and peak RSS.

Starts one server on a free loopback port (or probes ``--url`` and its ``--pid``),
then sends, in waves:

* overload: ``10 × max_inflight`` concurrent normal requests (real photos);
* maximal pixels: 8 concurrent ~39-megapixel PNGs of ~200 KB each;
* slow clients: trickled headers and stalled uploads (as many as in-flight slots);
* disconnects: uploads cut in the middle, requests abandoned while computed;
* malformed bodies: deeply nested JSON, strings and booleans for numbers, a
  truncated JPEG with an end marker appended, a truncated multipart body, a
  header declaring too many pixels;
* a group photo with more faces than the model queue holds.

It prints (and writes to ``bench/results/hostile.json`` and BENCHMARKS.md, section
"Hostile inputs") the requests sent, the statuses received, and the server's
VmRSS / VmHWM before and after. A 5xx other than 503 is a failure (exit status 1).

    FACEFUSE_HOME=... .venv/bin/python bench/hostile.py [--budget-mb 1000] [--no-write]
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "integration"))
from hostile_inputs import (  # the tests' generators
    declared_huge_png,
    group_photo,
    multipart,
    nested_json,
    raw_request,
    status_of,
    truncated_jpeg_with_eoi,
    truncated_multipart,
)
from server_harness import ServerProcess, photo_variants

from facefuse.config import Settings
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.samples import fetch_samples
from report import machine, machine_line, write_json, write_section

MAX_INFLIGHT = 8


def _rss(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            out[line.split(":")[0]] = int(line.split()[1]) // 1024
    return out


class Probe:
    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.statuses: collections.Counter[str] = collections.Counter()
        self.by_wave: dict[str, collections.Counter[int]] = {}
        self.lock = threading.Lock()

    def record(self, wave: str, status: int) -> None:
        with self.lock:
            self.statuses[str(status)] += 1
            self.by_wave.setdefault(wave, collections.Counter())[status] += 1

    def post(self, wave: str, path: str, **kw: Any) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=300) as c:
                status = c.post(path, **kw).status_code
        except httpx.TransportError:
            status = 0
        self.record(wave, status)

    def raw(self, wave: str, head: bytes, body: bytes = b"", **kw: Any) -> None:
        self.record(wave, status_of(raw_request(self.port, head, body, **kw)))

    def wave(self, name: str, jobs: list[Callable[[], None]], workers: int) -> None:
        t = time.monotonic()
        with ThreadPoolExecutor(workers) as pool:
            for f in [pool.submit(j) for j in jobs]:
                f.result()
        print(f"{name:>14}: {dict(sorted(self.by_wave[name].items()))} "
              f"in {time.monotonic() - t:.1f} s", flush=True)


def _head(length: int, ctype: str) -> bytes:
    return (f"POST /v1/faces HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def run(probe: Probe, samples: dict[str, Path]) -> None:
    images = {n: decode_image(p) for n, p in samples.items()}
    photos = photo_variants(images, 10 * MAX_INFLIGHT, seed=11)
    obama = samples["obama"].read_bytes()
    mp = "multipart/form-data; boundary=bnd"

    probe.wave("overload", [
        (lambda b=b: probe.post("overload", "/v1/faces", files={"image": ("p.jpg", b)}))
        for b in photos], workers=10 * MAX_INFLIGHT)
    huge = [declared_huge_png(39_000_000, seed=i) for i in range(8)]
    probe.wave("max pixels", [
        (lambda b=b: probe.post("max pixels", "/v1/faces", files={"image": ("h.png", b)}))
        for b in huge], workers=8)
    body = multipart({"image": ("a.jpg", obama)}, "bnd")
    head = _head(len(body), mp)
    slow: list[Callable[[], None]] = [
        (lambda: probe.raw("slow clients", head[:30], trickle=30, pause_s=0.01))
        for _ in range(MAX_INFLIGHT)]
    slow += [(lambda: probe.raw("slow clients", head, body[:100], trickle=len(head) + 100))
             for _ in range(MAX_INFLIGHT)]
    slow += [(lambda: probe.post("slow clients", "/v1/faces", files={"image": ("o.jpg", obama)}))
             for _ in range(4)]
    probe.wave("slow clients", slow, workers=len(slow))
    big = multipart({"image": ("b.png", declared_huge_png(8_000_000))}, "bnd")
    probe.wave("disconnects", [
        (lambda: probe.raw("disconnects", head, body[: len(body) // 2], read_timeout_s=0.5))
        for _ in range(4)] + [
        (lambda: probe.raw("disconnects", _head(len(big), mp), big, read_timeout_s=0.3))
        for _ in range(4)], workers=8)
    b64 = base64.b64encode(obama).decode()
    bad = [
        ("application/json", nested_json()),
        ("application/json", json.dumps({"image": b64, "landmarks": "true"}).encode()),
        ("application/json", json.dumps({"image": b64, "landmarks": 1}).encode()),
        (mp, multipart({"image": ("t.jpg", truncated_jpeg_with_eoi(obama))}, "bnd")),
        (mp, truncated_multipart({"image": ("a.jpg", obama)}, "bnd")),
        (mp, multipart({"image": ("h.png", declared_huge_png(60_000_000))}, "bnd")),
    ]
    probe.wave("malformed", [
        (lambda c=c, b=b: probe.post("malformed", "/v1/faces", content=b,
                                     headers={"Content-Type": c}))
        for c, b in bad * 4], workers=8)
    group = group_photo([images[n] for n in ("obama", "biden", "obama2", "obama3")], 4, 4)
    probe.wave("many faces", [
        (lambda: probe.post("many faces", "/v1/embed", files={"image": ("g.jpg", group)}))
        for _ in range(4)], workers=4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-mb", type=int, default=1000, help="FACEFUSE_MEMORY_BUDGET_MB")
    ap.add_argument("--no-write", action="store_true", help="do not update BENCHMARKS.md")
    args = ap.parse_args()
    settings = Settings.from_env()
    samples = fetch_samples(settings.samples_dir, settings.downloads_dir)
    env = {"FACEFUSE_MEMORY_BUDGET_MB": str(args.budget_mb),
           "FACEFUSE_MAX_INFLIGHT": str(MAX_INFLIGHT), "FACEFUSE_MAX_QUEUE_SIZE": "8",
           "FACEFUSE_HEADER_TIMEOUT_S": "5", "FACEFUSE_BODY_TIMEOUT_S": "5"}
    logdir = Path(tempfile.mkdtemp(prefix="facefuse-hostile-"))
    server = ServerProcess(settings.home, logdir, env, name="hostile").start()
    print(f"server log: {server.log_path}")
    try:
        before = _rss(server.pid)
        probe = Probe(server.port)
        t0 = time.monotonic()
        run(probe, samples)
        after = _rss(server.pid)
        seconds = time.monotonic() - t0
    finally:
        server.stop()
    sent = sum(probe.statuses.values())
    bad = {s: n for s, n in probe.statuses.items() if s.startswith("5") and s != "503"}
    result = {"requests": sent, "statuses": dict(sorted(probe.statuses.items())),
              "waves": {k: dict(sorted(v.items())) for k, v in probe.by_wave.items()},
              "rss_mb_before": before["VmRSS"], "rss_mb_after": after["VmRSS"],
              "vmhwm_mb": after["VmHWM"], "budget_mb": args.budget_mb,
              "seconds": round(seconds, 1), "env": env, "machine": machine()}
    print(f"{sent} requests, statuses {result['statuses']}; RSS {before['VmRSS']} -> "
          f"{after['VmRSS']} MB, VmHWM {after['VmHWM']} MB (budget {args.budget_mb} MB)")
    if not args.no_write:
        write_json("hostile", result)
        rows = "\n".join(f"| {k} | {', '.join(f'{s}: {n}' for s, n in v.items())} |"
                         for k, v in result["waves"].items())
        write_section("Hostile inputs (`bench/hostile.py`)", f"""\
`FACEFUSE_HOME=... .venv/bin/python bench/hostile.py --budget-mb {args.budget_mb}`: one
server (`FACEFUSE_MAX_INFLIGHT={MAX_INFLIGHT}`, 5 s header/body timeouts, memory budget
{args.budget_mb} MB) on loopback, {sent} requests in waves ({seconds:.0f} s). Status 0:
the probe closed the connection itself (a disconnect); 408: a slow client cut off.

| wave | statuses |
|---|---|
{rows}

Peak RSS (VmHWM) {after['VmHWM']} MB under a {args.budget_mb} MB budget; RSS
{before['VmRSS']} MB before, {after['VmRSS']} MB after. No 5xx but 503.

{machine_line(result['machine'])} Shared with other jobs: timings are indicative.
""")
    return 1 if bad or after["VmHWM"] > args.budget_mb else 0


if __name__ == "__main__":
    sys.exit(main())
