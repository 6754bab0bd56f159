"""Live sessions over WebRTC against a real server, with aiortc clients on loopback:
a session fuses the camera and hands back audio, changes its degree and source
mid-session, has viewers, ends cleanly; its errors are typed; a key sees only its
own sessions; a full server answers 503; a client that vanishes is reaped with
every socket closed."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml
from aiortc import AudioStreamTrack, RTCPeerConnection
from live_client import LiveClient
from PIL import Image
from server_harness import USER_TOKEN, ServerProcess, graceful, metric_values

from facefuse.config import Settings
from facefuse.faces.analyser import FaceAnalyser
from facefuse.toolchain.clips import Scene, motion_frames

pytestmark = pytest.mark.anyio

OTHER_TOKEN = "other-token-0123456789abcdef"
#: The camera shows this person; the source photo is another's, whose identity is
#: checked against a different photo of them.
CAMERA, SOURCE, SOURCE_AGAIN = "biden", "obama2", "obama"
IDLE_S = 2.0


@pytest.fixture(scope="module")
def server(settings: Settings, model_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(settings.home, tmp_path_factory.mktemp("live"), {
        "FACEFUSE_API_KEYS": f"tests:{USER_TOKEN},other:{OTHER_TOKEN}",
        "FACEFUSE_TEMPLATES_DIR": str(tmp_path_factory.mktemp("templates")),
        "FACEFUSE_LIVE_MAX_SESSIONS": "2", "FACEFUSE_LIVE_IDLE_S": str(IDLE_S),
        "FACEFUSE_LIVE_MAX_VIEWERS": "1", "FACEFUSE_LIVE_RENDER_PROCESSES": "true",
    }, name="live")
    with graceful(proc):
        yield proc


@pytest.fixture(scope="module")
def camera(analyser: FaceAnalyser, sample_images: dict[str, np.ndarray]) -> list[np.ndarray]:
    """A 320x240 clip of the camera person's head moving, forwards then back."""
    photo = sample_images[CAMERA]
    b = analyser.analyse(photo, embed=False)[0].bbox
    scene = Scene(photo, 24, (float(b[0] + b[2]) / 2, float(b[1] + b[3]) / 2,
                              float(b[2] - b[0])), size=(320, 240), face_px=100.0)
    frames = list(motion_frames(scene))
    return frames + frames[::-1]


@pytest.fixture(scope="module")
def source_id(server: ServerProcess, sample_paths: dict[str, Path]) -> str:
    with server.client(USER_TOKEN) as c:
        r = c.post("/v1/live/sources",
                   files={"source": sample_paths[SOURCE].read_bytes()})
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def jpeg(rgb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def distance(analyser: FaceAnalyser, rgb: np.ndarray, reference: np.ndarray) -> float:
    """dlib distance between the largest faces of two images."""
    a = analyser.analyse(rgb, purpose="largest")[0].embedding
    b = analyser.analyse(reference, purpose="largest")[0].embedding
    assert a is not None and b is not None
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)))


async def live_count(server: ServerProcess, token: str = USER_TOKEN) -> int:
    async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                 headers={"Authorization": f"Bearer {token}"}) as c:
        return int((await c.get("/v1/live")).json()["count"])


def udp_sockets(pid: int) -> int:
    """UDP sockets the process holds open."""
    inodes = set()
    for name in ("udp", "udp6"):
        with open(f"/proc/{pid}/net/{name}") as f:
            inodes |= {line.split()[9] for line in f.readlines()[1:]}
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            held += 1
    return held


def children(pid: int) -> set[int]:
    """The processes ``pid`` forked that still run (its render processes)."""
    out: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out |= {int(c) for c in f.read().split()}
        except OSError:
            pass
    return out


async def no_new_children(pid: int, before: set[int], within: float = 10.0) -> None:
    end = time.monotonic() + within
    while children(pid) - before and time.monotonic() < end:
        await asyncio.sleep(0.2)
    assert not children(pid) - before, "a render process outlived its session"


