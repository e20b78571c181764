"""Anthropic's Messages API, the rest of the door: each error type in Anthropic's shape,
``count_tokens`` against the input billed for the same request, a ``cache_control`` prefix read
from the cache, and the model list in Anthropic's shape."""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from kimi_server.verify import anthropic as door
from kimi_server.verify.anthropic_message import billed_input, check_message
from kimi_server.verify.checks.cache import FACTS
from kimi_server.verify.outcome import Failed, Skipped, expect
from kimi_server.verify.registry import check
from kimi_server.verify.target import ACCEPT_TOKENS, Target

GROUP = "messages"
COUNT = "/count_tokens"
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")
RATE_LIMIT_TRIES = 30  # requests spent on the limited key before the check gives up


@check(GROUP, "invalid request is 400 naming the field")
def invalid_request(t: Target, model: str) -> str:
    base = {"model": model, "messages": door.SAY_OK}
    door.refused(t, base, names="max_tokens", where="no max_tokens")
    door.refused(t, {**base, "max_tokens": "many"}, names="max_tokens", where="max_tokens 'many'")
    door.refused(t, {**base, "max_tokens": 1, "messages": []}, names="messages", where="empty messages")
    door.refused(t, {"model": model, "messages": []}, names="messages", where="count_tokens", path=COUNT)
    raw = b'{"model": "' + model.encode() + b'", "messages": ['
    door.error_of(door.post(t, None, raw=raw), 400, "invalid_request_error", "malformed JSON")
    return "4 bad fields named; malformed JSON 400"


@check(GROUP, "bad key is 401 authentication_error")
def bad_key(t: Target, model: str) -> None:
    body = door.body(t, model, max_tokens=ACCEPT_TOKENS)
    door.error_of(door.post(t, body, key="sk-verify-not-a-key"), 401, "authentication_error", "a wrong x-api-key")
    door.error_of(door.post(t, body, key=None), 401, "authentication_error", "no key")


@check(GROUP, "unknown model is 404 not_found_error")
def unknown_model(t: Target, model: str) -> None:
    body = {**door.body(t, model, max_tokens=ACCEPT_TOKENS), "model": "kimi-no-such-model"}
    door.error_of(door.post(t, body), 404, "not_found_error", "an unknown model")


@check(GROUP, "body over the limit is 413 request_too_large")
def too_large(t: Target, model: str) -> str:
    if t.body_limit <= 0:
        raise Skipped("no body limit given (--body-limit)")
    filler = "x" * (t.body_limit + 1024)
    raw = json.dumps({"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": filler}]}).encode()
    door.error_of(door.post(t, None, raw=raw), 413, "request_too_large", f"a {len(raw)}-byte body")
    return f"{len(raw)} bytes refused (limit {t.body_limit})"


@check(GROUP, "rate limit is 429 rate_limit_error")
def rate_limited(t: Target, model: str) -> str:
    if not t.limited_key:
        raise Skipped("no rate-limited key given (--limited-key)")
    body = door.body(t, model, max_tokens=ACCEPT_TOKENS)
    for n in range(1, RATE_LIMIT_TRIES + 1):
        resp = door.post(t, body, key=t.limited_key)
        if resp.status_code != 200:
            door.error_of(resp, 429, "rate_limit_error", f"request {n} with the limited key")
            expect(bool(resp.headers.get("retry-after")), "the 429 has no retry-after header")
            named = [h for h in resp.headers if h.startswith("anthropic-ratelimit-")]
            wait = resp.headers["retry-after"]
            return f"refused at request {n}, retry-after {wait}; {len(named)} anthropic-ratelimit-* headers"
    raise Failed(f"{RATE_LIMIT_TRIES} requests with the limited key, none refused")


def _prompt(model: str, tag: str) -> dict[str, Any]:
    system = [{"type": "text", "text": f"Run {tag}. Answer in one word."}]
    return {"model": model, "system": system, "messages": [{"role": "user", "content": "What colour is the sky?"}]}


@check(GROUP, "count_tokens equals the billed input")
def count_tokens(t: Target, model: str) -> str:
    prompt = _prompt(model, secrets.token_hex(6))
    counted = door.answered(door.post(t, prompt, path=COUNT), "count_tokens").get("input_tokens")
    expect(isinstance(counted, int) and counted > 0, f"count_tokens answered input_tokens {counted!r}")
    assert isinstance(counted, int)
    m = door.answered(door.post(t, {**prompt, "max_tokens": ACCEPT_TOKENS}), "the same request created")
    check_message(m, "the same request created")
    billed = billed_input(m["usage"])
    if t.declared(model, "exact_token_count") is False:
        raise Skipped(
            f"GET /models says {model}'s engine does not count prompts exactly (capabilities.exact_token_count: "
            f"false): count_tokens {counted} is an estimate of the {billed} billed"
        )
    expect(counted == billed, f"count_tokens {counted}, billed input {billed} (input + cache read + cache write)")
    return f"{counted} tokens both"


@check(GROUP, "cache_control prefix read from the cache", serial=True)
def cached_prefix(t: Target, model: str) -> str:
    if t.declared(model, "prompt_cache") is False:
        raise Skipped(f"GET /models says {model} has no prompt cache (capabilities.prompt_cache: false)")
    prefix = {"type": "text", "text": f"Run {secrets.token_hex(6)}. {FACTS}", "cache_control": {"type": "ephemeral"}}

    def usage(question: str) -> dict[str, Any]:
        messages = [{"role": "user", "content": question}]
        body = {"model": model, "max_tokens": ACCEPT_TOKENS, "system": [prefix], "messages": messages}
        m = door.answered(door.post(t, body))
        check_message(m, "message")
        found: dict[str, Any] = m["usage"]
        return found

    first, second = usage("What is the river's number?"), usage("What is the lantern's number?")
    read = second["cache_read_input_tokens"]
    expect(read > 0, f"cache_read_input_tokens 0 on the second call with a {billed_input(second)}-token prompt")
    return (
        f"{read} of {billed_input(second)} input tokens read from the cache; "
        f"first call wrote {first['cache_creation_input_tokens']}"
    )


@check(GROUP, "model list in Anthropic's shape")
def model_list(t: Target, model: str) -> str:
    url = door.models_url(t)
    resp = t.http.get(url, headers=door.headers(t.key))
    if resp.status_code == 404 and not t.anthropic_url:
        raise Skipped(f"no model list at {url} (404); give the Anthropic base with --anthropic-url to check one")
    listed = door.answered(resp, f"GET {url}")
    data = listed.get("data")
    expect(isinstance(data, list) and bool(data), f"GET {url}: no data list")
    assert isinstance(data, list)
    for entry in data:
        expect(isinstance(entry, dict) and entry.get("type") == "model", f"an entry that is not a model: {entry}")
        expect(isinstance(entry.get("id"), str) and isinstance(entry.get("display_name"), str), "no id or display_name")
        expect(bool(RFC3339.fullmatch(str(entry.get("created_at")))), f"created_at {entry.get('created_at')!r}")
    ids = [e["id"] for e in data]
    expect(model in ids, f"{model} is not listed: {ids}")
    expect(isinstance(listed.get("has_more"), bool), "has_more is not a boolean")
    ends = (listed.get("first_id"), listed.get("last_id"))
    expect(ends == (ids[0], ids[-1]), f"first_id / last_id {ends}, not the list's ends")
    return f"{len(ids)} models at {url}"
