"""A prompt read in turns, so that it cannot hold the engine for everyone else.

llama.cpp's loop fills each batch with one token of every generating slot, then with prompt
tokens of the slots still reading their prompt, in slot order, up to ``n_batch``. So while one
slot reads a long prompt, every other slot gets one token per batch of it, and a request on a
higher slot gets no room for its own prompt until the long one is read.

So a prompt is read as several llama.cpp calls on the request's slot, each extending its KV by
a turn (``n_predict`` 0, the cache kept). While another request holds a slot, a turn is short
(``prefill_turn_shared`` tokens): the step it makes costs the others little more than their
own token, and between two turns a waiting prompt gets its place. On an otherwise idle engine
turns are long (``prefill_turn``, which is also llama.cpp's batch), so a prompt read alone
loses little speed.

Short turns alone would starve the long prompt instead: each is a call of its own, and beside a
key that keeps streaming, a turn costs the time of the others' tokens too (8-token turns read a
6,000-token prompt in 750 turns, more than 300 s). So a prompt also keeps a pace (``Pace``): it
must have read, by any moment, the tokens it would have read at 1/``prefill_slowdown`` of the
speed its own turns show; when it falls behind, its turns grow (up to a long turn) until it has
caught up; ahead of it, it leaves the engine to the others until it is due again. Its time to the
first token is then bounded and proportional to its length, and the others give up no more than
that share of the engine.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kimi_server.engines.llamacpp.phases import PhaseContext
from kimi_server.engines.llamacpp.runner import CompletionResult
from kimi_server.engines.llamacpp.tokenizer import PromptTokenizer
from kimi_server.errors import InvalidRequestError


@dataclass
class Pace:
    """The least a prompt read in turns must have read by now: its tokens at 1/``slowdown`` of
    the speed the engine showed on its cheapest turn so far (llama.cpp's own prompt time, which
    counts the other slots' tokens in the same batches too, so the figure errs on the slow side).
    ``turn``: the tokens of one short turn (one cut)."""

    slowdown: float
    turn: int
    started: float = field(default_factory=time.monotonic)
    seconds_per_token: float | None = None

    def observe(self, result: CompletionResult) -> None:
        computed = result.prompt_tokens - result.cached_tokens
        if computed <= 0 or result.prompt_ms <= 0:
            return
        cost = result.prompt_ms / 1000 / computed
        if self.seconds_per_token is None or cost < self.seconds_per_token:
            self.seconds_per_token = cost

    def ahead(self, cuts_read: int, now: float | None = None) -> float:
        """Seconds until ``cuts_read`` short turns are due: how far ahead of its pace the prompt
        is (0 when it is not, or nothing is measured yet)."""
        if self.seconds_per_token is None:
            return 0.0
        elapsed = (time.monotonic() if now is None else now) - self.started
        return max(0.0, cuts_read * self.turn * self.seconds_per_token * self.slowdown - elapsed)

    def cuts_due(self, now: float | None = None) -> int:
        """How many short turns' worth of the prompt should be read by ``now``."""
        if self.seconds_per_token is None:
            return 0  # nothing measured yet: the first turn is a short one
        elapsed = (time.monotonic() if now is None else now) - self.started
        return math.floor(elapsed / (self.seconds_per_token * self.slowdown) / self.turn)


# Others still count as busy this long after the last sign of them: a key streaming request
# after request leaves the engine free only between two of them, and a long turn begun in that
# gap would hold its next request's first token.
SHARED_GRACE = 2.0
# The longest a prompt ahead of its pace leaves the engine to the others before looking again.
MAX_YIELD = 0.5


class Sharing:
    """``shared()``, held on for SHARED_GRACE seconds after it was last true."""

    def __init__(self, shared: Callable[[], bool], grace: float = SHARED_GRACE) -> None:
        self._shared = shared
        self._grace = grace
        self._seen: float | None = None

    def __call__(self) -> bool:
        now = time.monotonic()
        if self._shared():
            self._seen = now
        return self._seen is not None and now - self._seen < self._grace


def next_cut(index: int, *, shared: bool, stride: int, due: int) -> int:
    """The cut the next turn ends at: ``stride`` cuts on when alone; one beside others, or as
    many as it takes to catch up with the pace, at most ``stride`` (one long turn)."""
    if not shared:
        return index + stride
    return index + max(1, min(stride, due - (index + 1)))


async def keep_pace(pace: Pace | None, busy: Sharing, cuts_read: int) -> None:
    """Beside others, a prompt ahead of its pace leaves the engine to them until it is due again
    (their tokens then come without a turn in their batch)."""
    while pace is not None and busy():
        wait = pace.ahead(cuts_read)
        if wait <= 0:
            return
        await asyncio.sleep(min(wait, MAX_YIELD))


async def prefill_in_turns(
    ctx: PhaseContext,
    prompt: str,
    cuts: Sequence[int],
    *,
    stride: int,
    shared: Callable[[], bool],
    pace: Pace | None = None,
) -> int | None:
    """Computes ``prompt`` on the request's slot in turns ending at ``cuts`` (one short turn
    apart): ``stride`` cuts at a time when alone; while ``shared()`` (or within SHARED_GRACE of
    it), one cut at a time, or more
    where the prompt has fallen behind its ``pace``, until no more than a turn is left for the
    request's own first call. Returns the tokens the slot held before the first turn that
    computed anything (the request's real cache hit: after the turns everything looks cached to
    the call that follows); None if no turn computed."""
    held: int | None = None
    index, first = -1, True
    busy = Sharing(shared)
    while True:
        await keep_pace(pace, busy, index + 1)
        due = pace.cuts_due() if pace is not None else 0
        index = next_cut(index, shared=busy(), stride=stride, due=due)
        if index >= len(cuts):
            return held
        # The first turn may reuse the slot's KV only where the prompt cache allows; later
        # turns extend this request's own.
        body = ctx.body(prompt[: cuts[index]], 0, cache_prompt=ctx.reuse or not first)
        first = False
        try:
            async for item in ctx.runner.stream(body):
                if not isinstance(item, CompletionResult):
                    continue
                if pace is not None:
                    pace.observe(item)
                if held is not None:
                    continue
                # llama.cpp recomputes a fully cached prompt's last token, and only that.
                if item.cached_tokens < item.prompt_tokens - 1:
                    held = item.cached_tokens
        except InvalidRequestError:
            return held  # the request's own first call reports what does not fit


@dataclass(frozen=True)
class TurnSizes:
    """The operator's turns: ``alone`` tokens per turn on an idle engine (llama.cpp's batch),
    ``shared`` while others run (0: no turns), and the pace's ``slowdown``."""

    alone: int
    shared: int
    slowdown: float


async def long_prompt_cuts(tokenizer: PromptTokenizer | None, prompt: str, sizes: TurnSizes) -> list[int]:
    """Where a prompt longer than one long turn is cut into short turns. A shorter one is read in
    one step, as any request's later calls are: one brief pause for the others, and no extra calls."""
    short, long = sizes.shared, sizes.alone
    if tokenizer is None or short <= 0 or len(prompt.encode("utf-8", errors="replace")) <= long:
        return []  # fewer bytes than a long turn: fewer tokens too
    cuts = await asyncio.to_thread(tokenizer.cuts, prompt, short)
    return cuts if (len(cuts) + 1) * short > long else []


async def read_in_turns(
    ctx: PhaseContext, prompt: str, cuts: Sequence[int], sizes: TurnSizes, *, shared: Callable[[], bool]
) -> None:
    """Reads the prompt in turns at its pace; the slot then holds this request's own prompt,
    whatever the prompt cache allowed, and the tally its real cache hit."""
    stride = max(1, sizes.alone // sizes.shared)
    pace = Pace(sizes.slowdown, sizes.shared)
    ctx.tally.cache_hit = await prefill_in_turns(ctx, prompt, cuts, stride=stride, shared=shared, pace=pace)
    ctx.reuse = ctx.reuse or ctx.tally.cache_hit is not None


def turns_to_run(cuts: Sequence[int], prompt: str, cached_text: str | None) -> list[int]:
    """The cuts past what the slot already holds (``cached_text``, when the prompt cache lets
    the request reuse it): a turn inside the cached prefix would only cut the slot's KV short."""
    if not cached_text:
        return list(cuts)
    held = shared_prefix(cached_text, prompt)
    return [cut for cut in cuts if cut > held]


def shared_prefix(a: str, b: str) -> int:
    """Length of the common prefix of two strings, by halving (each comparison runs in C)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low
