"""One live session: a WebRTC peer connection (aiortc) whose camera track is fused.

The publisher's offer (:mod:`facefuse.live.sdp`, checked first) is answered with
every ICE candidate in it (no trickle, as WHIP expects). Then:

* the **video** it sends is read as fast as it arrives and offered to the
  session's :class:`~facefuse.live.loop.FrameLoop` (latest frame wins); the fused
  frames go out on a track of the same connection when the offer receives too
  (``sendrecv``), and to every viewer;
* its **audio** is relayed back and to the viewers as received (aiortc decodes and
  encodes it again: Opus in, Opus out; the samples are not changed, nor delayed to
  match the video's fusion latency);
* a **data channel** the client opens takes JSON changes (``{"degree": 80}``,
  ``{"template": "..."}``) answered on the same channel, and every second the
  session sends its figures there (``{"type": "stats", ...}``);
* **viewers** (WHEP) each get a receive-only connection carrying the fused video
  and the audio, relayed: a viewer never adds fusion work.

:meth:`LiveSession.close` closes everything it opened: the connections, the
tracks, the frame thread, the tasks. Idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.contrib.media import MediaRelay
from aiortc.mediastreams import MediaStreamError

from facefuse.errors import BadRequestError, LiveSessionNotFoundError, OverloadedError
from facefuse.live.loop import FrameLoop, LiveObserver
from facefuse.live.sdp import Offer, check_viewer_offer
from facefuse.video.engine import ClipFusion

__all__ = ["FusedTrack", "LiveSession", "Updater", "ice_configuration"]

log = logging.getLogger("facefuse.live")

#: ``update(session, changes) -> reply``: applies a data channel message's changes
#: (the server resolves template and source ids) and returns the JSON reply.
Updater = Callable[["LiveSession", dict[str, Any]], Awaitable[dict[str, Any]]]
#: Seconds between two figures messages on a session's data channels.
STATS_EVERY_S = 1.0
#: Largest data channel message taken, bytes.
MAX_MESSAGE_BYTES = 16 * 1024


def ice_configuration(urls: tuple[str, ...], username: str = "",
                      credential: str = "") -> RTCConfiguration:
    """The server side's STUN / TURN servers (``turn:host:3478``, ...)."""
    servers = [RTCIceServer(urls=list(urls), username=username or None,
                            credential=credential or None)] if urls else []
    return RTCConfiguration(iceServers=servers)


class FusedTrack(MediaStreamTrack):
    """The fused video: the newest fused frame, handed to whoever reads it (a relay)."""

    kind = "video"

    def __init__(self, loop: FrameLoop | None = None) -> None:
        super().__init__()
        self.frames: FrameLoop | None = loop
        self._frame: tuple[Any, float] | None = None
        self._ready = asyncio.Event()

    def put(self, frame: Any, received: float) -> None:
        """On the event loop: the newest fused frame (one not yet read is replaced)."""
        self._frame = (frame, received)
        self._ready.set()

    async def recv(self) -> Any:
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            await self._ready.wait()
            self._ready.clear()
            if self._frame is not None:
                frame, received = self._frame
                self._frame = None
                if self.frames is not None:
                    self.frames.sent(received)
                return frame

    def stop(self) -> None:
        super().stop()
        self._ready.set()


