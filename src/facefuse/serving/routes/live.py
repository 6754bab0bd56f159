"""Routes of live fusion over WebRTC (see docs/live.md).

* ``POST /v1/live`` (WHIP style): the body is the publisher's SDP offer
  (``Content-Type: application/sdp``; the camera's video ``sendrecv`` to get the
  fused stream back on the same connection, or ``sendonly`` to watch it through a
  viewer), the source named in the query (``?template=<id>`` or
  ``?source_id=<id>`` of ``POST /v1/live/sources``) with the fusion options
  (``&degree=80``). Or ``multipart/form-data`` / JSON with an ``offer`` field, a
  ``source`` image (or ``template`` / ``source_id``) and the options. Answers ``201``
  with the SDP answer (every candidate in it: no trickle), ``Location:
  /v1/live/{id}`` and one ``Link: <url>; rel="ice-server"`` per configured STUN /
  TURN server.
* ``GET /v1/live``, ``GET /v1/live/{id}``: the key's sessions; one's state
  (``connecting``, ``live``, ``ended``) and figures (frames in, out and dropped,
  fps, latency and fusion time percentiles).
* ``PATCH /v1/live/{id}``: change options and / or the source mid-session (JSON:
  the options, ``template``, ``source_id``; multipart: also a ``source`` image). The
  same JSON on a data channel the client opens is answered there.
* ``DELETE /v1/live/{id}``: ends it (``204``), everything it holds closed.
* ``POST /v1/live/{id}/viewers`` (WHEP style): a viewer's receive-only offer →
  ``201`` with the answer and ``Location: /v1/live/{id}/viewers/{viewer}``;
  ``DELETE`` that ends the viewer.
* ``POST /v1/live/sources``: upload a source image once (``201`` with its ``id``),
  ``DELETE /v1/live/sources/{id}``.

A key sees only its own sessions and sources (another key's id is a 404).
``FACEFUSE_LIVE_MAX_SESSIONS`` sessions per process (``503 live_full`` with
Retry-After past it); a session whose camera sends nothing for
``FACEFUSE_LIVE_IDLE_S`` is closed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field

from facefuse.config import Settings
from facefuse.errors import (
    InvalidArgumentError,
    LiveUnavailableError,
    NoFaceError,
    UnsupportedMediaTypeError,
)
from facefuse.fusion.select import check_usable
from facefuse.fusion.types import FuseOptions
from facefuse.live.loop import live_options
from facefuse.live.sdp import MAX_OFFER_BYTES, check_offer
from facefuse.live.sessions import LiveSessions, SessionsObserver
from facefuse.serving.http.inputs import RequestFields, read_request, validate_params
from facefuse.serving.routes.requests import require_key
from facefuse.serving.routes.responses import ERRORS as _ERRORS
from facefuse.serving.routes.schemas import FuseOptionParams as _FuseOptionParams
from facefuse.serving.state import Services, services
from facefuse.video.engine import ClipFusion

if TYPE_CHECKING:
    from facefuse.live.session import LiveSession

__all__ = ["LiveParams", "live_sessions", "router"]

SDP = "application/sdp"

router = APIRouter(
    prefix="/v1", dependencies=[Depends(require_key)], tags=["live"],
    responses={**_ERRORS, 404: {"description": "No such session, viewer or source (or "
                                               "another key's)"},
               501: {"description": "This install has no aiortc / PyAV"}})


class LiveParams(_FuseOptionParams):
    """The fusion options of a live session, and where its source comes from."""

    template: str | None = Field(None, max_length=128,
                                 description="A stored template's id: its image is the source.")
    source_id: str | None = Field(None, max_length=64,
                                  description="The id of an image uploaded to /v1/live/sources.")

    def options(self) -> FuseOptions:
        return FuseOptions(**{n: getattr(self, n) for n in _FuseOptionParams.model_fields})

    def option_values(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in _FuseOptionParams.model_fields}


def live_sessions(settings: Settings, observer: SessionsObserver) -> LiveSessions | None:
    """The process's live sessions from settings (None: ``live_max_sessions`` 0)."""
    if settings.live_max_sessions == 0:
        return None
    return LiveSessions(max_sessions=settings.live_max_sessions, idle_s=settings.live_idle_s,
                        max_viewers=settings.live_max_viewers, max_side=settings.live_max_side,
                        render_threads=settings.live_render_threads,
                        render_processes=settings.live_render_processes,
                        ice_urls=settings.live_ice_servers,
                        ice_username=settings.live_ice_username,
                        ice_credential=settings.live_ice_credential, observer=observer)


def _sessions(svc: Services) -> LiveSessions:
    if svc.live is None:
        raise LiveUnavailableError("live sessions are off on this server "
                                   "(FACEFUSE_LIVE_MAX_SESSIONS=0)")
    return svc.live


def _owner(request: Request) -> str:
    return str(getattr(request.state, "key_label", None) or "")