async def test_a_session_fuses_the_camera_passes_audio_and_ends(
        server: ServerProcess, camera: list[np.ndarray], source_id: str,
        analyser: FaceAnalyser, sample_images: dict[str, np.ndarray]) -> None:
    client = LiveClient(server.url, USER_TOKEN, frames=camera, fps=15, audio=True)
    before = children(server.pid)
    try:
        r = await client.start(params={"source_id": source_id, "degree": 100})
        assert r.status_code == 201, r.text
        assert r.headers["content-type"].startswith("application/sdp")
        assert r.text.startswith("v=0") and "a=candidate" in r.text
        assert client.location is not None and client.location.startswith("/v1/live/")
        await client.wait_for(lambda: client.video_frames >= 20, 90, "fused frames")
        await client.wait_for(lambda: client.audio_frames >= 20, 30, "audio back")
        fused = client.received[-1]
        assert fused.shape == camera[0].shape
        # rendered in a process of its own, which holds none of the server's sockets
        renderers = children(server.pid) - before
        assert len(renderers) == 1
        assert all(udp_sockets(p) == 0 for p in renderers)
        # The recogniser sees the source's identity (a different photo of them) in a
        # received frame: closer to it than the camera person's own frame is.
        again = sample_images[SOURCE_AGAIN]
        assert distance(analyser, fused, again) < distance(analyser, camera[0], again)
        async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                     headers=client.headers) as c:
            state = (await c.get(client.location)).json()
            assert state["state"] == "live" and state["source"]["kind"] == "source_id"
            figures = state["figures"]
            assert figures["frames_out"] > 0 and figures["frames_with_faces"] > 0
            assert figures["frames_in"] >= figures["frames_out"]
            assert figures["latency_p50_ms"] is not None
            # degree 0 on the data channel: frames pass through unfused from then on
            client.send({"degree": 0})
            await client.wait_for(lambda: any(m.get("type") == "updated"
                                              for m in client.messages), 30, "the reply")
            await client.wait_for(lambda: any(m.get("type") == "stats"
                                              for m in client.messages), 30, "stats")
            await asyncio.sleep(1.0)
            faced = (await c.get(client.location)).json()["figures"]["frames_with_faces"]
            seen = client.video_frames
            await client.wait_for(lambda: client.video_frames >= seen + 10, 60, "frames")
            after = (await c.get(client.location)).json()
            assert after["options"]["degree"] == 0
            assert after["figures"]["frames_with_faces"] == faced
            # a bad message is answered, typed, and changes nothing
            client.send({"degree": 500})
            await client.wait_for(lambda: any(m.get("type") == "error"
                                              for m in client.messages), 30, "error")
            error = next(m for m in client.messages if m.get("type") == "error")
            assert error["code"] == "invalid_argument"
            # PATCH: the source by template... none stored: a typed 404
            r = await c.patch(client.location, json={"template": "nope"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "template_not_found"
            r = await c.patch(client.location, json={"degree": 90, "mode": "many"})
            assert r.status_code == 422 and r.json()["error"]["code"] == "option_fixed"
            r = await c.patch(client.location, json={"degree": 100})
            assert r.status_code == 200 and r.json()["options"]["degree"] == 100
            metrics = (await c.get("/metrics")).text
            assert metric_values(metrics, "facefuse_live_sessions")[""] == 1
            frames = metric_values(metrics, "facefuse_live_frames_total")
            assert frames['{kind="in"}'] >= frames['{kind="out"}'] > 0
            assert metric_values(metrics, "facefuse_live_frame_latency_seconds_count")[""] > 0
            r = await c.delete(client.location)
            assert r.status_code == 204
            await no_new_children(server.pid, before)
            r = await c.get(client.location)
            assert r.status_code == 404
            assert r.json()["error"]["code"] == "live_session_not_found"
    finally:
        await client.close()


async def test_a_viewer_watches_the_fused_stream(
        server: ServerProcess, camera: list[np.ndarray], source_id: str) -> None:
    client = LiveClient(server.url, USER_TOKEN, frames=camera, fps=15)
    viewer = LiveClient(server.url, USER_TOKEN)
    second = LiveClient(server.url, USER_TOKEN)
    try:
        r = await client.start(params={"source_id": source_id})
        assert r.status_code == 201, r.text
        assert client.location is not None
        r = await viewer.start(client.location + "/viewers")
        assert r.status_code == 201, r.text
        assert viewer.location is not None and "/viewers/" in viewer.location
        await viewer.wait_for(lambda: viewer.video_frames >= 10, 90, "viewer frames")
        r = await second.start(client.location + "/viewers")
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "live_viewers_full"
        async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                     headers=client.headers) as c:
            assert (await c.get(client.location)).json()["viewers"] == 1
            assert (await c.delete(viewer.location)).status_code == 204
            assert (await c.get(client.location)).json()["viewers"] == 0
            assert (await c.delete(client.location)).status_code == 204
    finally:
        for x in (client, viewer, second):
            await x.close()


def without_codecs(sdp: str) -> str:
    return sdp.replace("VP8/90000", "XV1/90000").replace("H264/90000", "XH5/90000")


async def test_offers_and_sources_it_cannot_take_are_typed_errors(
        server: ServerProcess, camera: list[np.ndarray], source_id: str,
        sample_images: dict[str, np.ndarray]) -> None:
    audio_only = RTCPeerConnection()
    audio_only.addTrack(AudioStreamTrack())
    video = LiveClient(server.url, USER_TOKEN, frames=camera)
    try:
        await audio_only.setLocalDescription(await audio_only.createOffer())
        r = await video.post("/v1/live", audio_only.localDescription.sdp,
                             {"source_id": source_id})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "offer_without_video"
        sdp = await video.offer(without_codecs)
        r = await video.post("/v1/live", sdp, {"source_id": source_id})
        assert r.status_code == 422 and r.json()["error"]["code"] == "unsupported_codec"
        assert "supported: VP8, H264" in r.json()["error"]["message"]
        good = await video.offer()
        r = await video.post("/v1/live", "not sdp at all", {"source_id": source_id})
        assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_offer"
        r = await video.post("/v1/live", good, {})
        assert r.status_code == 422 and r.json()["error"]["code"] == "source_missing"
        r = await video.post("/v1/live", good, {"source_id": "src_nope"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "live_source_not_found"
        r = await video.post("/v1/live", good, {"source_id": source_id, "degree": 101})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_argument"
        # An unknown swapper is refused at the door, as on /v1/fuse.
        r = await video.post("/v1/live", good, {"source_id": source_id, "swapper": "nope"})
        assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_swapper"
        async with httpx.AsyncClient(base_url=server.url, timeout=60,
                                     headers=video.headers) as c:
            wall = np.full((240, 320, 3), 120, np.uint8)
            r = await c.post("/v1/live/sources", files={"source": jpeg(wall)})
            assert r.status_code == 422 and r.json()["error"]["code"] == "source_no_face"
            # a multipart session whose source has no face
            r = await c.post("/v1/live", data={"offer": good},
                             files={"source": jpeg(wall)})
            assert r.status_code == 422, r.text
            assert r.json()["error"]["code"].endswith("no_face")
            r = await c.post("/v1/live", content=good, headers={"Content-Type": "text/plain"})
            assert r.status_code == 415
        assert await live_count(server) == 0
    finally:
        await audio_only.close()
        await video.close()


async def test_a_key_sees_only_its_own_sessions(
        server: ServerProcess, camera: list[np.ndarray], source_id: str) -> None:
    client = LiveClient(server.url, USER_TOKEN, frames=camera)
    intruder = LiveClient(server.url, OTHER_TOKEN)
    try:
        r = await client.start(params={"source_id": source_id})
        assert r.status_code == 201, r.text
        assert client.location is not None
        async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                     headers=intruder.headers) as c:
            assert (await c.get("/v1/live")).json()["count"] == 0
            for method in ("GET", "DELETE"):
                r = await c.request(method, client.location)
                assert r.status_code == 404, method
            r = await c.patch(client.location, json={"degree": 10})
            assert r.status_code == 404
            r = await intruder.start(client.location + "/viewers")
            assert r.status_code == 404
            # and another key's uploaded source is not there for it either
            r = await c.post("/v1/live", content=await intruder.offer(),
                             params={"source_id": source_id},
                             headers={"Content-Type": "application/sdp"})
            assert r.status_code in (404, 422)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            assert (await c.get("/v1/live")).status_code == 401
        assert await live_count(server) == 1
        async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                     headers=client.headers) as c:
            assert (await c.delete(client.location)).status_code == 204
    finally:
        await client.close()
        await intruder.close()


async def test_a_full_server_answers_503_with_retry_after(
        server: ServerProcess, camera: list[np.ndarray], source_id: str) -> None:
    clients = [LiveClient(server.url, USER_TOKEN, frames=camera, fps=10) for _ in range(3)]
    try:
        for c in clients[:2]:
            r = await c.start(params={"source_id": source_id})
            assert r.status_code == 201, r.text
        r = await clients[2].start(params={"source_id": source_id})
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "live_full" and r.headers["retry-after"]
        async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                     headers=clients[0].headers) as h:
            assert clients[0].location is not None
            assert (await h.delete(clients[0].location)).status_code == 204
        late = LiveClient(server.url, USER_TOKEN, frames=camera, fps=10)
        clients.append(late)
        r = await late.start(params={"source_id": source_id})
        assert r.status_code == 201, r.text
    finally:
        async with httpx.AsyncClient(base_url=server.url, timeout=30,
                                     headers=clients[0].headers) as h:
            for c in clients:
                if c.location:
                    await h.delete(c.location)
                await c.close()


