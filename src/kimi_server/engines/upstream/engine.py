"""The upstream engine: one public model id served by one or more upstream servers.

Same ``Engine`` protocol as the embedded engine, so both endpoints, the catalogue's rules and
the output shapes are the serving core's, unchanged. Retries and failover happen only while
nothing has been yielded, so a client never sees output twice.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from kimi_server.engines.owner import CallCounters
from kimi_server.engines.types import EngineEvent, Finish, GenerationRequest, ReasoningDelta
from kimi_server.engines.upstream.counting import EXACT_TOKENIZERS, TokenCounter, Transcript
from kimi_server.engines.upstream.errors import (
    MissingToolCallError,
    UpstreamRateLimitError,
    UpstreamStreamError,
    UpstreamUnavailableError,
)
from kimi_server.engines.upstream.normalise import Normaliser
from kimi_server.engines.upstream.payload import check_capabilities
from kimi_server.engines.upstream.plan import attempt_events, plan_for
from kimi_server.engines.upstream.relay import Failure, Upstream
from kimi_server.engines.upstream.selection import weighted_order
from kimi_server.errors import APIError

log = logging.getLogger(__name__)


class UpstreamEngine:
    def __init__(self, upstreams: Sequence[Upstream], name: str = "upstream") -> None:
        if not upstreams:
            raise ValueError("an upstream engine needs at least one upstream")
        self.upstreams = list(upstreams)
        self.name = name
        self.calls = CallCounters()
        self.counters = {"retries": 0, "failovers": 0}
        self._counters: dict[Upstream, TokenCounter] = {}  # for upstreams that report no usage

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        for up in self.upstreams:
            await up.close()

    def accepts_images(self) -> bool:
        return any(up.cfg.capabilities.vision for up in self.upstreams)

    def stats(self) -> dict[str, int]:
        return {**self.calls.totals(), **self.counters}

    def context_length(self) -> int | None:
        # The smallest window among the upstreams a request may land on, when configured.
        known = [up.cfg.context_length for up in self.upstreams if up.cfg.context_length is not None]
        return min(known) if known else None

    def concurrency(self) -> int:
        # Each upstream serves its own share; a GPU cluster takes far more than the embedded
        # engine's slots, and holding it to those would queue requests it could serve.
        return sum(up.cfg.max_concurrency for up in self.upstreams)

    def tenant_stats(self, key_id: str) -> dict[str, int]:
        return self.calls.tenant(key_id)

    def _candidates(self, req: GenerationRequest) -> list[Upstream]:
        able: list[Upstream] = []
        refusal: APIError | None = None
        for up in self.upstreams:
            try:
                check_capabilities(req, up.cfg.capabilities, up.dialect)
                able.append(up)
            except APIError as exc:
                refusal = refusal or exc
        if not able and refusal is not None:
            raise refusal
        return weighted_order(able, [up.cfg.weight for up in able])

    async def generate(self, req: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        # One generator, counters and retries together: a layer less for every streamed event.
        with self.calls.call():
            # Reasoning switched off: an upstream that thinks anyway is not shown.
            hidden = None if req.reasoning else ReasoningDelta
            sent = False
            last: APIError | None = None
            for up in self._candidates(req):
                self.counters["failovers"] += last is not None  # the previous one failed
                plan = plan_for(req, up)
                for attempt in range(up.cfg.retries + 1):
                    if not up.breaker.allow():
                        last = last or UpstreamUnavailableError("The model's engines are all failing; retry later.")
                        break
                    normaliser = plan.normaliser(up)
                    transcript = Transcript()
                    try:
                        async with aclosing(attempt_events(up, plan, normaliser)) as events:
                            async for event in events:
                                sent = True
                                if isinstance(event, Finish):
                                    event = await self._counted(up, plan.body, normaliser, transcript, event)
                                else:
                                    transcript.add(event)
                                    if type(event) is hidden:
                                        continue
                                yield event
                        up.breaker.success()
                        return
                    except Failure as failure:
                        last = failure.error
                        delay = self._after_failure(up, failure, sent=sent, attempt=attempt)
                        if delay is None:
                            break
                        await asyncio.sleep(delay)
                    except BaseException:
                        up.breaker.release()
                        raise
            raise last or UpstreamUnavailableError("No upstream engine could take the request.")

    def _after_failure(self, up: Upstream, failure: Failure, *, sent: bool, attempt: int) -> float | None:
        """What a failed attempt leads to: seconds to wait before trying this upstream again,
        None to move on to the next one; or the error itself, raised for the client."""
        if failure.counts:
            up.breaker.failure()
        else:
            up.breaker.release()
        log.warning("upstream %s: %s", up.name, failure.error.message)
        cfg = up.cfg
        if sent:
            # Output has reached the client: no retry, the stream ends with an error.
            err = failure.error
            if not isinstance(err, UpstreamStreamError | MissingToolCallError):
                err = UpstreamStreamError(err.message)
            raise err from None
        _pass_retry_after(failure.error, failure.retry_after, cfg.max_retry_after)
        if not failure.failover:
            raise failure.error from None
        if not failure.retry or attempt == cfg.retries:
            return None
        delay = cfg.backoff * (2**attempt)
        if failure.retry_after is not None:
            if failure.retry_after > cfg.max_retry_after:
                return None  # too long to wait here: try the next upstream instead
            delay = max(delay, failure.retry_after)
        self.counters["retries"] += 1
        return float(delay)

    async def _counted(
        self, up: Upstream, body: dict[str, Any], normaliser: Normaliser, transcript: Transcript, finish: Finish
    ) -> Finish:
        """The Finish with the server's own counts where the upstream reported none."""
        no_prompt, no_output = normaliser.missing_counts()
        if not (no_prompt or no_output):
            return finish
        transcript.stopped = finish.reason != "length"
        counts = await self._counter(up).count(body, transcript, need_prompt=no_prompt)
        return replace(finish, usage=normaliser.counted_usage(counts))

    def _counter(self, up: Upstream) -> TokenCounter:
        counter = self._counters.get(up)
        if counter is None:
            counter = self._counters[up] = TokenCounter(up)
        return counter

    def counts_exactly(self) -> bool:
        # llama.cpp's and vLLM's servers render and tokenize the very body they would run;
        # SGLang's count adds estimated framing, and other dialects have no tokenizer at all.
        return all(up.cfg.dialect in EXACT_TOKENIZERS for up in self.upstreams)

    async def ask_prompt_tokens(self, req: GenerationRequest) -> int | None:
        """The prompt by the tokenizer of the upstream the request would go to first, on the body
        it would be sent (engines.base.PromptAsker); None where that upstream has no tokenizer."""
        for up in self._candidates(req):
            return await self._counter(up).prompt(plan_for(req, up).body)
        return None

    async def health(self, deep: bool) -> list[dict[str, Any]]:
        from kimi_server.engines.upstream.health import check_upstream

        if not deep:
            return [{"name": up.name, "state": up.breaker.state} for up in self.upstreams]
        return list(await asyncio.gather(*(check_upstream(up) for up in self.upstreams)))


def _pass_retry_after(error: APIError, seconds: float | None, bound: float) -> None:
    """The client hears the upstream's Retry-After on a 429 or 503, bounded: a misbehaving
    upstream cannot send every client away for an hour."""
    if seconds is not None and isinstance(error, UpstreamRateLimitError | UpstreamUnavailableError):
        error.retry_after = max(1, math.ceil(min(seconds, bound)))