def _ice_links(s: Settings) -> list[str]:
    links = []
    for url in s.live_ice_servers:
        link = f'<{url}>; rel="ice-server"'
        if url.startswith(("turn:", "turns:")) and s.live_ice_username:
            link += (f'; username="{s.live_ice_username}"; '
                     f'credential="{s.live_ice_credential}"; credential-type="password"')
        links.append(link)
    return links


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def _read_offer(request: Request) -> bytes:
    """An ``application/sdp`` body, at most :data:`MAX_OFFER_BYTES` (read so far)."""
    if _content_type(request) != SDP:
        raise UnsupportedMediaTypeError(f"send the offer as {SDP}")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_OFFER_BYTES:
            break
    return body


def _query_fields(request: Request) -> RequestFields:
    fields = RequestFields()
    for key, value in request.query_params.multi_items():
        if key in fields:
            raise InvalidArgumentError(f"field {key!r} is given more than once")
        fields[key] = value
    return fields


async def _source_bytes(svc: Services, owner: str, params: LiveParams,
                        image: bytes | None) -> tuple[bytes, dict[str, Any]]:
    """The source image named by exactly one of ``image``, ``template``, ``source_id``,
    and how the session's state names it."""
    given = [n for n, v in (("source", image), ("template", params.template),
                            ("source_id", params.source_id)) if v is not None]
    if len(given) != 1:
        raise InvalidArgumentError(
            "name the source once: a 'source' image, a 'template' id or a 'source_id' "
            f"(given: {', '.join(given) or 'none'})",
            code="source_missing" if not given else "source_ambiguous")
    if image is not None:
        return image, {"kind": "upload"}
    if params.template is not None:
        stored = await svc.require_templates().get(params.template)
        return stored.image, {"kind": "template", "id": stored.id}
    assert params.source_id is not None
    return svc.live_sources.get(owner, params.source_id), {"kind": "source_id",
                                                           "id": params.source_id}


async def _update(svc: Services, session: LiveSession, changes: dict[str, Any],
                  image: bytes | None = None, *, typed: bool = True) -> dict[str, Any]:
    """Apply ``changes`` (option values, ``template`` or ``source_id``) and / or a new
    source ``image`` to a running session; its new state."""
    unknown = set(changes) - set(LiveParams.model_fields)
    if unknown:
        raise InvalidArgumentError(f"{sorted(unknown)[0]}: unknown field")
    current: dict[str, Any] = dict(session.describe["options"])
    merged = RequestFields({**current, **{k: v for k, v in changes.items()
                                          if k not in ("template", "source_id")}})
    merged.typed = typed
    params = validate_params(LiveParams, merged)
    fuse = params.options()
    old = FuseOptions(**current)
    if (fuse.swapper, fuse.mode) != (old.swapper, old.mode):
        raise InvalidArgumentError("swapper and mode are fixed for a session; start another",
                                   code="option_fixed")
    new_source = image is not None or "template" in changes or "source_id" in changes
    if new_source:
        named = validate_params(LiveParams, {k: changes[k] for k in ("template", "source_id")
                                             if k in changes})
        data, described = await _source_bytes(svc, session.owner, named, image)
        clip = session.frames.state
        prepared = await asyncio.get_running_loop().run_in_executor(
            None, clip.prepare_source, [data])
        session.frames.change(lambda st: st.use_source(prepared))
        session.describe["source"] = described
    if fuse != old:
        session.frames.change(lambda st: st.retune(fuse))
    session.describe["options"] = params.option_values()
    return session.to_dict()


def _updater(svc: Services) -> Any:
    async def update(session: LiveSession, changes: dict[str, Any]) -> dict[str, Any]:
        return await _update(svc, session, changes)

    return update


_SDP_BODY: dict[str, Any] = {"requestBody": {"required": True, "content": {
    SDP: {"schema": {"type": "string", "description": "The SDP offer."}}}}}


@router.post(
    "/live", status_code=201, response_class=Response,
    summary="Start a live session (WHIP): an SDP offer in, the SDP answer out",
    responses={201: {"content": {SDP: {}}, "description": "The SDP answer; Location names "
                     "the session"},
               503: {"description": "live_full: every live session slot is taken"}},
    openapi_extra={"requestBody": {"required": True, "content": {
        SDP: {"schema": {"type": "string", "description": "The SDP offer; source and options "
                         "in the query"}},
        "multipart/form-data": {"schema": {"type": "object", "required": ["offer"],
                                           "properties": {
            "offer": {"type": "string"}, "source": {"type": "string", "format": "binary"},
            **LiveParams.model_json_schema()["properties"]}}}}}},
)
async def start_live(request: Request) -> Response:
    """``201`` with the answer, or typed errors: ``offer_without_video``,
    ``unsupported_codec``, ``malformed_offer``, ``source_missing``, ``no_face`` (a bad
    source), ``template_not_found``, ``live_full`` (503 + Retry-After)."""
    svc = services(request)
    sessions = _sessions(svc)
    pipeline = svc.require_pipeline()
    owner = _owner(request)
    image: bytes | None = None
    if _content_type(request) == SDP:
        offer_bytes = await _read_offer(request)
        params = validate_params(LiveParams, _query_fields(request))
    else:
        images, fields = await read_request(request, (), ("source",))
        image = images.get("source")
        raw = fields.pop("offer", None)
        if not isinstance(raw, str):
            raise InvalidArgumentError("missing field 'offer' (the SDP offer, as text)")
        offer_bytes = raw.encode()
        params = validate_params(LiveParams, fields)
    offer = check_offer(offer_bytes)
    sessions.check_room()  # before the source is analysed
    data, described = await _source_bytes(svc, owner, params, image)
    fuse = params.options()
    fuser = pipeline.fuser
    video = live_options(fuse)
    session, answer = await sessions.create(
        owner, offer, lambda: ClipFusion(fuser, video, [data]), updater=_updater(svc),
        describe={"source": described, "options": params.option_values()})
    headers = {"Location": f"/v1/live/{session.id}", "ETag": f'"{session.id}"'}
    response = Response(answer, status_code=201, media_type=SDP, headers=headers)
    for link in _ice_links(svc.settings):
        response.headers.append("Link", link)
    return response


