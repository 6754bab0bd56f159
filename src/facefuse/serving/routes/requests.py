"""What every route does around its work: the API-key dependencies, the request
deadline and the stage timings' metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Annotated, TypeVar

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from facefuse.errors import DeadlineExceededError
from facefuse.serving.metrics import STAGES
from facefuse.serving.pipeline import RequestContext
from facefuse.serving.state import Services, services

__all__ = ["observe_stages", "require_admin", "require_key", "within_deadline"]

T = TypeVar("T")

_bearer = HTTPBearer(
    auto_error=False,
    description="`Authorization: Bearer <key>` — needed when FACEFUSE_API_KEYS is set; "
    "admin routes need a key from FACEFUSE_ADMIN_KEYS.",
)


Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]


async def require_key(request: Request, _: Credentials) -> None:
    """Any configured API key (or none, when authentication is off)."""
    label = services(request).keys.check(request.headers.get("authorization"))
    request.state.key_label = label


async def require_admin(request: Request, _: Credentials) -> None:
    """An admin key (or none, when authentication is off)."""
    label = services(request).keys.check(request.headers.get("authorization"), admin=True)
    request.state.key_label = label


async def within_deadline(ctx: RequestContext, aw: Awaitable[T]) -> T:
    """Await ``aw``; past the request deadline raise :class:`DeadlineExceededError`."""
    if ctx.deadline is None:
        return await aw
    try:
        async with asyncio.timeout_at(ctx.deadline):
            return await aw
    except TimeoutError:
        raise DeadlineExceededError("the request deadline passed") from None


def observe_stages(svc: Services, ctx: RequestContext) -> None:
    for stage, ms in ctx.timer.ms.items():
        if stage in STAGES:
            svc.metrics.observe_stage(stage, ms / 1000.0)
