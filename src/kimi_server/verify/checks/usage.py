"""Usage arithmetic: total = prompt + completion, reasoning within completion, cache reads
within the prompt, cache writes reported as the model's row of the table says."""

from __future__ import annotations

from typing import Any

from kimi_server.verify.answers import basic, basic_stream
from kimi_server.verify.outcome import Failed, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ANSWER_TOKENS, Target


def _usages(t: Target, model: str) -> list[tuple[str, dict[str, Any]]]:
    plain = basic(t, model).get("usage")
    expect(isinstance(plain, dict), "the answer carries no usage")
    assert isinstance(plain, dict)
    if model != t.model:  # streams are checked on the first model
        return [("plain", plain)]
    chunks = basic_stream(t, model).events
    streamed = chunks[-1].get("usage") if chunks else None
    expect(isinstance(streamed, dict), "the stream's last chunk carries no usage")
    assert isinstance(streamed, dict)
    return [("plain", plain), ("streamed", streamed)]


def _which(t: Target, model: str) -> str:
    return "plain and streamed" if model == t.model else "plain"


def _int(usage: dict[str, Any], *path: str) -> int:
    value: Any = usage
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if value is None:
        return 0
    if not isinstance(value, int) or value < 0:
        raise Failed(f"{'.'.join(path)} is {value!r}, not a count")
    return value


@check("usage", "total = prompt + completion", per_model=True)
def total(t: Target, model: str) -> str:
    for label, u in _usages(t, model):
        p, c, tot = _int(u, "prompt_tokens"), _int(u, "completion_tokens"), _int(u, "total_tokens")
        expect(p > 0, f"{label}: prompt_tokens is 0")
        expect(tot == p + c, f"{label}: total_tokens {tot} != prompt {p} + completion {c}")
        expect(c <= ANSWER_TOKENS, f"{label}: completion_tokens {c} over the cap {ANSWER_TOKENS}")
    return _which(t, model)


@check("usage", "reasoning within completion", per_model=True)
def reasoning(t: Target, model: str) -> str:
    for label, u in _usages(t, model):
        r, c = _int(u, "completion_tokens_details", "reasoning_tokens"), _int(u, "completion_tokens")
        expect(r <= c, f"{label}: reasoning_tokens {r} > completion_tokens {c}")
    return _which(t, model)


@check("usage", "cached within prompt", per_model=True)
def cached(t: Target, model: str) -> str:
    for label, u in _usages(t, model):
        k, p = _int(u, "prompt_tokens_details", "cached_tokens"), _int(u, "prompt_tokens")
        expect(k <= p, f"{label}: cached_tokens {k} > prompt_tokens {p}")
    return _which(t, model)


@check("usage", "cache-write fields", per_model=True)
def cache_writes(t: Target, model: str) -> str:
    for label, u in _usages(t, model):
        p = _int(u, "prompt_tokens")
        k = _int(u, "prompt_tokens_details", "cached_tokens")
        w = _int(u, "prompt_tokens_details", "cache_write_tokens")
        if t.rules(model).cache_options:
            # Regular input = prompt - cached - writes, which cannot be negative.
            expect(k + w <= p, f"{label}: cached {k} + cache_write {w} > prompt {p}")
        else:
            expect(w == 0, f"{label}: cache_write_tokens {w} on a model that bills writes as input")
    return "writes within the prompt" if t.rules(model).cache_options else "no separate writes"
