"""What a live session accepts of an SDP offer, checked before any peer connection.

An offer (RFC 8866 text) is accepted when:

1. it is at most :data:`MAX_OFFER_BYTES` and parses as session + media sections
   (``malformed_offer`` otherwise);
2. it has a video section that sends (``sendrecv`` or ``sendonly``, the default
   being ``sendrecv``): ``offer_without_video`` otherwise;
3. that section offers a codec this server decodes (:data:`VIDEO_CODECS`, VP8 or
   H.264): ``unsupported_codec`` otherwise, naming what was offered;
4. a viewer's offer (:func:`check_viewer_offer`) has a video section that
   receives (``recvonly`` or ``sendrecv``).

The direction tells the session whether to send the fused stream back: a
``sendrecv`` offer (a camera page) gets it on the same connection, a ``sendonly``
one (a WHIP publisher such as OBS) only through a viewer.
"""

from __future__ import annotations

from dataclasses import dataclass

from facefuse.errors import BadRequestError, InvalidOfferError

__all__ = ["MAX_OFFER_BYTES", "VIDEO_CODECS", "Offer", "check_offer", "check_viewer_offer"]

#: Largest offer accepted, bytes (a browser's is 3-8 KB).
MAX_OFFER_BYTES = 64 * 1024
#: Video codecs the server decodes and encodes (aiortc's), lower case.
VIDEO_CODECS = ("vp8", "h264")
_DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")


@dataclass(frozen=True)
class Media:
    """One ``m=`` section: its kind, direction and codec names (lower case)."""

    kind: str
    direction: str
    codecs: tuple[str, ...]
    rejected: bool


@dataclass(frozen=True)
class Offer:
    """A checked offer: the SDP text and what the session needs to know of it."""

    sdp: str
    media: tuple[Media, ...]

    @property
    def video(self) -> Media:
        return next(m for m in self.media if m.kind == "video" and not m.rejected)

    @property
    def wants_video_back(self) -> bool:
        return self.video.direction in ("sendrecv", "recvonly")

    @property
    def has_audio(self) -> bool:
        return any(m.kind == "audio" and not m.rejected for m in self.media)


def parse(sdp: str | bytes) -> Offer:
    """The media sections of an offer.

    Raises:
        BadRequestError: ``malformed_offer`` (not SDP text, too large, no ``v=0``).
    """
    if isinstance(sdp, bytes):
        if len(sdp) > MAX_OFFER_BYTES:
            raise BadRequestError(f"the offer is over {MAX_OFFER_BYTES} bytes",
                                  code="malformed_offer")
        try:
            sdp = sdp.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequestError("the offer is not UTF-8 text", code="malformed_offer") from None
    if len(sdp) > MAX_OFFER_BYTES:
        raise BadRequestError(f"the offer is over {MAX_OFFER_BYTES} bytes",
                              code="malformed_offer")
    lines = [ln.strip() for ln in sdp.replace("\r\n", "\n").split("\n") if ln.strip()]
    if not lines or lines[0] != "v=0":
        raise BadRequestError("not an SDP offer (it must start with v=0)",
                              code="malformed_offer")
    session_dir = "sendrecv"
    sections: list[list[str]] = []
    for ln in lines[1:]:
        if len(ln) < 2 or ln[1] != "=":
            raise BadRequestError(f"not an SDP line: {ln[:40]!r}", code="malformed_offer")
        if ln.startswith("m="):
            sections.append([ln])
        elif sections:
            sections[-1].append(ln)
        elif ln[2:] in _DIRECTIONS:
            session_dir = ln[2:]
    media = []
    for sec in sections:
        head = sec[0][2:].split()
        if len(head) < 3:
            raise BadRequestError(f"malformed media line: {sec[0][:40]!r}",
                                  code="malformed_offer")
        direction = next((ln[2:] for ln in sec if ln[2:] in _DIRECTIONS), session_dir)
        codecs = tuple(ln.split(None, 1)[1].split("/")[0].lower() for ln in sec
                       if ln.startswith("a=rtpmap:") and len(ln.split(None, 1)) == 2)
        media.append(Media(head[0].lower(), direction, codecs, head[1] == "0"))
    return Offer(sdp, tuple(media))


def check_offer(sdp: str | bytes) -> Offer:
    """A publisher's offer, checked (see the module docstring).

    Raises:
        BadRequestError: ``malformed_offer``.
        InvalidOfferError: ``offer_without_video``, ``unsupported_codec``.
    """
    return _checked(sdp, ("sendrecv", "sendonly"),
                    "the offer sends no video: add a camera track (sendrecv, or sendonly "
                    "to watch through a viewer)")


def check_viewer_offer(sdp: str | bytes) -> Offer:
    """A viewer's offer: it must receive video (errors as :func:`check_offer`'s)."""
    return _checked(sdp, ("sendrecv", "recvonly"),
                    "a viewer's offer must receive video (recvonly)")


def _checked(sdp: str | bytes, directions: tuple[str, ...], no_video: str) -> Offer:
    offer = parse(sdp)
    videos = [m for m in offer.media if m.kind == "video" and not m.rejected]
    if not any(m.direction in directions for m in videos):
        raise InvalidOfferError(no_video, code="offer_without_video")
    _check_codecs(videos)
    return offer


def _check_codecs(videos: list[Media]) -> None:
    offered = sorted({c for m in videos for c in m.codecs
                      if c not in ("rtx", "red", "ulpfec", "flexfec-03")})
    if not any(c in VIDEO_CODECS for c in offered):
        raise InvalidOfferError(
            f"no video codec this server decodes in the offer (offered: "
            f"{', '.join(offered) or 'none'}; supported: VP8, H264)",
            code="unsupported_codec")
