"""Benchmark: the HTTP service under closed-loop load on loopback.

Starts real ``facefuse serve`` processes (uvicorn, embedded defaults: in-process
caches, no Redis) and drives ``POST /v1/fuse`` with ``c`` clients, each sending its
next request as soon as the previous one is answered, for ``--duration`` seconds per
level, at concurrency 1, 2, 4, 8, 16, 32:

* ``distinct``: every request is a new (source, target) pair of new images
  (mirrored / cropped / scaled / brightened variants of the sample portraits, made
  before the run), so no cache can help;
* ``repeat30``: 30 % of the requests repeat a pair sent earlier in the level;
* batching on and off (``FACEFUSE_BATCHING=false``) in the same run: both servers
  are up side by side and their runs interleave level by level, plus ``/v1/embed``
  (model-bound) at concurrency 8 both ways in interleaved rounds;
* a sweep of ``max_queue_delay_ms`` (and batching off) at concurrency 8: all servers
  up at once, ``--rounds`` interleaved rounds, medians — other work on a shared
  machine drifts slowly, interleaving keeps it out of the comparison;
* the p50 of a cached fuse (the same request again and again, concurrency 1).

Per level: throughput, p50/p95/p99 latency, average batch size per model (from
/metrics deltas), L2 hit ratio (from ``X-Facefuse-Cache``) and the server's peak RSS
(VmHWM from /proc/<pid>/status). The load generator runs on the same cores as the
server, as a co-located client would.

    .venv/bin/python bench/serve.py [--duration 8] [--quick]

Writes bench/results/serve.json and the "serve" section of BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image, ImageEnhance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from facefuse.config import Settings
from facefuse.imaging.decode import decode_image
from facefuse.toolchain.samples import fetch_samples
from report import RESULTS, load1, machine, machine_line, write_json, write_section

CONCURRENCY = (1, 2, 4, 8, 16, 32)
PORTRAITS = ("obama", "obama2", "biden", "obama3")
MODELS = ("blazeface_full", "facemesh", "iris", "dlib_resnet")
Pair = tuple[bytes, bytes]


# --- inputs -----------------------------------------------------------------------------------


class Inputs:
    """A stream of distinct JPEG images (never the same pixels twice)."""

    def __init__(self, settings: Settings, seed: int = 0, megapixels: float | None = None) -> None:
        """``megapixels``: scale each portrait to this area before the per-image crop and
        0.7–1.0 rescale (default: a long side of 900 px, a typical upload)."""
        paths = fetch_samples(settings.samples_dir, settings.downloads_dir)
        self.bases = []
        for name in PORTRAITS:
            im = Image.fromarray(decode_image(paths[name]))
            scale = (900 / max(im.size) if megapixels is None
                     else (megapixels * 1e6 / (im.width * im.height)) ** 0.5)
            self.bases.append(im.resize((round(im.width * scale), round(im.height * scale)),
                                        Image.Resampling.LANCZOS))
        self.rng = random.Random(seed)
        self.count = 0
        self.lock = threading.Lock()

    def image(self) -> bytes:
        with self.lock:
            k = self.count
            self.count += 1
            r = random.Random(self.rng.random())
        im = self.bases[k % len(self.bases)]
        if r.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        w, h = im.size
        im = im.crop((r.randint(0, w // 30), r.randint(0, h // 30),
                      w - r.randint(0, w // 30), h - r.randint(0, h // 30)))
        s = r.uniform(0.7, 1.0)
        im = im.resize((round(im.width * s), round(im.height * s)), Image.Resampling.BILINEAR)
        im = ImageEnhance.Brightness(im).enhance(r.uniform(0.85, 1.15))
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=90)
        return buf.getvalue()

    def pairs(self, n: int) -> list[Pair]:
        return [(self.image(), self.image()) for _ in range(n)]


# --- the server -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``facefuse serve`` on a free loopback port with extra FACEFUSE_* settings."""

    def __init__(self, env: dict[str, str], log: Path, args: tuple[str, ...] = (),
                 command: tuple[str, ...] = ("-m", "facefuse.cli", "serve")) -> None:
        """``command``: what Python runs (default ``facefuse serve``); ``--port`` and
        ``args`` follow it."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full = {k: v for k, v in os.environ.items()
                if not k.startswith("FACEFUSE_") or k in ("FACEFUSE_HOME",)}
        full.update(env)
        with log.open("ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, *command, "--port", str(self.port), *args],
                env=full, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        end = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}); see {log}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > end:
                raise RuntimeError(f"server not ready; see {log}")
            time.sleep(0.1)

    def pids(self) -> list[int]:
        """The server process and its worker processes (``--workers``)."""
        pids = [self.proc.pid]
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
                pids += [int(p) for p in (task / "children").read_text().split()]
        return pids

    def peak_rss_mb(self) -> float:
        """VmHWM of the server process plus its worker processes (``--workers``)."""
        total = 0.0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) / 1024
        return total

    def samples(self, label: str, *names: str) -> list[tuple[str, str, float]]:
        """``(metric, its label's value, sample value)`` of every sample of the metrics
        ``names`` that ``/metrics`` shows now (one scrape)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = []
        for line in text.splitlines():
            name = line.split("{", 1)[0]
            if name in names and f'{label}="' in line:
                value = line.split(f'{label}="', 1)[1].split('"', 1)[0]
                out.append((name, value, float(line.rsplit(" ", 1)[1])))
        return out

    def cache_mb(self) -> dict[str, float] | None:
        """MB held by the in-process caches (``facefuse_cache_bytes``), per level
        (``l1``, ``l2``; L2 is 0 with Redis): their share of the RSS. None when it
        cannot be told: a server without the metric, or several worker processes
        (``/metrics`` then answers for one of them)."""
        if len(self.pids()) > 1:
            return None
        out: dict[str, float] = {}
        for _, level, value in self.samples("level", "facefuse_cache_bytes"):
            out[level] = out.get(level, 0.0) + value / 2**20
        return {k: round(v, 1) for k, v in out.items()} or None

    def batch_stats(self) -> dict[str, tuple[float, float]]:
        out: dict[str, list[float]] = {m: [0.0, 0.0] for m in MODELS}
        column = {"facefuse_batch_size_sum": 0, "facefuse_batch_size_count": 1}
        for name, model, value in self.samples("model", *column):
            if model in out:
                out[model][column[name]] = value
        return {m: (v[0], v[1]) for m, v in out.items()}

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def server(env: dict[str, str], log: Path, args: tuple[str, ...] = (),
           command: tuple[str, ...] | None = None) -> Iterator[Server]:
    s = Server(env, log, args) if command is None else Server(env, log, args, command)
    try:
        yield s
    finally:
        s.stop()


# --- load -------------------------------------------------------------------------------------


def process_cpu_s(pids: list[int]) -> tuple[float, float]:
    """User and system CPU seconds of ``pids`` so far (``/proc/PID/stat``; a process
    gone counts nothing)."""
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            user += int(fields[11])
            system += int(fields[12])
    return user / tick, system / tick


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """A server variant of the command line: ``name:A=1,B=2`` → ``("name", {"A": "1",
    "B": "2"})``, the environment of that server (values are split on commas: none in
    them)."""
    name, _, rest = text.partition(":")
    env = dict(item.split("=", 1) for item in rest.split(",") if item)
    return name, env


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.asarray(values), q))


