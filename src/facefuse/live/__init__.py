"""Live fusion over WebRTC: a camera in, the fused stream back in real time.

A session (:class:`~facefuse.live.session.LiveSession`, aiortc) takes a
publisher's SDP offer, fuses its camera frames with the video engine's per-frame
state (:class:`~facefuse.video.engine.ClipFusion`: tracking, smoothing, the
per-track source) in a thread of its own, newest frame first
(:mod:`facefuse.live.loop`), and sends the fused video back and to viewers.
:class:`~facefuse.live.sessions.LiveSessions` bounds, owns and reaps them. The
HTTP routes are :mod:`facefuse.serving.routes.live`.

aiortc is imported only when a session starts (:func:`available`), so an install
without it (or without PyAV) still imports this package.
"""

from __future__ import annotations

from facefuse.live.loop import FrameLoop, LiveFigures, LiveObserver, live_options
from facefuse.live.sdp import Offer, check_offer, check_viewer_offer
from facefuse.live.sessions import LiveSessions, LiveSources, available

__all__ = ["FrameLoop", "LiveFigures", "LiveObserver", "LiveSessions", "LiveSources", "Offer",
           "available", "check_offer", "check_viewer_offer", "live_options"]
