"""The prompt cache: a repeated prefix is read from the cache the second time. An endpoint that
says the model has none (``capabilities.prompt_cache: false`` in ``GET /models``) skips it."""

from __future__ import annotations

import secrets
from typing import Any

from kimi_server.verify.outcome import Skipped, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ACCEPT_TOKENS, Target

# A prefix long enough for any cache's block size (a few hundred tokens), opened by a fresh tag
# so that the first request cannot hit anything an earlier run left.
FACTS = " ".join(
    f"Fact {i}: the {w} is number {i * 7 % 31}."
    for i, w in enumerate(["river", "mountain", "lantern", "harbour", "orchard", "glacier", "meadow", "canyon"] * 8)
)


def _usage(t: Target, model: str, prefix: str, question: str) -> dict[str, Any]:
    messages = [{"role": "system", "content": prefix}, {"role": "user", "content": question}]
    usage: dict[str, Any] = t.chat(model=model, messages=messages, max_completion_tokens=ACCEPT_TOKENS)["usage"]
    return usage


@check("cache", "repeated prefix is a cache hit")
def repeated_prefix(t: Target, model: str) -> str:
    if t.declared(model, "prompt_cache") is False:
        raise Skipped(f"GET /models says {model} has no prompt cache (capabilities.prompt_cache: false)")
    prefix = f"Run {secrets.token_hex(6)}. Answer from these facts. {FACTS}"
    first = _usage(t, model, prefix, "What is the river's number?")
    second = _usage(t, model, prefix, "What is the lantern's number?")
    hit = (second.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    cold = (first.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    expect(hit > 0, f"cached_tokens 0 on the second call with a {second.get('prompt_tokens')}-token prompt")
    expect(hit <= second["prompt_tokens"], "cached_tokens over prompt_tokens")
    writes = (first.get("prompt_tokens_details") or {}).get("cache_write_tokens")
    note = f"; first call wrote {writes}" if t.rules(model).cache_options and writes is not None else ""
    return f"{hit} of {second['prompt_tokens']} prompt tokens cached (first call: {cold}){note}"
