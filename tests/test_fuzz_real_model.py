"""The hostile inputs of the fuzz test, on the real model through the real server: every ``$ref``
loop and catastrophic pattern (as a response format and as tool parameters) and every multi-line,
CR/LF and Unicode edge prompt is answered within a per-request time bound, never with a 5xx.

Each request names no output cap, as a careless or hostile client would; the server's operator
default (``default_max_output_tokens``) and the repetition guard are what bound the answers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, start_server, stop_server
from tests.schema_corpus import EDGE_TEXTS, REF_LOOPS, hostile_schemas

pytestmark = pytest.mark.e2e

TIME_BOUND_S = 120.0  # per request, queueing behind the others included
DEFAULT_CAP = 48


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    proc, live = start_server(
        tmp_path_factory.mktemp("fuzz-real"),
        env={"KIMI_DEFAULT_MAX_OUTPUT_TOKENS": str(DEFAULT_CAP), "KIMI_QUEUE_MAX_WAIT": str(TIME_BOUND_S)},
    )
    try:
        yield live
    finally:
        stop_server(proc)


def requests() -> list[tuple[str, dict[str, Any]]]:
    chat: dict[str, Any] = {
        "model": "kimi-k3.1-pro",
        "reasoning_effort": "low",
        "messages": [{"role": "user", "content": "Give the JSON."}],
    }
    out: list[tuple[str, dict[str, Any]]] = []
    for schema in hostile_schemas():
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
        out.append(("chat.completions", {**chat, "response_format": fmt}))
    for schema in REF_LOOPS[:4]:
        tool = {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}
        out.append(("chat.completions", {**chat, "tools": [tool], "tool_choice": "required", "stream": True}))
    for prompt in EDGE_TEXTS:
        out.append(("chat.completions", {**chat, "messages": [{"role": "user", "content": prompt}]}))
        out.append(("responses", {"model": "kimi-k3.1-pro", "input": prompt, "reasoning": {"effort": "low"}}))
    return out


def send(client: httpx.Client, endpoint: str, body: dict[str, Any]) -> str | None:
    """Why this request failed the bound or the contract, or None."""
    try:
        # ensure_ascii: a lone surrogate travels as its escape, as a client would send it
        r = client.post(
            f"/{endpoint.replace('.', '/')}", content=json.dumps(body), headers={"content-type": "application/json"}
        )
    except httpx.TimeoutException:
        return f"no answer within {TIME_BOUND_S} s: {str(body)[:300]}"
    if r.status_code >= 500 or "internal_error" in r.text:
        return f"{r.status_code}: {r.text[:200]} for {str(body)[:300]}"
    if r.status_code >= 400 and not {"message", "type", "code", "param"} <= set(r.json()["error"]):
        return f"error shape: {r.text[:200]}"
    return None


def test_hostile_requests_are_answered_in_time_without_5xx(server: LiveServer) -> None:
    cases = requests()
    with (
        httpx.Client(
            base_url=server.base_url, timeout=TIME_BOUND_S, headers={"Authorization": f"Bearer {server.key}"}
        ) as client,
        ThreadPoolExecutor(8) as pool,
    ):
        failures = [f for f in pool.map(lambda case: send(client, *case), cases) if f]
    assert not failures, "\n".join(failures)
