"""Whether the embedded model answers: one output token on the utility slot (``/health?deep=1``).

The probe never takes a tenant's slot nor touches the prompt cache: it runs on the utility slot,
where llama.cpp queues it behind at most the server's own short calls. It is bounded by a
timeout, and probes asked for at the same time share one call, so a monitor polling often
cannot keep the slot busy.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

from kimi_server.engines.llamacpp.runner import CompletionResult, CompletionRunner
from kimi_server.errors import APIError

PROBE_TIMEOUT = 10.0
PROBE_PROMPT = "The capital of France is"

_in_flight: weakref.WeakKeyDictionary[CompletionRunner, asyncio.Task[dict[str, Any]]] = weakref.WeakKeyDictionary()


# The bound is the shared probe's own (a caller's asyncio.timeout would not bound the others'),
# and it is named in the answer: a parameter, not the caller's timeout.
async def one_token(
    runner: CompletionRunner | None,
    slot: int,
    timeout: float = PROBE_TIMEOUT,  # noqa: ASYNC109
) -> dict[str, Any]:
    """``{"ok", "latency_ms", "tokens"}`` or ``{"ok": False, "reason"}``."""
    if runner is None:
        return {"ok": False, "reason": "the model is not loaded"}
    task = _in_flight.get(runner)
    if task is None or task.done():
        task = asyncio.create_task(_probe(runner, slot, timeout))
        _in_flight[runner] = task
    # Shielded: a caller that leaves does not cancel the call others wait on.
    return dict(await asyncio.shield(task))


async def _probe(runner: CompletionRunner, slot: int, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
    started = time.monotonic()
    body = {"prompt": PROBE_PROMPT, "n_predict": 1, "temperature": 0.0, "cache_prompt": False, "id_slot": slot}
    result: CompletionResult | None = None
    try:
        async with asyncio.timeout(timeout):
            async for item in runner.stream(body):
                if isinstance(item, CompletionResult):
                    result = item
    except TimeoutError:
        return {"ok": False, "reason": f"no token within {timeout:g} s: the engine is stuck or overloaded"}
    except APIError as exc:
        return {"ok": False, "reason": f"the engine failed: {exc.message}"}
    latency = round((time.monotonic() - started) * 1000, 1)
    if result is None or result.completion_tokens < 1:
        return {"ok": False, "reason": "the engine answered without a token", "latency_ms": latency}
    return {"ok": True, "latency_ms": latency, "tokens": result.completion_tokens}
