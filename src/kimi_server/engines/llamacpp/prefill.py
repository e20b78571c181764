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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kimi_server.engines.llamacpp.phases import PhaseContext
from kimi_server.engines.llamacpp.runner import CompletionResult
from kimi_server.errors import InvalidRequestError


async def prefill_in_turns(
    ctx: PhaseContext, prompt: str, cuts: Sequence[int], *, stride: int, shared: Callable[[], bool]
) -> int | None:
    """Computes ``prompt`` on the request's slot in turns ending at ``cuts`` (one short turn
    apart): one cut at a time while ``shared()``, ``stride`` cuts at a time otherwise, until
    no more than a turn is left for the request's own first call. Returns the tokens the slot
    held before the first turn that computed anything (the request's real cache hit: after the
    turns everything looks cached to the call that follows); None if no turn computed."""
    held: int | None = None
    index, first = -1, True
    while True:
        index += 1 if shared() else stride
        if index >= len(cuts):
            return held
        # The first turn may reuse the slot's KV only where the prompt cache allows; later
        # turns extend this request's own.
        body = ctx.body(prompt[: cuts[index]], 0, cache_prompt=ctx.reuse or not first)
        first = False
        try:
            async for item in ctx.runner.stream(body):
                if not isinstance(item, CompletionResult) or held is not None:
                    continue
                # llama.cpp recomputes a fully cached prompt's last token, and only that.
                if item.cached_tokens < item.prompt_tokens - 1:
                    held = item.cached_tokens
        except InvalidRequestError:
            return held  # the request's own first call reports what does not fit


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
