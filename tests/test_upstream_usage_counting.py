"""Every token billed: an upstream that streams no ``usage`` gets its prompt and output counted by
the server (its own tokenize endpoint where the dialect has one, a generous local estimate
otherwise), the ledger row says who counted, and the key's TPM window holds those counts.

Real server on a socket (uvicorn), the openai SDK, real SQLite; the upstream is a fake speaking
each dialect's protocol (chat stream, /tokenize, /apply-template) on a real socket.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from kimi_server.engines.upstream.counting import Transcript, estimate_counts
from kimi_server.engines.upstream.engine import UpstreamEngine
from kimi_server.engines.upstream.relay import Upstream
from kimi_server.gate.limits import LocalLimiter
from tests.conftest import build_app
from tests.gateway_util import ADMIN_KEY, STATIC_KEY, serve
from tests.upstreams.fake import Conn, FakeUpstream, chunk
from tests.upstreams.front import config

MODEL = "kimi-k3.1-pro"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Count these five words please"},
]
REASONING = "Let me think about it."
ANSWER = ["One two three", " four five six."]  # two deltas, six tokens to the fake tokenizer
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def fake_tokens(text: str) -> int:
    """The fake upstream's tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def rendered(messages: Sequence[Mapping[str, Any]]) -> str:
    """The fake upstream's chat template."""
    return " ".join(f"<|{m['role']}|> {m['content']}" for m in messages) + " <|assistant|>"


async def no_usage(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"reasoning_content": REASONING}))
    for piece in ANSWER:
        await c.event(chunk({"content": piece}))
    await c.event(chunk({}, "stop"))
    await c.done()


async def with_usage(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"content": "Hi."}, "stop"))
    await c.event({"choices": [], "usage": {"prompt_tokens": 21, "completion_tokens": 2, "total_tokens": 23}})
    await c.done()


async def vllm_tokenize(body: dict[str, Any], c: Conn) -> None:
    text = rendered(body["messages"]) if "messages" in body else body["prompt"]
    n = fake_tokens(text)
    await c.json(200, {"count": n, "max_model_len": 4096, "tokens": list(range(n))})


async def llamacpp_apply_template(body: dict[str, Any], c: Conn) -> None:
    await c.json(200, {"prompt": rendered(body["messages"])})


async def llamacpp_tokenize(body: dict[str, Any], c: Conn) -> None:
    await c.json(200, {"tokens": list(range(fake_tokens(body["content"])))})


async def not_found(body: dict[str, Any], c: Conn) -> None:
    await c.json(404, {"error": {"message": "Not Found"}})


ROUTES = {
    "vllm": {"/tokenize": vllm_tokenize},
    "llamacpp": {"/apply-template": llamacpp_apply_template, "/tokenize": llamacpp_tokenize},
}
EXPECTED_PROMPT = fake_tokens(rendered(MESSAGES))  # 11
EXPECTED_REASONING = fake_tokens(REASONING)  # 5
# The answer's words, the reasoning's, and the end-of-turn token the model generated.
EXPECTED_COMPLETION = fake_tokens("".join(ANSWER)) + EXPECTED_REASONING + 1  # 12


def app_for(tmp: Path, up: FakeUpstream, dialect: str) -> FastAPI:
    engine = UpstreamEngine([Upstream(config(up.url, dialect=dialect))])
    return build_app(tmp / "data", engine, keys=[STATIC_KEY], admin_key=ADMIN_KEY)


@contextmanager
def server(tmp: Path, up: FakeUpstream, dialect: str) -> Iterator[tuple[str, FastAPI]]:
    app = app_for(tmp, up, dialect)
    with serve(app) as url:
        yield url, app


def ledger(tmp: Path) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(tmp / "data" / "kimi.db") as db:
        db.row_factory = sqlite3.Row
        return {row["request_id"]: dict(row) for row in db.execute("SELECT * FROM usage")}


def sent_usage(sdk: OpenAI, stream: bool) -> tuple[str, dict[str, int]]:
    if stream:
        streamed = sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        request_id = streamed.headers["x-request-id"]
        usage = list(streamed.parse())[-1].usage
    else:
        whole = sdk.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES)
        request_id = whole.headers["x-request-id"]
        usage = whole.parse().usage
    assert usage is not None and usage.completion_tokens_details is not None
    return request_id, {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "reasoning_tokens": usage.completion_tokens_details.reasoning_tokens or 0,
    }


