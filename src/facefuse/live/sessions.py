"""The live sessions of one process: bounded, owned, reaped.

* **Bounded**: at most ``max_sessions`` at once (counting those being set up); past
  it, :meth:`LiveSessions.create` raises ``503 live_full`` (with Retry-After).
* **Owned**: a session belongs to the API key that made it; another key asking
  for it gets the same 404 as for an id that never was.
* **Reaped**: every ``reap_every_s`` the sessions whose camera has sent nothing for
  ``idle_s`` (a client that vanished without a goodbye, a connection that never
  came up) or whose connection failed are closed, everything they hold freed.
* **Uploaded sources** (:class:`LiveSources`): images a key uploads once and names
  by id when it starts a session or changes its source; per key, bounded in count
  and bytes over the process, the oldest dropped first, expiring after a while.

Nothing here imports aiortc: a process without it (:func:`facefuse.live.available`)
refuses sessions with ``501 live_unavailable`` but still starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from facefuse.errors import LiveSessionNotFoundError, LiveUnavailableError, OverloadedError
from facefuse.live.loop import LiveObserver
from facefuse.live.sdp import Offer
from facefuse.video.engine import ClipFusion

if TYPE_CHECKING:
    from facefuse.live.session import LiveSession, Updater

__all__ = ["LiveSessions", "LiveSources", "SessionsObserver", "available"]

log = logging.getLogger("facefuse.live")


def available() -> bool:
    """Whether this install can run live sessions (aiortc and PyAV import)."""
    try:
        import aiortc  # noqa: F401
        import av  # noqa: F401
    except ImportError:
        return False
    return True


class SessionsObserver(LiveObserver, Protocol):
    """The frame loop's observer, plus the session counts (the server's metrics)."""

    def set_live_sessions(self, count: int) -> None: ...

    def observe_live_ended(self, reason: str) -> None: ...


class LiveSessions:
    """Every live session of this process (see the module docstring).

    Args:
        max_sessions: sessions at once.
        idle_s: a session whose camera sent nothing this long is closed.
        reap_every_s: how often that is checked.
        max_viewers: viewers per session.
        max_side: frames larger than this (longer side, pixels) are fused scaled down.
        render_threads: frames of one session rendered at once.
        render_processes: render in a child process forked per session where it can.
        ice_urls, ice_username, ice_credential: the server side's STUN / TURN servers.
        observer: the metrics.
    """

    def __init__(self, *, max_sessions: int, idle_s: float, reap_every_s: float = 1.0,
                 max_viewers: int = 4, max_side: int = 1280, render_threads: int = 1,
                 render_processes: bool = False, ice_urls: tuple[str, ...] = (),
                 ice_username: str = "", ice_credential: str = "",
                 observer: SessionsObserver | None = None) -> None:
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.reap_every_s = reap_every_s
        self.max_viewers = max_viewers
        self.max_side = max_side
        self.render_threads = render_threads
        self.render_processes = render_processes
        self._ice = (ice_urls, ice_username, ice_credential)
        self._observer = observer
        self._sessions: dict[str, LiveSession] = {}
        self._starting = 0
        self._reaper: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def count(self) -> int:
        """Sessions open now (those being set up included; one that ended on its own
        no longer counts, though the reaper forgets it only on its next pass)."""
        return sum(not s.closed for s in self._sessions.values()) + self._starting

    def check_room(self) -> None:
        """Raise what :meth:`create` would for want of room (or of aiortc), before any
        work.

        Raises:
            LiveUnavailableError: no aiortc / PyAV here.
            OverloadedError: ``live_full`` at ``max_sessions`` (or while shutting down).
        """
        if not available():
            raise LiveUnavailableError("live sessions need aiortc and PyAV, which this "
                                       "install lacks (run the worker image)")
        if self._closing or self.count >= self.max_sessions:
            raise OverloadedError(f"this server runs its {self.max_sessions} live sessions; "
                                  "retry later or on another replica", code="live_full")

    async def create(self, owner: str, offer: Offer, make_state: Callable[[], ClipFusion], *,
                     updater: Updater | None = None,
                     describe: dict[str, Any] | None = None) -> tuple[LiveSession, str]:
        """A new session of ``owner`` answering ``offer``: (session, answer SDP).
        ``make_state`` (run in a thread: it analyses the source) makes its clip state.

        Raises:
            LiveUnavailableError: no aiortc / PyAV here.
            OverloadedError: ``live_full`` at ``max_sessions`` (or while shutting down).
            FacefuseError: whatever ``make_state`` raises (a bad source: typed).
        """
        self.check_room()
        from facefuse.live.session import LiveSession, ice_configuration

        self._starting += 1
        try:
            state = await asyncio.get_running_loop().run_in_executor(None, make_state)
            session = LiveSession(owner, state, observer=self._observer,
                                  config=ice_configuration(*self._ice), max_side=self.max_side,
                                  render_threads=self.render_threads,
                                  render_processes=self.render_processes,
                                  max_viewers=self.max_viewers, updater=updater,
                                  describe=describe)
            try:
                answer = await session.start(offer)
            except BaseException:
                await session.close("failed")
                raise
        finally:
            self._starting -= 1
        self._sessions[session.id] = session
        self._changed()
        self._ensure_reaper()
        log.info("live session started", extra={"fields": {
            "session": session.id, "owner": owner or "-", **session.describe}})
        return session, answer

    def get(self, owner: str, session_id: str) -> LiveSession:
        """``owner``'s open session ``session_id``.

        Raises:
            LiveSessionNotFoundError: none (or another key's, or ended).
        """
        s = self._sessions.get(session_id)
        if s is None or s.owner != owner or s.closed:
            raise LiveSessionNotFoundError("no such live session (it ended, or is another "
                                           "key's)")
        return s

    def of(self, owner: str) -> list[LiveSession]:
        """``owner``'s open sessions, oldest first."""
        return [s for s in self._sessions.values() if s.owner == owner and not s.closed]

    async def end(self, owner: str, session_id: str, reason: str = "deleted") -> None:
        """Close ``owner``'s session (404 when it is not one)."""
        await self._close(self.get(owner, session_id), reason)

    async def close_all(self) -> None:
        """Shutdown: refuse new sessions, close every one, stop the reaper."""
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        await asyncio.gather(*(self._close(s, "shutdown") for s in list(self._sessions.values())),
                             return_exceptions=True)

    async def reap(self, now: float | None = None) -> list[str]:
        """Close the idle and disconnected sessions now; their ids."""
        now = time.monotonic() if now is None else now
        gone = []
        for s in list(self._sessions.values()):
            if s.closed:
                gone.append(s.id)
                self._forget(s)
            elif s.idle_for(now) > self.idle_s:
                gone.append(s.id)
                await self._close(s, "idle")
        return gone

    # --- inside ------------------------------------------------------------------------------

    async def _close(self, session: LiveSession, reason: str) -> None:
        await session.close(reason)
        self._forget(session)

    def _forget(self, session: LiveSession) -> None:
        if self._sessions.pop(session.id, None) is not None:
            if self._observer is not None:
                self._observer.observe_live_ended(session.ended_reason or "closed")
            self._changed()

    def _changed(self) -> None:
        if self._observer is not None:
            self._observer.set_live_sessions(len(self._sessions))

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_forever(), name="live-reaper")

    async def _reap_forever(self) -> None:
        while self._sessions:
            await asyncio.sleep(self.reap_every_s)
            try:
                await self.reap()
            except Exception:
                log.exception("live reaper")


