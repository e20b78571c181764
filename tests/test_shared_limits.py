"""The limits file the workers of one server share: two limiters on one file (two workers) see
one bucket per key, holds taken by one are settled by the other, and a table with no room or a
file that stops working leaves requests limited by the worker alone instead of failing them."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

from kimi_server.gate.limits import Limits
from kimi_server.gate.shared_limits import MappedLimiter


def test_two_limiters_on_one_file_share_the_bucket(tmp_path: Path) -> None:
    async def run() -> list[bool]:
        a, b = MappedLimiter(tmp_path / "l.map"), MappedLimiter(tmp_path / "l.map")
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
        a, b = MappedLimiter(tmp_path / "l.map"), MappedLimiter(tmp_path / "l.map")
        limits = Limits(budget_nanos=100)
        assert (await a.reserve("key", limits, 0, 100)).admitted  # holds the whole budget
        assert (await b.reserve("key", limits, 0, 1)).reason == "held"  # held by a request in flight, not spent
        await b.settle("key", limits, 0, 100, 40)  # spent 40 of the hold
        assert (await a.reserve("key", limits, 0, 10)).admitted
        await a.close()
        await b.close()

    asyncio.run(run())


def _reserve_many(path: str, count: int, admitted: multiprocessing.Queue[int]) -> None:
    async def run() -> int:
        limiter = MappedLimiter(Path(path))
        n = sum([(await limiter.reserve("key", Limits(budget_nanos=300), 0, 1)).admitted for _ in range(count)])
        await limiter.close()
        return n

    admitted.put(asyncio.run(run()))


def test_processes_racing_on_one_key_admit_exactly_the_limit(tmp_path: Path) -> None:
    # Four processes at once, 200 tries each, each holding 1 of a budget of 300 (a budget does
    # not refill, as a rate does): the lock makes every check-and-take atomic, so exactly 300
    # pass (a lost update would let more through).
    context = multiprocessing.get_context("spawn")
    admitted: multiprocessing.Queue[int] = context.Queue()
    procs = [context.Process(target=_reserve_many, args=(str(tmp_path / "l.map"), 200, admitted)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert sum(admitted.get(timeout=5) for _ in procs) == 300


def test_a_full_table_leaves_new_keys_to_this_worker(tmp_path: Path) -> None:
    async def run() -> None:
        limiter = MappedLimiter(tmp_path / "l.map", slots=2)
        limits = Limits(rpm=1)
        for key in ("a", "b"):
            assert (await limiter.reserve(key, limits, 1, 0)).admitted
        # No slot for "c": still limited, by this worker's own figures.
        assert (await limiter.reserve("c", limits, 1, 0)).admitted
        assert (await limiter.reserve("c", limits, 1, 0)).reason == "requests"
        assert (await limiter.reserve("a", limits, 1, 0)).reason == "requests"  # shared ones still shared
        await limiter.close()

    asyncio.run(run())


def test_a_broken_file_falls_back_to_this_worker(tmp_path: Path) -> None:
    async def run() -> None:
        limiter = MappedLimiter(tmp_path / "l.map")
        limiter._map.close()  # the mapping gone: every access fails
        limits = Limits(rpm=1)
        assert (await limiter.reserve("key", limits, 1, 0)).admitted
        assert (await limiter.reserve("key", limits, 1, 0)).reason == "requests"  # still limited
        limiter._map = type(limiter._map)(-1, 16)  # something close() may close
        await limiter.close()

    asyncio.run(run())