def closed_loop(
    srv: Server, route: str, concurrency: int, duration: float, pairs: list[Pair],
    repeat: float = 0.0, seed: int = 0,
) -> dict[str, Any]:
    """``concurrency`` clients for ``duration`` s; each request takes the next unused pair,
    or (with probability ``repeat``) one already sent in this level."""
    lock = threading.Lock()
    cursor = 0
    sent: list[Pair] = []
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    hits = 0
    rng = random.Random(seed)
    start_stats = srv.batch_stats()
    stop_at = time.monotonic() + duration

    def next_pair() -> Pair:
        nonlocal cursor
        with lock:
            if sent and rng.random() < repeat:
                return rng.choice(sent)
            if cursor >= len(pairs):
                raise RuntimeError("ran out of distinct inputs; raise the pool size")
            pair = pairs[cursor]
            cursor += 1
            sent.append(pair)
            return pair

    def client() -> None:
        nonlocal hits
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            while time.monotonic() < stop_at:
                src, tgt = next_pair()
                t0 = time.perf_counter()
                if route == "/v1/fuse":
                    r = c.post(route, files={"source": ("s.jpg", src), "target": ("t.jpg", tgt)},
                               data={"degree": "80"})
                else:
                    r = c.post(route, files={"image": ("i.jpg", src)})
                dt = (time.perf_counter() - t0) * 1000.0
                with lock:
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    if r.status_code == 200:
                        latencies.append(dt)
                        hits += r.headers.get("x-facefuse-cache") == "hit"

    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    end_stats = srv.batch_stats()
    batch = {}
    for m in MODELS:
        items = end_stats[m][0] - start_stats[m][0]
        calls = end_stats[m][1] - start_stats[m][1]
        batch[m] = round(items / calls, 2) if calls else None
    ok = len(latencies)
    return {
        "concurrency": concurrency, "requests": ok, "errors": sum(statuses.values()) - ok,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "throughput_rps": round(ok / wall, 2),
        "p50_ms": round(percentile(latencies, 50), 1),
        "p95_ms": round(percentile(latencies, 95), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "hit_ratio": round(hits / ok, 3) if ok else 0.0,
        "avg_batch": batch,
        "peak_rss_mb": round(srv.peak_rss_mb(), 1),
        "cache_mb": srv.cache_mb(),
    }


def cached_p50(srv: Server, pair: Pair, n: int) -> dict[str, float]:
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        files = {"source": ("s.jpg", pair[0]), "target": ("t.jpg", pair[1])}
        assert c.post("/v1/fuse", files=files, data={"degree": "80"}).status_code == 200
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            r = c.post("/v1/fuse", files=files, data={"degree": "80"})
            times.append((time.perf_counter() - t0) * 1000.0)
            assert r.headers["x-facefuse-cache"] == "hit"
    return {"p50_ms": round(statistics.median(times), 2),
            "p95_ms": round(percentile(times, 95), 2),
            "body_bytes": len(r.content)}


# --- the run ----------------------------------------------------------------------------------


class Pool:
    """Distinct pairs, made between runs (never while load runs). Each server keeps its
    own cursor: servers have separate caches, so they may reuse each other's pairs."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.pairs: list[Pair] = []
        self.cursor: dict[str, int] = {}
        self.best_rps = 12.0

    def take(self, server: str, concurrency: int, duration: float) -> list[Pair]:
        offset = self.cursor.get(server, 0)
        need = int(self.best_rps * 1.6 * duration) + 2 * concurrency + 8
        if len(self.pairs) < offset + need:
            self.pairs += self.inputs.pairs(offset + need - len(self.pairs))
        return self.pairs[offset:offset + need]

    def used(self, server: str, row: dict[str, Any]) -> None:
        self.cursor[server] = self.cursor.get(server, 0) + row["requests"] + row["concurrency"]
        self.best_rps = max(self.best_rps, float(row["throughput_rps"]))


def run(srv: Server, name: str, pool: Pool, route: str, c: int, duration: float,
        repeat: float = 0.0) -> dict[str, Any]:
    before = load1()
    row = closed_loop(srv, route, c, duration, pool.take(name, c, duration), repeat=repeat,
                      seed=c)
    pool.used(name, row)
    row["load1_before"], row["load1_after"] = before, load1()
    print(name, route, row, flush=True)
    return row


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of interleaved rounds (throughput, latency, batch sizes)."""
    out = dict(rows[0])
    for k in ("throughput_rps", "p50_ms", "p95_ms", "p99_ms", "hit_ratio"):
        out[k] = round(statistics.median(r[k] for r in rows), 2)
    out["avg_batch"] = {m: (round(statistics.median(v), 2) if (v := [
        r["avg_batch"][m] for r in rows if r["avg_batch"].get(m) is not None]) else None)
        for m in MODELS}
    out["requests"] = sum(r["requests"] for r in rows)
    out["errors"] = sum(r["errors"] for r in rows)
    out["rounds"] = [r["throughput_rps"] for r in rows]
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in rows)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per level")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the A/B runs")
    ap.add_argument("--quick", action="store_true", help="concurrency 1, 8 only; short runs")
    args = ap.parse_args()
    levels = (1, 8) if args.quick else CONCURRENCY
    duration = 3.0 if args.quick else args.duration
    ab_duration = 3.0 if args.quick else 5.0
    rounds = 1 if args.quick else args.rounds
    delays = (0.0, 5.0) if args.quick else (0.0, 1.0, 2.0, 5.0, 10.0, 50.0)
    settings = Settings.from_env()
    RESULTS.mkdir(parents=True, exist_ok=True)
    log = Path(tempfile.gettempdir()) / "facefuse-bench-serve.log"  # the servers' logs
    log.write_text("")
    inputs = Inputs(settings)
    pool = Pool(inputs)
    t_start = time.monotonic()
    results: dict[str, Any] = {
        "machine": machine(), "duration_s": duration, "ab_duration_s": ab_duration,
        "rounds": rounds,
        "settings": {"max_batch_size": settings.max_batch_size,
                     "max_queue_delay_ms": settings.max_queue_delay_ms,
                     "max_active": settings.max_active,
                     "inference_workers": settings.inference_workers,
                     "cpu_workers": settings.cpu_workers, "threads": settings.threads}}
    rows: dict[str, list[dict[str, Any]]] = {"on_distinct": [], "on_repeat30": [],
                                             "off_distinct": []}
    # 1. Levels: batching on and off servers side by side, runs interleaved per level.
    with server({}, log) as on, server({"FACEFUSE_BATCHING": "false"}, log) as off:
        for srv in (on, off):  # warm up (allocator, ORT first runs)
            closed_loop(srv, "/v1/fuse", 2, 2.0, inputs.pairs(60))
        for c in levels:
            rows["on_distinct"].append(run(on, "on", pool, "/v1/fuse", c, duration))
            rows["off_distinct"].append(run(off, "off", pool, "/v1/fuse", c, duration))
            rows["on_repeat30"].append(run(on, "on", pool, "/v1/fuse", c, duration, 0.3))
        # 2. Model-bound route, on vs off, interleaved rounds.
        embed: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
        for _ in range(rounds):
            for name, srv in (("on", on), ("off", off)):
                embed[name].append(run(srv, name, pool, "/v1/embed", 8, ab_duration))
        results["embed"] = {k: median_row(v) for k, v in embed.items()}
        results["cached_fuse"] = cached_p50(on, inputs.pairs(1)[0], 200)
        print("cached", results["cached_fuse"], flush=True)
    results.update(rows)
    # 3. max_queue_delay_ms at 8 clients (and batching off), interleaved rounds.
    configs = [(f"delay {d:g}", {"FACEFUSE_MAX_QUEUE_DELAY_MS": str(d)}) for d in delays]
    configs.append(("off", {"FACEFUSE_BATCHING": "false"}))
    with contextlib.ExitStack() as stack:
        servers = [(name, stack.enter_context(server(env, log))) for name, env in configs]
        for _, srv in servers:
            closed_loop(srv, "/v1/fuse", 2, 1.0, inputs.pairs(30))
        sweep: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in configs}
        for _ in range(rounds):
            for name, srv in servers:
                sweep[name].append(run(srv, "sweep " + name, pool, "/v1/fuse", 8, ab_duration))
    results["delay_sweep_c8"] = {name: median_row(v) for name, v in sweep.items()}
    results["wall_s"] = round(time.monotonic() - t_start, 1)
    write_json("serve", results)
    write_section("serve", report(results, args))
    print(f"done in {results['wall_s']} s", flush=True)


