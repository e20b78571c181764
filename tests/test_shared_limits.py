"""The limits file the workers of one server share: two limiters on one file (two workers) see
one bucket per key, holds taken by one are settled by the other, and a file that stops working
leaves requests limited by the worker alone instead of failing them."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from kimi_server.gate.limits import Limits
from kimi_server.gate.shared_limits import SqliteLimiter


def test_two_limiters_on_one_file_share_the_bucket(tmp_path: Path) -> None:
    async def run() -> list[bool]:
        a, b = SqliteLimiter(tmp_path / "l.sqlite3"), SqliteLimiter(tmp_path / "l.sqlite3")
        limits = Limits(rpm=3)
        out = [(await (a if n % 2 else b).reserve("key", limits, 10, 0)).admitted for n in range(5)]
        refused = await a.reserve("key", limits, 10, 0)
        assert refused.reason == "requests" and refused.retry_after > 0
        assert (await b.reserve("other", limits, 10, 0)).admitted  # keys apart
        await a.close()
        await b.close()
        return out

    assert asyncio.run(run()) == [True, True, True, False, False]


def test_a_hold_taken_in_one_worker_is_settled_in_another(tmp_path: Path) -> None:
    async def run() -> None:
        a, b = SqliteLimiter(tmp_path / "l.sqlite3"), SqliteLimiter(tmp_path / "l.sqlite3")
        limits = Limits(budget_nanos=100)
        assert (await a.reserve("key", limits, 0, 100)).admitted  # holds the whole budget
        assert (await b.reserve("key", limits, 0, 1)).reason == "quota"
        await b.settle("key", limits, 0, 100, 40)  # spent 40 of the hold
        assert (await a.reserve("key", limits, 0, 10)).admitted
        await a.close()
        await b.close()

    asyncio.run(run())


def test_a_broken_file_falls_back_to_this_worker(tmp_path: Path) -> None:
    async def run() -> None:
        limiter = SqliteLimiter(tmp_path / "l.sqlite3")
        with sqlite3.connect(tmp_path / "l.sqlite3") as other:
            other.execute("DROP TABLE buckets")
        limits = Limits(rpm=1)
        assert (await limiter.reserve("key", limits, 1, 0)).admitted
        assert (await limiter.reserve("key", limits, 1, 0)).reason == "requests"  # still limited
        await limiter.close()

    asyncio.run(run())
