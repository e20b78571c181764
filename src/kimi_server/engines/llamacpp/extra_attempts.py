"""Reasoning attempts decoded alongside the request's own, on slots nobody else is using.

The prompted reasoning is a series of independent attempts, each sampled from the conversation
alone, until the effort's floor is reached. Decoded one after another, short replies need many
rounds; llama.cpp decodes every busy slot in one batch per step, which on a CPU costs far less
than as many steps one by one. So once the first attempt has shown how long attempts run, each
round decodes about as many as the floor still needs: one on the request's own slot, the others
on slots the prompt-cache ledger lends while the request is alone on the engine (never one
holding another tenant's prefix); their text waits until its turn to be shown.

What the client sees and pays for is what decoding them in turn would give: an extra attempt is
shown and counted only if the attempts before it had not yet reached the floor; one that turns
out not to be needed is stopped as soon as that is certain, and neither shown nor billed. Each
extra is limited to the room the cap is sure to leave it (``cap - floor + 1``), so the total
never passes the cap. The next request to get a slot takes the lent ones back at once: an extra
not yet shown stops and, if it was needed after all, a later round decodes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kimi_server.engines.llamacpp.phase_context import PhaseContext, Tally
from kimi_server.engines.types import ReasoningDelta

if TYPE_CHECKING:
    from kimi_server.engines.llamacpp.prompt_cache import Lease, PromptCacheLedger
    from kimi_server.engines.llamacpp.reasoning_step import Attempt
    from kimi_server.engines.types import GenerationRequest

log = logging.getLogger(__name__)

# Below this much room an extra attempt is mostly its forced lead: not worth a slot.
MIN_EXTRA_ROOM = 8
# The longest prompt whose attempts decode on several slots: each slot reads it again, which
# for a longer one costs more than decoding the attempts together saves.
TOGETHER_PROMPT_MAX = 512


@dataclass
class SpareSlots:
    """What the engine lends one request: ``borrow(take_back)`` a free slot's lease or None;
    ``give_back(lease)`` when done with it. ``most``: attempts decoded at once, its own
    included."""

    borrow: Callable[[Callable[[], None]], Lease | None]
    give_back: Callable[[Lease], None]
    most: int


def spare_slots(
    ledger: PromptCacheLedger,
    request: GenerationRequest,
    prompt: str,
    prompt_tokens: int,
    *,
    together: int,
    seeded_too: bool,
    after_give_back: Callable[[], None],
) -> SpareSlots | None:
    """Free slots this request may decode reasoning attempts on, ``together`` at most with its
    own. Each reads the prompt again (or reuses its namespace's cached prefix there), so only a
    short prompt is worth it; and a seeded request decodes alone unless ``seeded_too``, since
    the batches it would share change its answer."""
    if together < 2 or prompt_tokens > TOGETHER_PROMPT_MAX:
        return None
    if request.seed is not None and not seeded_too:
        return None
    namespace, model = request.cache.namespace, request.model

    def borrow(take_back: Callable[[], None]) -> Lease | None:
        return ledger.try_borrow(namespace, prompt, model=model, take_back=take_back)

    def give_back(lease: Lease) -> None:
        ledger.abandon(lease)
        after_give_back()

    return SpareSlots(borrow, give_back, together)


RunAttempt = Callable[[PhaseContext, int, int], AsyncGenerator["ReasoningDelta | Attempt", None]]


@dataclass
class Extra:
    """One attempt decoding on a lent slot: its items queue up until it is its turn."""

    seed_offset: int
    ctx: PhaseContext  # the request's, on the lent slot with a tally of its own
    items: asyncio.Queue[ReasoningDelta | Attempt | None] = field(default_factory=asyncio.Queue)
    progress: int = 0  # pieces decoded so far: a lower bound on its tokens
    shown: bool = False  # its turn came: it is streamed and counted
    stopped: bool = False
    task: asyncio.Task[None] | None = None

    def stop(self) -> None:
        """Stops it unless it is already being shown (then it ends within its room)."""
        if not self.shown and not self.stopped:
            self.stopped = True
            if self.task is not None:
                self.task.cancel()


def extra_room(cap: int, floor: int, spent: int) -> int:
    """The room every extra gets: an extra is shown only while the attempts before it total
    less than the floor, so at least this much of the cap is left to it then."""
    return min(cap - floor + 1, cap - spent)


def extras_wanted(spare: SpareSlots, floor: int, spent: int, attempts_so_far: int) -> int:
    """How many to decode alongside the next attempt: none beside the first, whose length is
    the evidence (a long first attempt needs few others or none, and extras started beside it
    would mostly be decoded for nothing); then about as many as the floor still needs at the
    length the attempts have had, within ``most``."""
    most = spare.most - 1
    if attempts_so_far == 0 or spent <= 0:
        return 0
    per_attempt = max(spent / attempts_so_far, 1.0)
    needed = -(-(floor - spent) // per_attempt)  # ceiling: attempts still to reach the floor
    return max(0, min(most, int(needed) - 1))


class _Lent:
    """One lent slot: the extra decoding on it, if any, and whether it was asked back."""

    def __init__(self, pool: LentSlots) -> None:
        self.pool = pool
        self.lease: Lease | None = None
        self.extra: Extra | None = None
        self.asked_back = False
        self.used = False  # an attempt ran here: the slot holds the prompt

    def __call__(self) -> None:
        """The ledger wants the slot for a request: stop what runs on it, then hand it back."""
        self.asked_back = True
        if self.extra is not None and not self.extra.shown:
            self.extra.stop()
        elif self.extra is None:
            self.pool.release(self)


class LentSlots:
    """The slots one request's reasoning borrows, kept across its rounds of attempts (each holds
    the prompt once read, so a later attempt there reads nothing again) and all given back when
    the reasoning ends, or one by one as other requests need them."""

    def __init__(self, spare: SpareSlots) -> None:
        self.spare = spare
        self.idle: list[_Lent] = []
        self.closed = False
        self.borrowed = False  # its first round with extras borrowed what it could

    def take(self, *, borrow: bool) -> _Lent | None:
        """An idle lent slot, else (``borrow``) a newly lent one. Later rounds only reuse: a
        new slot would read the whole prompt while the others wait in its batches."""
        if self.idle:
            return self.idle.pop(0)
        if not borrow:
            return None
        lent = _Lent(self)
        lease = self.spare.borrow(lent)
        if lease is None:
            return None
        lent.lease = lease
        return lent

    def release(self, lent: _Lent) -> None:
        """An attempt on it ended (or none runs): back to the pool, or to the ledger."""
        lent.extra = None
        if lent in self.idle:
            self.idle.remove(lent)
        if self.closed or lent.asked_back:
            if lent.lease is not None:
                self.spare.give_back(lent.lease)
                lent.lease = None
        else:
            self.idle.append(lent)

    def close(self) -> None:
        self.closed = True
        for lent in list(self.idle):
            self.release(lent)


def start_extras(
    ctx: PhaseContext, pool: LentSlots, run: RunAttempt, first_offset: int, count: int, room: int
) -> list[Extra]:
    """Starts up to ``count`` attempts on lent slots (seed offsets from ``first_offset``);
    fewer when fewer slots are free."""
    extras: list[Extra] = []
    if room < MIN_EXTRA_ROOM:
        return extras
    for n in range(count):
        lent = pool.take(borrow=not pool.borrowed)
        if lent is None or lent.lease is None:
            break
        on_slot = replace(
            ctx,
            slot=lent.lease.holder,
            reuse=(lent.used or lent.lease.reuse) and ctx.request.seed is None,
            settle=None,
            tally=Tally(),
            context_full=False,
            reasoning_looped=False,
            looped=False,
            spare=None,
        )
        lent.used = True
        extra = Extra(first_offset + n, on_slot)
        lent.extra = extra
        extra.task = asyncio.get_running_loop().create_task(_decode(extra, run, room, pool, lent))
        extras.append(extra)
    pool.borrowed = pool.borrowed or count > 0
    return extras


async def _decode(extra: Extra, run: RunAttempt, room: int, pool: LentSlots, lent: _Lent) -> None:
    try:
        async with contextlib.aclosing(run(extra.ctx, extra.seed_offset, room)) as items:
            async for item in items:
                if isinstance(item, ReasoningDelta):
                    extra.progress += 1
                extra.items.put_nowait(item)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # an extra is a bonus: its failure must not fail the request
        log.info("an extra reasoning attempt ended early: %s", exc)
    finally:
        extra.items.put_nowait(None)
        # Back in the pool at once, so the next round finds it (its call, if stopped, ends
        # at its next token; a call started there meanwhile waits for it in llama.cpp).
        pool.release(lent)


def prune(extras: list[Extra], before: int, floor: int) -> None:
    """Stops the extras certain not to be needed: those whose predecessors (``before``: the
    tokens of every attempt ahead of the first extra, at least) already reach the floor."""
    total = before
    for extra in extras:
        if total >= floor:
            extra.stop()
        elif not extra.stopped:
            total += extra.progress


async def shown(ctx: PhaseContext, extra: Extra) -> AsyncIterator[ReasoningDelta | Attempt]:
    """Its turn: what it decoded so far, then the rest as it comes; its tokens join the
    request's tally when it ends. Nothing for one that was stopped."""
    if extra.stopped:
        return
    extra.shown = True
    while (item := await extra.items.get()) is not None:
        if not isinstance(item, ReasoningDelta):
            ctx.tally.reasoning += item.tokens
            ctx.tally.completion += item.tokens
            ctx.reasoning_looped = ctx.reasoning_looped or item.looped
        yield item


async def in_turn(
    ctx: PhaseContext, extras: list[Extra], floor: int, count: int
) -> AsyncIterator[ReasoningDelta | Attempt]:
    """The extras whose turn comes, in order, each after its label (``count``: the attempts
    shown before them), while the attempts shown so far fall short of the floor."""
    for extra in extras:
        if ctx.reasoning_ended or ctx.tally.reasoning >= floor:
            return
        label: ReasoningDelta | None = ReasoningDelta(f"\n\nAttempt {count + 1}:\n")
        async for item in shown(ctx, extra):
            if label is not None:
                yield label
                label = None
            yield item
            if not isinstance(item, ReasoningDelta):
                count += 1


def finish(extras: list[Extra]) -> None:
    """Stops what still runs (each slot is given back when its attempt has ended)."""
    for extra in extras:
        extra.shown = False
        extra.stop()
