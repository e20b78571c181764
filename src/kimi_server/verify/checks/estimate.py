"""Token estimation (``POST /tokenizers/estimate-token-count``) in Kimi's shape: ``{"data":
{"total_tokens": N}}`` for a Chat Completions body, equal to the ``prompt_tokens`` that same
request is billed (skipped, with both figures, where ``GET /models`` says the engine does not
count exactly), and a body without messages refused naming ``messages``. An endpoint without
the route skips the group."""

from __future__ import annotations

import secrets
from typing import Any

from kimi_server.verify.outcome import Skipped, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ACCEPT_TOKENS, Target, error_text

PATH = "/tokenizers/estimate-token-count"


def _estimate(t: Target, body: dict[str, Any]) -> int:
    resp = t.post(PATH, body)
    if resp.status_code in (404, 405) and "model" not in error_text(resp).lower():
        raise Skipped(f"the endpoint has no token estimation (POST {PATH}: HTTP {resp.status_code})")
    expect(resp.status_code == 200, f"HTTP {resp.status_code}: {error_text(resp)}")
    data = resp.json().get("data")
    total = data.get("total_tokens") if isinstance(data, dict) else None
    expect(isinstance(total, int) and total > 0, f"no data.total_tokens in {resp.text[:120]!r}")
    assert isinstance(total, int)
    return total


@check("estimate", "estimate equals the billed prompt_tokens", per_model=True)
def equals_billed(t: Target, model: str) -> str:
    messages = [
        {"role": "system", "content": f"Run {secrets.token_hex(6)}. Answer in one word."},
        {"role": "user", "content": "What colour is the sky? « ciel » 空"},
    ]
    estimated = _estimate(t, {"model": model, "messages": messages})
    answer = t.chat(model=model, messages=messages, max_completion_tokens=ACCEPT_TOKENS, **t.low_effort(model))
    billed = (answer.get("usage") or {}).get("prompt_tokens")
    expect(isinstance(billed, int), f"the request reported no usage.prompt_tokens: {answer.get('usage')!r}")
    if estimated != billed and t.declared(model, "exact_token_count") is False:
        raise Skipped(
            f"GET /models says {model}'s engine does not count prompts exactly (capabilities.exact_token_count: "
            f"false): estimated {estimated}, billed {billed}"
        )
    expect(estimated == billed, f"estimated {estimated}, billed prompt_tokens {billed}")
    return f"{estimated} tokens both"


@check("estimate", "a body without messages refused")
def refused(t: Target, model: str) -> str:
    _estimate(t, {"model": model, "messages": [{"role": "user", "content": "Hi"}]})  # skips where absent
    t.refused(PATH, {"model": model}, param="messages")
    return "400 naming messages"