class LiveSources:
    """Source images uploaded for live sessions, per key: bounded (``max_count``
    images, ``max_bytes`` over all keys, oldest dropped first) and kept ``ttl_s``."""

    def __init__(self, max_count: int = 64, max_bytes: int = 64 << 20,
                 ttl_s: float = 3600.0) -> None:
        self.max_count, self.max_bytes, self.ttl_s = max_count, max_bytes, ttl_s
        self._items: OrderedDict[tuple[str, str], tuple[bytes, float]] = OrderedDict()

    def put(self, owner: str, image: bytes) -> str:
        """Keep ``image`` for ``owner``; its id (the same image gives the same id)."""
        sid = "src_" + hashlib.sha256(image).hexdigest()[:24]
        self._items.pop((owner, sid), None)
        self._items[(owner, sid)] = (image, time.monotonic())
        while (len(self._items) > self.max_count
               or sum(len(v[0]) for v in self._items.values()) > self.max_bytes):
            self._items.popitem(last=False)
        return sid

    def get(self, owner: str, sid: str) -> bytes:
        """``owner``'s image ``sid``.

        Raises:
            LiveSessionNotFoundError: ``live_source_not_found`` (unknown, expired, another
                key's).
        """
        item = self._items.get((owner, sid))
        if item is None or time.monotonic() - item[1] > self.ttl_s:
            self._items.pop((owner, sid), None)
            raise LiveSessionNotFoundError("no such uploaded live source (expired, or "
                                           "another key's)", code="live_source_not_found")
        return item[0]

    def delete(self, owner: str, sid: str) -> None:
        if self._items.pop((owner, sid), None) is None:
            raise LiveSessionNotFoundError("no such uploaded live source",
                                           code="live_source_not_found")
