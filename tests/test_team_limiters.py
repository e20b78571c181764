"""A reservation undone (its key's team refused the request) gives back everything it took, the
request included, on every limiter: in process, the workers' shared file, and Redis; and each
limiter tells a budget held by requests in flight from one spent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from kimi_server.gate.limits import Limiter, Limits, LocalLimiter, Snapshot, tighter
from kimi_server.gate.redis_limits import RedisLimiter
from kimi_server.gate.shared_limits import MappedLimiter
from tests.gateway_util import REDIS_URL, redis_prefix

Make = Callable[[Path], Limiter]


@pytest.fixture(params=["local", "file", pytest.param("redis", marks=pytest.mark.integration)])
def make(request: pytest.FixtureRequest) -> Make:
    if request.param == "local":
        return lambda _: LocalLimiter()
    if request.param == "file":
        return lambda tmp: MappedLimiter(tmp / "limits.map")
    prefix = redis_prefix()
    return lambda _: RedisLimiter(REDIS_URL, prefix)


def test_an_undone_reservation_gives_back_its_request_tokens_and_hold(tmp_path: Path, make: Make) -> None:
    async def run() -> None:
        limiter = make(tmp_path)
        limits = Limits(rpm=1, tpm=100, budget_nanos=50)
        assert (await limiter.reserve("key_a", limits, 100, 50)).admitted
        assert (await limiter.reserve("key_a", limits, 1, 1)).reason == "held"  # the hold fills the budget
        await limiter.settle("key_a", limits, 100, 50, 0, requests=1)  # undone: nothing was used
        again = await limiter.reserve("key_a", limits, 100, 50)
        assert again.admitted, again
        # An ordinary settle gives back tokens and the hold, never the request.
        await limiter.settle("key_a", limits, 100, 50, 0)
        assert (await limiter.reserve("key_a", limits, 1, 1)).reason == "requests"
        await limiter.close()

    asyncio.run(run())


def test_a_budget_held_is_told_apart_from_a_budget_spent(tmp_path: Path, make: Make) -> None:
    async def run() -> None:
        limiter = make(tmp_path)
        limits = Limits(budget_nanos=100)
        assert (await limiter.reserve("key_b", limits, 0, 80)).admitted
        assert (await limiter.reserve("key_b", limits, 0, 30)).admitted  # 80 held < 100: admitted
        held = await limiter.reserve("key_b", limits, 0, 1)
        assert (held.admitted, held.reason, held.retry_after) == (False, "held", 1.0)
        await limiter.settle("key_b", limits, 0, 80, 10)  # one ends, costing 10 of its 80
        assert (await limiter.reserve("key_b", limits, 0, 1)).admitted  # 10 spent + 31 held
        await limiter.settle("key_b", limits, 0, 30, 95)
        await limiter.settle("key_b", limits, 0, 1, 0)
        spent = await limiter.reserve("key_b", limits, 0, 1)  # 105 spent: over, nothing held
        assert (spent.admitted, spent.reason) == (False, "quota")
        await limiter.close()

    asyncio.run(run())


def test_the_tighter_snapshot_per_kind() -> None:
    key = Snapshot(rpm=100, requests_left=99, tpm=None, tokens_left=0)
    team = Snapshot(rpm=2, requests_left=1, tpm=500, tokens_left=400)
    assert tighter(key, team) == Snapshot(2, 1, 500, 400)
    assert tighter(team, Snapshot(None, 0, 1000, 10)) == Snapshot(2, 1, 1000, 10)