VANISHING_CLIENT = """
import asyncio, sys
sys.path.insert(0, {here!r})
import numpy as np
from aiortc import AudioStreamTrack, RTCPeerConnection
from live_client import LiveClient

async def main():
    frames = [np.load({frames!r})[i] for i in range(8)]
    client = LiveClient({url!r}, {token!r}, frames=frames, fps=10)
    r = await client.start(params={{"source_id": {source!r}}})
    print(r.status_code, flush=True)
    await client.wait_for(lambda: client.video_frames >= 3, 120)
    print("fused", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_client_that_vanishes_is_reaped_with_its_sockets(
        server: ServerProcess, camera: list[np.ndarray], source_id: str,
        tmp_path: Path) -> None:
    frames = tmp_path / "frames.npy"
    np.save(frames, np.stack(camera[:8]))
    script = VANISHING_CLIENT.format(here=str(Path(__file__).parent), frames=str(frames),
                                     url=server.url, token=USER_TOKEN, source=source_id)
    before = udp_sockets(server.pid)
    forked = children(server.pid)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "201"
        assert proc.stdout.readline().strip() == "fused"
        assert await live_count(server) == 1
        assert udp_sockets(server.pid) > before
        assert len(children(server.pid) - forked) == 1  # its render process
        proc.send_signal(signal.SIGKILL)  # no goodbye: no DELETE, no DTLS close
        proc.wait(10)
        end = time.monotonic() + 10.0
        while await live_count(server) and time.monotonic() < end:
            await asyncio.sleep(0.2)
        assert await live_count(server) == 0, "not reaped within 10 s"
        end = time.monotonic() + 5.0
        while udp_sockets(server.pid) > before and time.monotonic() < end:
            await asyncio.sleep(0.2)
        assert udp_sockets(server.pid) == before
        await no_new_children(server.pid, forked)
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            metrics = (await c.get("/metrics",
                                   headers={"Authorization": f"Bearer {USER_TOKEN}"})).text
        ended = metric_values(metrics, "facefuse_live_sessions_ended_total")
        assert ended.get('{reason="idle"}', 0) + ended.get('{reason="disconnected"}', 0) >= 1
        assert metric_values(metrics, "facefuse_live_sessions")[""] == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "facefuse-live.json"


async def test_the_live_dashboard_reads_metrics_the_server_exports(
        server: ServerProcess, tmp_path: Path) -> None:
    """Every expression of the live Grafana dashboard parses (promtool) and names only
    series a server that ran sessions exports (this module's earlier tests ran some)."""
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"].replace("$__rate_interval", "1m")
             for p in board["panels"] for t in p["targets"]]
    assert exprs
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        exported = (await c.get("/metrics")).text
    names = {line.split("{")[0].split(" ")[0] for line in exported.splitlines()
             if line and not line.startswith("#")}
    for expr in exprs:
        for name in re.findall(r"\bfacefuse_[a-z_]+", expr):
            assert name in names, (name, expr)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool missing: run scripts/install-system-deps.sh")
    rules = tmp_path / "exprs.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
    proc = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
