"""The memory budget: reservations, first-come-first-served waiting, bounded waits."""

from __future__ import annotations

import asyncio

import pytest

from facefuse.config import Settings
from facefuse.errors import OverloadedError
from facefuse.serving.budget import MemoryBudget, budget_bytes

pytestmark = pytest.mark.anyio


async def test_reservations_wait_in_arrival_order_and_time_out() -> None:
    budget = MemoryBudget(100, wait_s=30)
    await budget.acquire(80, "first")
    order: list[str] = []

    async def take(n: int, name: str) -> None:
        await budget.acquire(n, name)
        order.append(name)

    big = asyncio.ensure_future(take(60, "big"))
    await asyncio.sleep(0)
    small = asyncio.ensure_future(take(10, "small"))  # would fit now, but queues behind
    await asyncio.sleep(0)
    assert order == [] and budget.in_use == 80
    budget.release(80)
    await asyncio.gather(big, small)
    assert order == ["big", "small"] and budget.in_use == 70

    budget.wait_s = 0.05
    with pytest.raises(OverloadedError) as info:
        await budget.acquire(50, "decoding")
    assert info.value.http_status == 503 and "decoding" in info.value.message
    assert budget.in_use == 70  # the failed wait took nothing
    budget.release(70)
    assert budget.in_use == 0


async def test_a_cancelled_waiter_frees_its_place() -> None:
    budget = MemoryBudget(10, wait_s=30)
    await budget.acquire(10, "all")
    waiter = asyncio.ensure_future(budget.acquire(10, "next"))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    budget.release(10)
    await budget.acquire(5, "later")
    assert budget.in_use == 5


async def test_never_fitting_requests_are_refused_not_queued() -> None:
    budget = MemoryBudget(10, wait_s=30)
    assert not budget.fits(11)
    with pytest.raises(ValueError, match="never fit"):
        await budget.acquire(11, "huge")


def test_budget_from_setting_or_default() -> None:
    assert budget_bytes(Settings.from_env({"FACEFUSE_MEMORY_BUDGET_MB": "700"})) == 700 << 20
    assert budget_bytes(Settings.from_env({})) > 0
