"""The fair queue on its own (gate/admission.py): order, bounds, and no slot ever lost."""

from __future__ import annotations

import asyncio

import pytest

from kimi_server.gate.admission import Admission, AdmissionLimits, KeyOverShareError, OverloadedError, QueuePlace


def test_waiting_keys_are_served_in_turn_not_first_come_first_served() -> None:
    async def run() -> list[str]:
        adm = Admission(AdmissionLimits(slots=1))
        held = await adm.admit("a")
        order: list[str] = []

        async def wait(key: str) -> None:
            ticket = await adm.admit(key)
            order.append(key)
            await asyncio.sleep(0.01)
            ticket.release()

        tasks = []
        for key in ("a", "a", "a", "b", "c"):  # a's burst arrives first
            tasks.append(asyncio.ensure_future(wait(key)))
            await asyncio.sleep(0)
        held.release()
        await asyncio.gather(*tasks)
        assert adm.active == 0 and adm.waiting == 0
        return order

    assert asyncio.run(run()) == ["a", "b", "c", "a", "a"]


def test_the_waiting_key_holding_fewer_slots_goes_first() -> None:
    async def run() -> str:
        adm = Admission(AdmissionLimits(slots=2))
        a1 = await adm.admit("a")
        b1 = await adm.admit("b")
        a_next = asyncio.ensure_future(adm.admit("a"))
        await asyncio.sleep(0)
        c_next = asyncio.ensure_future(adm.admit("c"))
        await asyncio.sleep(0)
        b1.release()  # a still holds a slot, c none: c goes first though a asked earlier
        await asyncio.sleep(0.01)
        first = "c" if c_next.done() else "a"
        a1.release()
        for task in (a_next, c_next):
            (await task).release()
        return first

    assert asyncio.run(run()) == "c"


def test_bounds_refuse_with_retry_after() -> None:
    async def run() -> None:
        adm = Admission(AdmissionLimits(slots=1, max_queue=2, max_queue_per_key=1, max_wait=60))
        first = await adm.admit("a")
        waiting = [asyncio.ensure_future(adm.admit(k)) for k in ("a", "b")]
        await asyncio.sleep(0)
        with pytest.raises(KeyOverShareError) as share:
            await adm.admit("a")
        assert share.value.status_code == 429 and share.value.retry_after is not None and share.value.retry_after >= 1
        with pytest.raises(OverloadedError) as full:
            await adm.admit("c")
        assert full.value.status_code == 503 and full.value.retry_after is not None and full.value.retry_after >= 1
        first.release()
        for task in waiting:
            (await task).release()
        assert adm.totals()["rejected_key_share"] == 1 and adm.totals()["rejected_queue_full"] == 1
        assert adm.key_stats("c")["rejected_queue_full"] == 1 and adm.key_stats("b")["rejected_queue_full"] == 0

    asyncio.run(run())


def test_a_cancel_that_races_a_grant_loses_no_slot() -> None:
    async def run() -> None:
        adm = Admission(AdmissionLimits(slots=1))
        for _ in range(20):
            first = await adm.admit("a")
            task = asyncio.ensure_future(adm.admit("b"))
            await asyncio.sleep(0)
            first.release()  # grants b's turn ...
            task.cancel()  # ... in the same instant as its client leaves
            (result,) = await asyncio.gather(task, return_exceptions=True)
            if isinstance(result, QueuePlace):
                result.release()  # what gate/admit.py:take_turn's discard does
            assert adm.active == 0 and adm.waiting == 0

    asyncio.run(run())


def test_a_wait_past_the_limit_is_refused_and_leaves_the_queue() -> None:
    async def run() -> None:
        adm = Admission(AdmissionLimits(slots=1, max_wait=0.05))
        first = await adm.admit("a")
        with pytest.raises(OverloadedError) as late:
            await adm.admit("b")
        assert late.value.code == "queue_timeout"
        assert adm.waiting == 0
        first.release()
        assert adm.active == 0

    asyncio.run(run())


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_request_predicted_to_wait_past_the_limit_is_refused_at_once() -> None:
    async def run() -> None:
        clock = FakeClock()
        adm = Admission(AdmissionLimits(slots=1, max_wait=30), clock=clock)
        # No prediction on a cold server: too few requests have finished to know how long one takes.
        assert adm.predicted_wait("a") is None
        for _ in range(8):  # each holds its slot 10 s
            place = await adm.admit("a")
            clock.now += 10
            place.release()
        held = await adm.admit("a")
        clock.now += 4  # 6 s left on the slot held now
        assert adm.predicted_wait("b") == pytest.approx(6)
        waiting = [asyncio.ensure_future(adm.admit("a")) for _ in range(3)]
        await asyncio.sleep(0)
        # One more from "a" comes after a's three: 6 + 3 x 10 s, past the limit of 30 s.
        assert adm.predicted_wait("a") == pytest.approx(36)
        with pytest.raises(OverloadedError) as refused:
            await adm.admit("a")
        assert refused.value.code == "queue_timeout" and refused.value.retry_after == 6
        assert "about 36 s" in refused.value.message
        assert adm.key_stats("a")["refused_early"] == 1 and adm.waiting == 3
        # Another key goes ahead of a's queue after a's next turn (a then holds a slot, c none):
        # 6 + 10 s, within the limit, so it waits.
        assert adm.predicted_wait("c") == pytest.approx(16)
        late = asyncio.ensure_future(adm.admit("c"))
        await asyncio.sleep(0)
        assert adm.waiting == 4 and not late.done()
        held.release()
        (await waiting[0]).release()
        assert adm.key_stats("c")["admitted_requests"] == 1  # served second, as predicted
        assert adm.key_stats("a")["queued_requests"] == 2
        (await late).release()
        for task in waiting[1:]:
            (await task).release()
        assert adm.active == 0 and adm.waiting == 0

    asyncio.run(run())