@pytest.mark.parametrize("dialect", ["vllm", "llamacpp"])
def test_usage_missing_is_counted_with_the_upstreams_tokenizer(tmp_path: Path, dialect: str) -> None:
    with FakeUpstream(no_usage, ROUTES[dialect]) as up, server(tmp_path, up, dialect) as (url, _):
        sdk = OpenAI(base_url=url + "/v1", api_key=STATIC_KEY, max_retries=0)
        sent = dict(sent_usage(sdk, stream) for stream in (False, True))
        totals = httpx.get(url + "/admin/v1/usage", headers=ADMIN).json()["data"]
    rows = ledger(tmp_path)
    assert set(rows) == set(sent)
    for request_id, usage in sent.items():
        assert usage == {
            "prompt_tokens": EXPECTED_PROMPT,
            "completion_tokens": EXPECTED_COMPLETION,
            "reasoning_tokens": EXPECTED_REASONING,
        }
        row = rows[request_id]
        assert {k: row[k] for k in usage} == usage  # the ledger bills what the client was told
        assert row["usage_source"] == "server_count"
    assert totals == [
        {
            **totals[0],
            "model": MODEL,
            "requests": 2,
            "server_counted_requests": 2,
            "server_estimated_requests": 0,
            "prompt_tokens": 2 * EXPECTED_PROMPT,
        }
    ]
    # The prompt was counted as the upstream renders it: its chat messages, not our guess.
    chat = [body for path, body in up.routed if "messages" in body]
    assert len(chat) == 2 and all(body["messages"] == MESSAGES for body in chat)


def test_reported_usage_is_the_engines_and_nothing_is_tokenized(tmp_path: Path) -> None:
    with FakeUpstream(with_usage, ROUTES["vllm"]) as up, server(tmp_path, up, "vllm") as (url, _):
        sdk = OpenAI(base_url=url + "/v1", api_key=STATIC_KEY, max_retries=0)
        request_id, usage = sent_usage(sdk, stream=False)
    assert usage["prompt_tokens"] == 21 and usage["completion_tokens"] == 2
    assert ledger(tmp_path)[request_id]["usage_source"] == "engine"
    assert up.routed == []


def test_without_a_tokenizer_the_counts_are_a_marked_local_estimate(tmp_path: Path) -> None:
    """The generic dialect has no tokenize endpoint; a vLLM without one answers 404 once and is
    not asked again for a while. Either way the row is billed a generous estimate, marked so."""
    expected = estimate_counts({"messages": MESSAGES}, transcript(), need_prompt=True)
    assert expected.prompt > 0 and expected.completion >= len(ANSWER) + 1
    for dialect, routes in (("openai", {}), ("vllm", {"/tokenize": not_found})):
        data = tmp_path / dialect
        with FakeUpstream(no_usage, routes) as up, server(data, up, dialect) as (url, _):
            sdk = OpenAI(base_url=url + "/v1", api_key=STATIC_KEY, max_retries=0)
            sent = dict(sent_usage(sdk, stream) for stream in (False, True))
        # One failed try (prompt, answer and reasoning at once), then the estimate only.
        assert len(up.routed) == (3 if routes else 0)
        rows = ledger(data)
        for request_id, usage in sent.items():
            assert usage["prompt_tokens"] == rows[request_id]["prompt_tokens"] == expected.prompt
            assert usage["completion_tokens"] == rows[request_id]["completion_tokens"] == expected.completion
            assert rows[request_id]["usage_source"] == "server_estimate"
    listed = subprocess.run(
        [sys.executable, "-m", "kimi_server.cli", "usage", "--json"],
        env={**os.environ, "KIMI_DATA_DIR": str(tmp_path / "openai" / "data")},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [total] = json.loads(listed.stdout)
    assert total["server_estimated_requests"] == 2 and total["server_counted_requests"] == 0


def transcript() -> Transcript:
    t = Transcript()
    t.stopped = True
    t.reasoning.append(REASONING)
    t.answer.extend(ANSWER)
    return t


def test_the_tpm_window_holds_the_counted_tokens(tmp_path: Path) -> None:
    """After the request the key's token bucket is down by exactly what was billed (the clock is
    frozen, so nothing refills): not by the reservation's estimate, nor by the output alone."""
    with FakeUpstream(no_usage, ROUTES["vllm"]) as up, server(tmp_path, up, "vllm") as (url, app):
        gateway = app.state.kimi.gateway
        gateway.limiter = LocalLimiter(clock=lambda: 1000.0)
        r = httpx.post(url + "/admin/v1/keys", json={"name": "tpm", "tpm": 5000}, headers=ADMIN)
        secret = r.json()["secret"]
        sdk = OpenAI(base_url=url + "/v1", api_key=secret, max_retries=0)
        _, usage = sent_usage(sdk, stream=True)
        r = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {secret}"})
    used = usage["prompt_tokens"] + usage["completion_tokens"]
    assert used == EXPECTED_PROMPT + EXPECTED_COMPLETION
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == 5000 - used