@router.get("/live", summary="The key's live sessions")
async def list_live(request: Request) -> dict[str, Any]:
    sessions = _sessions(services(request))
    mine = sessions.of(_owner(request))
    return {"sessions": [s.to_dict() for s in mine], "count": len(mine),
            "max_sessions": sessions.max_sessions}


@router.post(
    "/live/sources", status_code=201,
    summary="Upload a source image for live sessions (its id names it in /v1/live)",
    openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
        "schema": {"type": "object", "required": ["source"], "properties": {
            "source": {"type": "string", "format": "binary"}}}}}}},
)
async def upload_source(request: Request) -> JSONResponse:
    """``201`` with ``{"id"}``; the image must hold a usable face (typed 422 otherwise).
    Kept per key for an hour at most, the oldest dropped first past the bound."""
    svc = services(request)
    _sessions(svc)
    pipeline = svc.require_pipeline()
    images, fields = await read_request(request, ("source",))
    if fields:
        raise InvalidArgumentError(f"{next(iter(fields))}: unknown field")
    data = images["source"]
    analyser = pipeline.fuser.analyser

    def check() -> None:
        faces = analyser.analyse(data, purpose="largest")
        if not faces:
            raise NoFaceError("no face found in the source image", code="source_no_face")
        check_usable(faces[0], "source", FuseOptions().min_face_size)

    await asyncio.get_running_loop().run_in_executor(None, check)
    sid = svc.live_sources.put(_owner(request), data)
    return JSONResponse({"id": sid, "bytes": len(data)}, status_code=201,
                        headers={"Location": f"/v1/live/sources/{sid}"})


@router.delete("/live/sources/{source_id}", status_code=204, response_class=Response,
               summary="Delete an uploaded live source")
async def delete_source(request: Request, source_id: str) -> Response:
    services(request).live_sources.delete(_owner(request), source_id)
    return Response(status_code=204)


@router.get("/live/{session}", summary="A live session's state and figures")
async def get_live(request: Request, session: str) -> dict[str, Any]:
    return _sessions(services(request)).get(_owner(request), session).to_dict()


@router.patch(
    "/live/{session}", summary="Change a live session's options or source mid-session",
    openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": LiveParams.model_json_schema()},
        "multipart/form-data": {"schema": {"type": "object", "properties": {
            "source": {"type": "string", "format": "binary"},
            **LiveParams.model_json_schema()["properties"]}}}}}},
)
async def patch_live(request: Request, session: str) -> dict[str, Any]:
    """Options not named keep their values; the swapper and the mode are fixed
    (``option_fixed``). A new source is analysed while frames go on, then fused from
    the next frame."""
    svc = services(request)
    live = _sessions(svc).get(_owner(request), session)
    images, fields = await read_request(request, (), ("source",))
    return await _update(svc, live, dict(fields), images.get("source"), typed=fields.typed)


@router.delete("/live/{session}", status_code=204, response_class=Response,
               summary="End a live session")
async def delete_live(request: Request, session: str) -> Response:
    await _sessions(services(request)).end(_owner(request), session)
    return Response(status_code=204)


@router.post(
    "/live/{session}/viewers", status_code=201, response_class=Response,
    summary="Watch a session's fused stream (WHEP): a receive-only offer in, the answer out",
    responses={201: {"content": {SDP: {}}, "description": "The SDP answer"}},
    openapi_extra=_SDP_BODY,
)
async def add_viewer(request: Request, session: str) -> Response:
    svc = services(request)
    live = _sessions(svc).get(_owner(request), session)
    vid, answer = await live.add_viewer(await _read_offer(request))
    response = Response(answer, status_code=201, media_type=SDP,
                        headers={"Location": f"/v1/live/{session}/viewers/{vid}"})
    for link in _ice_links(svc.settings):
        response.headers.append("Link", link)
    return response


@router.delete("/live/{session}/viewers/{viewer}", status_code=204, response_class=Response,
               summary="Stop watching")
async def delete_viewer(request: Request, session: str, viewer: str) -> Response:
    await _sessions(services(request)).get(_owner(request), session).remove_viewer(viewer)
    return Response(status_code=204)