def _batches(r: dict[str, Any]) -> str:
    b = r["avg_batch"]
    return " / ".join("–" if b.get(m) is None else f"{b[m]:.1f}" for m in MODELS)


def _row(r: dict[str, Any]) -> str:
    return (f"| {r['concurrency']} | {r['throughput_rps']:.2f} | {r['p50_ms']:.0f} | "
            f"{r['p95_ms']:.0f} | {r['p99_ms']:.0f} | {_batches(r)} | {r['hit_ratio']:.2f} | "
            f"{r['peak_rss_mb']:.0f} | {r['errors']} | {r['load1_before']:.1f} |")


def report(res: dict[str, Any], args: argparse.Namespace) -> str:
    head = ("| clients | req/s | p50 ms | p95 ms | p99 ms | avg batch det / mesh / iris / "
            "embed | L2 hit ratio | peak RSS MB | errors | load avg |\n"
            "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    s = res["settings"]
    lines = [
        "## HTTP service (`bench/serve.py`)",
        "",
        machine_line(res["machine"]),
        f"Command: `.venv/bin/python bench/serve.py{' --quick' if args.quick else ''}` "
        f"({res['wall_s']:.0f} s). Closed loop on loopback, `POST /v1/fuse` (degree 80, JPEG "
        f"out, similarity off: the default) with portraits of ~630–900 px long side, "
        f"{res['duration_s']:.0f} s per level; one uvicorn worker, embedded defaults "
        f"(in-process caches), max_batch_size {s['max_batch_size']}, max_queue_delay_ms "
        f"{s['max_queue_delay_ms']:g}, max_active {s['max_active']}, "
        f"{s['inference_workers']} inference + {s['cpu_workers']} CPU threads, ORT "
        f"{s['threads']} thread per session. The load generator shares the 2 cores; "
        "`load avg` is the machine's 1-minute load before the run (other work on a "
        "shared machine skews the numbers; A/B comparisons below interleave their runs).",
        "",
        "Batching on, distinct inputs (every request a new pair of new images):",
        "", head, *[_row(r) for r in res["on_distinct"]], "",
        "Batching on, 30 % repeated inputs:", "", head, *[_row(r) for r in res["on_repeat30"]],
        "", "Batching off (`FACEFUSE_BATCHING=false`), distinct inputs, same levels "
        "interleaved with the runs above:", "", head,
        *[_row(r) for r in res["off_distinct"]], "",
    ]
    e_on, e_off = res["embed"]["on"], res["embed"]["off"]
    sweep = res["delay_sweep_c8"]
    default = f"delay {s['max_queue_delay_ms']:g}"
    if default in sweep and "off" in sweep:
        on8, off8 = sweep[default], sweep["off"]
        lines.append(
            f"At 8 clients (medians of {res['rounds']} interleaved rounds of "
            f"{res['ab_duration_s']:.0f} s), batching on vs off: fuse "
            f"{on8['throughput_rps']:.2f} vs {off8['throughput_rps']:.2f} req/s "
            f"(**{on8['throughput_rps'] / off8['throughput_rps']:.2f}×**); `/v1/embed` "
            f"(model-bound) {e_on['throughput_rps']:.2f} vs {e_off['throughput_rps']:.2f} "
            f"req/s (**{e_on['throughput_rps'] / e_off['throughput_rps']:.2f}×**, recognizer "
            f"batch {e_on['avg_batch']['dlib_resnet']} vs {e_off['avg_batch']['dlib_resnet']}).")
    c = res["cached_fuse"]
    lines += [
        f"Cached fuse (L2 hit, the same request again, 1 client): p50 **{c['p50_ms']:.2f} ms**, "
        f"p95 {c['p95_ms']:.2f} ms for a {c['body_bytes'] / 1024:.0f} KiB answer.",
        "",
        f"`max_queue_delay_ms` at 8 clients (fuse, distinct inputs; medians of "
        f"{res['rounds']} interleaved rounds of {res['ab_duration_s']:.0f} s, all servers up "
        "at once):",
        "",
        "| config | req/s (rounds) | p50 ms | p95 ms | avg batch det / mesh / iris / embed | "
        "peak RSS MB |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for name, r in sweep.items():
        rounds = ", ".join(f"{x:.1f}" for x in r["rounds"])
        lines.append(f"| {name} | {r['throughput_rps']:.2f} ({rounds}) | {r['p50_ms']:.0f} | "
                     f"{r['p95_ms']:.0f} | {_batches(r)} | {r['peak_rss_mb']:.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
