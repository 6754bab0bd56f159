"""What one server process holds: settings, pipeline, caches, keys, metrics, flags.

One :class:`Services` per app (``app.state.services``); routes reach it through
:func:`services`. Nothing here is global.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from facefuse.config import Settings
from facefuse.errors import ModelError
from facefuse.live.sessions import LiveSessions, LiveSources
from facefuse.serving.api_keys import ApiKeys
from facefuse.serving.budget import MemoryBudget
from facefuse.serving.cache.results import ResultCache
from facefuse.serving.metrics import Metrics
from facefuse.serving.pipeline import Pipeline, RequestContext
from facefuse.serving.templates.store import TemplateStore

__all__ = ["ModelRow", "ReloadStatus", "Services", "services"]

T = TypeVar("T")

#: Header a client may send to ask for a shorter deadline than the server's, seconds.
TIMEOUT_HEADER = "x-facefuse-timeout"


@dataclass(frozen=True)
class ModelRow:
    """One model as ``GET /v1/models`` and ``facefuse_model_info`` show it: loaded, or
    chosen and loaded on its first run (``loaded`` false, no ``provider`` yet)."""

    name: str
    version: str
    sha256: str
    precision: str
    provider: str
    file: str
    task: str
    size: int
    #: Why a requested execution provider is not in use (empty: first choice runs).
    fallbacks: tuple[str, ...] = ()
    loaded: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "fallbacks": list(self.fallbacks)}


@dataclass
class ReloadStatus:
    """The outcome of the last model reload (manual or automatic)."""

    at: float | None = None
    ok: bool | None = None
    changed: list[str] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "ok": self.ok, "changed": self.changed, "error": self.error}


@dataclass
class Services:
    """Everything the routes of one app use."""

    settings: Settings
    l2: ResultCache
    metrics: Metrics
    keys: ApiKeys
    pipeline: Pipeline | None = None
    templates: TemplateStore | None = None
    #: The memory budget that request bodies and decoded pixels reserve from.
    budget: MemoryBudget | None = None
    #: The live sessions (WebRTC) of this process, and the sources uploaded for them.
    live: LiveSessions | None = None
    live_sources: LiveSources = field(default_factory=LiveSources)
    #: True once shutdown began: /readyz answers 503, new /v1 requests are refused.
    draining: bool = False
    last_reload: ReloadStatus = field(default_factory=ReloadStatus)
    #: ``/v1`` requests in flight now, and answered since start (the middleware's counts).
    inflight: int = 0
    answered: int = 0
    _flights: dict[str, asyncio.Future[Any]] = field(default_factory=dict)

    def require_pipeline(self) -> Pipeline:
        if self.pipeline is None:
            raise ModelError("models are still loading; retry shortly", code="not_ready")
        return self.pipeline

    def require_templates(self) -> TemplateStore:
        if self.templates is None:
            raise ModelError("the template store is not configured", code="not_ready")
        return self.templates

    def context(self, request: Request, route: str) -> RequestContext:
        """The per-request pipeline context: deadline and batching for ``route``."""
        s = self.settings
        timeout = s.request_timeout_s
        asked = request.headers.get(TIMEOUT_HEADER)
        if asked is not None:
            with contextlib.suppress(ValueError):
                value = float(asked)
                if value > 0:
                    timeout = min(timeout, value)
        state = request.scope.get("state", {})
        start = state.get("t0", time.monotonic())
        batched = s.batching and route not in s.unbatched_routes
        tenant = (state.get("key_label") or "") if s.cache_scope == "tenant" else ""
        return RequestContext(deadline=start + timeout, batched=batched, tenant=tenant)

    async def coalesce(self, key: str, make: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """Single flight: concurrent callers with the same ``key`` share one computation.

        Returns (result, shared) — ``shared`` is True for callers that waited on
        another's computation. A leader's error is every follower's error; when the
        leader is cancelled (client went away), a follower computes itself.
        """
        loop = asyncio.get_running_loop()
        while True:
            fut = self._flights.get(key)
            if fut is None:
                break
            try:
                return await asyncio.shield(fut), True
            except asyncio.CancelledError:
                if not fut.cancelled():
                    raise  # we were cancelled ourselves
        fut = loop.create_future()
        self._flights[key] = fut
        try:
            result = await make()
        except Exception as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: no "never retrieved" warning without followers
            raise
        except BaseException:
            fut.cancel()
            raise
        else:
            fut.set_result(result)
            return result, False
        finally:
            if self._flights.get(key) is fut:
                del self._flights[key]

    def model_rows(self) -> list[ModelRow]:
        """The models loaded, and those the stages run that load on their first run
        (the recogniser), by name (empty while loading)."""
        if self.pipeline is None:
            return []
        loaded = self.pipeline.registry.loaded()
        rows = []
        for name, s in self.pipeline.model_specs().items():
            m = loaded.get(name)
            rows.append(ModelRow(name=name, version=s.sha256[:16], sha256=s.sha256,
                                 precision=s.precision,
                                 provider=m.provider if m is not None else "",
                                 file=s.file, task=s.task, size=s.size,
                                 fallbacks=m.fallbacks if m is not None else (),
                                 loaded=m is not None))
        return rows


def services(request: Request) -> Services:
    """The :class:`Services` of the app serving ``request``."""
    svc: Services = request.app.state.services
    return svc
