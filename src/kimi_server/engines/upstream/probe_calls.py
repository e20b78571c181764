"""``kimi-server upstreams check --probe-calls``: whether an upstream keeps ``tool_choice``
"required" itself. One small real call with one tool; an upstream that answers it with text is
not broken behind kimi-server (forced calls are checked and asked again as a JSON answer,
``required_calls``), but each forced call then costs two, which a route can spare itself by
asking the JSON way at once."""

from __future__ import annotations

from typing import Any, Literal

import httpx

from kimi_server.engines.upstream.relay import Upstream

PROBE_TOKENS = 96  # room for a short call, kept small: a paid upstream bills the probe
PROBE_TIMEOUT = 30.0
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "record_answer",
        "description": "Records the answer to the user's question.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
        },
    },
}
Outcome = Literal["honoured", "ignored", "failed"]


async def probe_required_call(up: Upstream, model: str, report: dict[str, Any]) -> Outcome:
    """One non-streamed call under ``tool_choice: "required"``, reasoning off where the dialect
    can say so (the call should not wait behind a long thought)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is 2 + 2? Record the answer."}],
        "tools": [PROBE_TOOL],
        "tool_choice": "required",
        up.dialect.max_tokens_field: PROBE_TOKENS,
        "stream": False,
        **up.dialect.thinking_off(),
    }
    try:
        resp = await up.client.post(
            f"{up.base}/chat/completions",
            json=body,
            headers=up.headers,
            timeout=min(up.cfg.read_timeout, PROBE_TIMEOUT),
        )
    except httpx.HTTPError:
        return "failed"
    report["probe_status"] = resp.status_code
    try:
        message = resp.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "failed"
    if resp.status_code != 200 or not isinstance(message, dict):
        return "failed"
    return "honoured" if message.get("tool_calls") else "ignored"
