"""Reasoning attempts decoded together on lent slots (engines/llamacpp/extra_attempts.py), over
a scripted llama.cpp that writes each seed's own text, and the ledger that lends the slots."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

from kimi_server.engines.llamacpp.answer import plan_answer
from kimi_server.engines.llamacpp.extra_attempts import SpareSlots
from kimi_server.engines.llamacpp.grammar import syntax_for_template
from kimi_server.engines.llamacpp.phases import PhaseContext, prompted_generation
from kimi_server.engines.llamacpp.prompt_cache import CacheLimits, Lease, PromptCacheLedger
from kimi_server.engines.llamacpp.runner import CompletionRunner
from kimi_server.engines.llamacpp.template import CHATML
from kimi_server.engines.types import EngineEvent, Finish, ReasoningDelta
from kimi_server.parsers.reasoning import get_reasoning_format
from tests.test_phases import answer_prompt, request


class SeededLlama:
    """Each call writes ``s<seed>t<i> `` tokens, the same whichever slot runs it, and stops by
    itself after ``natural_stop`` tokens unless end-of-turn is masked; it records every call's
    slot and how many calls ran at once."""

    def __init__(self, natural_stop: int) -> None:
        self.natural_stop = natural_stop
        self.calls: list[dict[str, Any]] = []
        self.running = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def handle_completions(self, body: dict[str, Any], callback: Any = None) -> None:
        with self.lock:
            self.calls.append(body)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            limit = body["n_predict"] if body.get("ignore_eos") else min(body["n_predict"], self.natural_stop)
            for i in range(limit):
                time.sleep(0.002)  # lets the other slots' calls interleave
                if callback({"choices": [{"text": f"s{body.get('seed')}t{i} ", "finish_reason": None}]}):
                    return
            reason = "length" if limit == body["n_predict"] else "stop"
            usage = {"prompt_tokens": 10, "completion_tokens": limit}
            callback({"choices": [{"text": "", "finish_reason": reason}], "usage": usage, "timings": {"cache_n": 0}})
        finally:
            with self.lock:
                self.running -= 1


def ledger(holders: int = 4) -> PromptCacheLedger:
    return PromptCacheLedger(CacheLimits(holders=holders, max_active=holders, max_tokens=10**6))


def generate(llama: SeededLlama, floor: int, cap: int, cache: PromptCacheLedger | None) -> list[EngineEvent]:
    req = dataclasses.replace(request(floor=floor, cap=cap, max_out=400), seed=7)

    async def main() -> list[EngineEvent]:
        spare = None
        if cache is not None:
            own = await cache.acquire("key", "PROMPT", 60)

            def borrow(take_back: Any) -> Lease | None:
                return cache.try_borrow("key", "PROMPT", model="", take_back=take_back)

            spare = SpareSlots(borrow, cache.abandon, most=4)
        ctx = PhaseContext(
            CompletionRunner(llama), req, get_reasoning_format("prompted"), {}, answer_prompt=answer_prompt, spare=spare
        )
        if cache is not None:
            ctx.slot = own.holder
        plan = plan_answer(req, syntax_for_template(CHATML))
        events = [e async for e in prompted_generation(ctx, "PROMPT", plan)]
        await asyncio.sleep(0.05)  # the stopped extras' tasks end
        if cache is not None:
            cache.abandon(own)
            assert cache.leased() == 0  # every lent slot came back
        return events

    return asyncio.run(main())


def reasoning_of(events: list[EngineEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, ReasoningDelta))


def test_attempts_decoded_together_show_and_bill_what_one_after_another_would() -> None:
    # The first attempt stops after 3 tokens, every later one after its 3-token lead and 3 more:
    # against a floor of 30, six attempts (33 tokens).
    alone = SeededLlama(natural_stop=3)
    together = SeededLlama(natural_stop=3)
    one_by_one = generate(alone, floor=30, cap=60, cache=None)
    at_once = generate(together, floor=30, cap=60, cache=ledger())
    assert reasoning_of(at_once) == reasoning_of(one_by_one)
    assert "Attempt 6:" in reasoning_of(at_once) and "Attempt 7:" not in reasoning_of(at_once)
    [done_alone] = [e for e in one_by_one if isinstance(e, Finish)]
    [done_together] = [e for e in at_once if isinstance(e, Finish)]
    assert done_together.usage == done_alone.usage
    assert done_together.usage.reasoning_tokens == 3 + 5 * 6
    assert alone.most_at_once == 1 and together.most_at_once > 1
    assert {c.get("id_slot") for c in together.calls} > {0}  # lent slots decoded some


def test_extras_that_turn_out_not_needed_are_neither_shown_nor_billed() -> None:
    # The first attempt (3 tokens) says two more are needed for a floor of 10; three are
    # decoded at once, and the second of them (6 + 6 tokens after the first) already reaches
    # the floor: the third is stopped, never shown, never billed.
    alone = SeededLlama(natural_stop=3)
    together = SeededLlama(natural_stop=3)
    one_by_one = generate(alone, floor=10, cap=60, cache=None)
    at_once = generate(together, floor=10, cap=60, cache=ledger())
    assert reasoning_of(at_once) == reasoning_of(one_by_one)
    assert "Attempt 3:" in reasoning_of(at_once) and "Attempt 4" not in reasoning_of(at_once)
    [done_alone] = [e for e in one_by_one if isinstance(e, Finish)]
    [done_together] = [e for e in at_once if isinstance(e, Finish)]
    assert done_together.usage == done_alone.usage
    assert done_together.usage.reasoning_tokens == 3 + 6 + 6
    assert 7 + 3 in {c.get("seed") for c in together.calls}  # the fourth attempt did start
    assert "s10" not in reasoning_of(at_once)


def test_a_long_first_attempt_starts_no_extras() -> None:
    llama = SeededLlama(natural_stop=40)
    events = generate(llama, floor=30, cap=60, cache=ledger())
    assert {c.get("seed") for c in llama.calls} == {7}
    [done] = [e for e in events if isinstance(e, Finish)]
    assert done.usage.reasoning_tokens == 40


def test_the_ledger_lends_only_empty_or_own_slots_to_a_request_alone_and_takes_them_back() -> None:
    async def main() -> None:
        cache = ledger(holders=4)
        other = await cache.acquire("other", "THEIR PROMPT", 60)
        cache.commit(other, "THEIR PROMPT", 3, prompt_tokens=3, cached_tokens=0)  # now cached, idle
        mine = await cache.acquire("key", "PROMPT", 60)
        asked: list[int] = []
        lent = [cache.try_borrow("key", "PROMPT", model="", take_back=lambda: asked.append(1)) for _ in range(2)]
        assert all(lease is not None for lease in lent)
        assert {lease.holder for lease in lent if lease} & {other.holder, mine.holder} == set()
        # The only free slot left holds another tenant's prefix: never lent.
        assert cache.try_borrow("key", "PROMPT", model="", take_back=lambda: None) is None
        # Another request gets that slot, and every lent one is asked back at once.
        second = cache.try_acquire("third", "X", 60)
        assert second is not None and second.holder == other.holder
        assert len(asked) == 2
        for lease in lent:
            assert lease is not None
            cache.abandon(lease)
        # Two requests now hold slots: nothing is lent while the engine is not one request's.
        assert cache.try_borrow("key", "PROMPT", model="", take_back=lambda: None) is None
        cache.abandon(second)
        assert cache.try_borrow("key", "PROMPT", model="", take_back=lambda: None) is not None

    asyncio.run(main())