class LiveSession:
    """A live session of ``owner`` (an API key's label; "" without keys).

    Build it with :meth:`start`, which answers the offer. ``state`` is the clip
    state the frames are fused with (made from the session's source and options).
    """

    def __init__(self, owner: str, state: ClipFusion, *, observer: LiveObserver | None,
                 config: RTCConfiguration, max_side: int, max_viewers: int,
                 render_threads: int = 1, render_processes: bool = False,
                 updater: Updater | None = None, describe: dict[str, Any] | None = None
                 ) -> None:
        self.id = secrets.token_urlsafe(12)
        self.owner = owner
        self.created = time.time()
        self.state = "connecting"
        self.ended_reason: str | None = None
        self.describe: dict[str, Any] = dict(describe or {})
        self._config = config
        self._max_viewers = max_viewers
        self._updater = updater
        self._loop = asyncio.get_running_loop()
        self._last_frame = time.monotonic()
        self._relay = MediaRelay()
        self._fused = FusedTrack()
        self.frames = FrameLoop(state, self._emit, observer=observer, max_side=max_side,
                                workers=render_threads, processes=render_processes,
                                name=f"live-{self.id[:6]}")
        self._fused.frames = self.frames
        self._audio: MediaStreamTrack | None = None
        self.pc = RTCPeerConnection(config)
        self.viewers: dict[str, RTCPeerConnection] = {}
        self._channels: list[RTCDataChannel] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = asyncio.Event()

    # --- start and answer -----------------------------------------------------------------

    async def start(self, offer: Offer) -> str:
        """Answer ``offer`` (checked by :func:`~facefuse.live.sdp.check_offer`): the
        answer's SDP with every candidate gathered."""
        pc = self.pc
        back = offer.wants_video_back

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "video":
                self._spawn(self._consume(track), "video-in")
                if back:
                    pc.addTrack(self._relay.subscribe(self._fused, buffered=False))
            elif track.kind == "audio" and self._audio is None:
                self._audio = track
                # One reader always drains it (a publisher that only sends, no viewer yet).
                self._spawn(_drain(self._relay.subscribe(track, buffered=False)), "audio")
                if back:
                    pc.addTrack(self._relay.subscribe(track, buffered=False))

        @pc.on("datachannel")
        def on_datachannel(channel: RTCDataChannel) -> None:
            self._channels.append(channel)

            @channel.on("message")
            def on_message(message: Any) -> None:
                self._spawn(self._message(channel, message), "message")

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            s = pc.connectionState
            if s == "connected":
                self.state = "live"
            elif s in ("failed", "closed"):
                await self.close("disconnected" if s == "failed" else "closed")

        try:
            await pc.setRemoteDescription(RTCSessionDescription(offer.sdp, "offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except ValueError as exc:  # aiortc's parse and negotiation errors
            raise BadRequestError(f"the offer cannot be answered: {exc}",
                                  code="malformed_offer") from None
        self._spawn(self._stats(), "stats")
        return pc.localDescription.sdp

    async def add_viewer(self, offer: str | bytes) -> tuple[str, str]:
        """A WHEP viewer of the fused stream: (viewer id, the answer's SDP).

        Raises:
            InvalidOfferError, BadRequestError: the viewer's offer.
            OverloadedError: ``live_viewers_full`` at the session's bound.
        """
        checked = check_viewer_offer(offer)
        if len(self.viewers) >= self._max_viewers:
            raise OverloadedError(f"this session has its {self._max_viewers} viewers",
                                  code="live_viewers_full")
        pc = RTCPeerConnection(self._config)
        vid = secrets.token_urlsafe(9)
        self.viewers[vid] = pc
        pc.addTrack(self._relay.subscribe(self._fused, buffered=False))
        if self._audio is not None and any(m.kind == "audio" for m in checked.media):
            pc.addTrack(self._relay.subscribe(self._audio, buffered=False))

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.remove_viewer(vid)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(checked.sdp, "offer"))
            await pc.setLocalDescription(await pc.createAnswer())
        except ValueError as exc:
            await self.remove_viewer(vid)
            raise BadRequestError(f"the offer cannot be answered: {exc}",
                                  code="malformed_offer") from None
        except BaseException:
            await self.remove_viewer(vid)
            raise
        return vid, pc.localDescription.sdp

    async def remove_viewer(self, vid: str) -> None:
        """Close one viewer's connection.

        Raises:
            LiveSessionNotFoundError: no such viewer.
        """
        pc = self.viewers.pop(vid, None)
        if pc is None:
            raise LiveSessionNotFoundError("no such viewer of this session",
                                           code="live_viewer_not_found")
        await pc.close()

    # --- the session's life ---------------------------------------------------------------

    def idle_for(self, now: float | None = None) -> float:
        """Seconds since the last camera frame (or since the start, before the first)."""
        return (time.monotonic() if now is None else now) - self._last_frame

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def close(self, reason: str = "closed") -> None:
        """End the session and free everything it holds (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.state, self.ended_reason = "ended", reason
        self._fused.stop()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        for vid in list(self.viewers):
            with contextlib.suppress(Exception):
                await self.remove_viewer(vid)
        with contextlib.suppress(Exception):
            await self.pc.close()
        await asyncio.get_running_loop().run_in_executor(None, self.frames.close)
        pending = [t for t in self._tasks if t is not current]
        if pending:
            await asyncio.wait(pending, timeout=5)
        log.info("live session ended", extra={"fields": {
            "session": self.id, "reason": reason, **self.frames.figures.to_dict()}})

    def to_dict(self) -> dict[str, Any]:
        """The session's state and figures (``GET /v1/live/{id}``)."""
        return {"id": self.id, "state": self.state, "created": round(self.created, 3),
                "ended_reason": self.ended_reason,
                "connection": self.pc.connectionState, "viewers": len(self.viewers),
                "idle_s": round(self.idle_for(), 2), **self.describe,
                "figures": self.frames.figures.to_dict()}

    # --- tasks ------------------------------------------------------------------------------

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"live-{self.id[:6]}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _emit(self, frame: Any, received: float) -> None:
        """From the frame thread: hand the fused frame to the event loop."""
        if not self._closed.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed under us
                self._loop.call_soon_threadsafe(self._fused.put, frame, received)

    async def _consume(self, track: MediaStreamTrack) -> None:
        """Read the camera as fast as it comes; the frame loop keeps the newest."""
        try:
            while True:
                frame = await track.recv()
                self._last_frame = time.monotonic()
                self.frames.offer(frame, self._last_frame)
        except MediaStreamError:
            await self.close("camera_ended")

    async def _message(self, channel: RTCDataChannel, message: Any) -> None:
        reply: dict[str, Any]
        try:
            if not isinstance(message, str) or len(message) > MAX_MESSAGE_BYTES:
                raise BadRequestError("a message is a JSON object as text, at most "
                                      f"{MAX_MESSAGE_BYTES} bytes")
            try:
                changes = json.loads(message)
            except ValueError:
                raise BadRequestError("a message is a JSON object") from None
            if not isinstance(changes, dict):
                raise BadRequestError("a message is a JSON object")
            if self._updater is None:
                raise BadRequestError("this session takes no changes")
            reply = {"type": "updated", **(await self._updater(self, changes))}
        except Exception as exc:  # every failure is answered, typed when it can be
            body = (exc.to_dict()["error"] if hasattr(exc, "to_dict")
                    else {"code": "internal_error", "message": "internal error"})
            if not hasattr(exc, "to_dict"):
                log.exception("a live message failed")
            reply = {"type": "error", **body}
        if channel.readyState == "open":
            channel.send(json.dumps(reply))

    async def _stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            text = json.dumps({"type": "stats", **self.frames.figures.to_dict()})
            for ch in list(self._channels):
                if ch.readyState == "open":
                    with contextlib.suppress(Exception):
                        ch.send(text)


async def _drain(track: MediaStreamTrack) -> None:
    with contextlib.suppress(MediaStreamError):
        while True:
            await track.recv()
