"""An aiortc client of the live routes, for the integration tests and bench/live.py.

:class:`ClipTrack` is a camera made of frames (a synthetic clip of the sample
photos) sent at a set rate; :class:`LiveClient` opens a session with it (WHIP:
``POST /v1/live`` with ``application/sdp``), keeps the newest fused frames it
receives, counts audio frames, and talks on a data channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
import json
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
from aiortc import (
    AudioStreamTrack,
    MediaStreamTrack,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from av import VideoFrame

#: RTP's video clock.
VIDEO_CLOCK = 90_000


class ClipTrack(MediaStreamTrack):
    """``frames`` (RGB uint8) sent over and over at ``fps``."""

    kind = "video"

    def __init__(self, frames: Sequence[np.ndarray], fps: float = 25.0) -> None:
        super().__init__()
        self.frames = list(frames)
        self.fps = fps
        self.sent = 0
        self._t0: float | None = None

    async def recv(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._t0 is None:
            self._t0 = time.monotonic()
        wait = self._t0 + self.sent / self.fps - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        frame = VideoFrame.from_ndarray(self.frames[self.sent % len(self.frames)],
                                        format="rgb24")
        frame.pts = round(self.sent * VIDEO_CLOCK / self.fps)
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        self.sent += 1
        return frame


class LiveClient:
    """One publisher (or, with ``frames=None``, one viewer) of the live routes."""

    def __init__(self, base_url: str, token: str | None = None, *,
                 frames: Sequence[np.ndarray] | None = None, fps: float = 25.0,
                 audio: bool = False, channel: bool = True, keep: int = 8) -> None:
        self.base_url = base_url
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.pc = RTCPeerConnection()
        self.camera = ClipTrack(frames, fps) if frames is not None else None
        self.video_frames = 0
        self.audio_frames = 0
        self.received: deque[np.ndarray] = deque(maxlen=keep)
        self.arrivals: list[float] = []
        self.messages: list[dict[str, Any]] = []
        self.location: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._channel = self.pc.createDataChannel("control") if channel and frames is not None \
            else None
        if self._channel is not None:
            @self._channel.on("message")
            def on_message(message: Any) -> None:
                self.messages.append(json.loads(message))
        if self.camera is not None:
            self.pc.addTrack(self.camera)
            if audio:
                self.pc.addTrack(AudioStreamTrack())
        else:
            self.pc.addTransceiver("video", direction="recvonly")
            self.pc.addTransceiver("audio", direction="recvonly")

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            self._tasks.append(asyncio.ensure_future(self._read(track)))

    async def _read(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if isinstance(frame, VideoFrame):
                    self.video_frames += 1
                    self.arrivals.append(time.monotonic())
                    self.received.append(frame.to_ndarray(format="rgb24"))
                else:
                    self.audio_frames += 1

    async def offer(self, munge: Any = None) -> str:
        """The local offer's SDP (``munge(sdp)`` may change it, as a test does)."""
        await self.pc.setLocalDescription(await self.pc.createOffer())
        sdp = self.pc.localDescription.sdp
        return munge(sdp) if munge is not None else sdp

    async def post(self, path: str, sdp: str, params: dict[str, Any] | None = None
                   ) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.base_url, headers=self.headers,
                                     timeout=60) as c:
            return await c.post(path, content=sdp, params=params,
                                headers={"Content-Type": "application/sdp"})

    async def start(self, path: str = "/v1/live", params: dict[str, Any] | None = None
                    ) -> httpx.Response:
        """Offer, POST, and on 201 take the answer; the response either way."""
        r = await self.post(path, await self.offer(), params)
        if r.status_code == 201:
            self.location = r.headers["location"]
            await self.pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
        return r

    def send(self, message: dict[str, Any]) -> None:
        assert self._channel is not None
        self._channel.send(json.dumps(message))

    async def wait_for(self, check: Any, timeout: float = 60.0, what: str = "") -> None:
        end = time.monotonic() + timeout
        while not check():
            if time.monotonic() > end:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        """Close the connection (no DELETE: the caller decides)."""
        if self.camera is not None:
            self.camera.stop()
        await self.pc.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
