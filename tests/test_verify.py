"""``kimi-server verify`` against small endpoints over a real socket: one that keeps the
contract, and broken ones whose breakage must show as the right check failing, with a reason,
and a non-zero exit status."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from kimi_server.cli import app
from kimi_server.verify.registry import GROUPS, load
from tests.upstreams.fake import Conn, FakeUpstream, chunk

MODEL = "kimi-k3.1-pro"
USAGE = {
    "prompt_tokens": 10,
    "completion_tokens": 6,
    "total_tokens": 16,
    "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 10},
    "completion_tokens_details": {"reasoning_tokens": 4},
}


def endpoint(*, usage: dict[str, Any] = USAGE, content_first: bool = False) -> FakeUpstream:
    """A chat endpoint that answers every request alike: reasoning, then "OK" (or the reverse)."""

    async def handle(body: dict[str, Any], conn: Conn) -> None:
        if not body.get("stream"):
            message = {"role": "assistant", "content": "OK", "reasoning_content": "Say OK."}
            answer = {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            }
            await conn.json(200, answer)
            return
        await conn.head()
        parts = [{"content": "OK"}, {"reasoning_content": "Say OK."}]
        await conn.event(chunk({"role": "assistant", "content": ""}))
        for delta in parts if content_first else parts[::-1]:
            await conn.event(chunk(delta))
        await conn.event(chunk({}, "stop"))
        await conn.event({**chunk({}), "choices": [], "usage": usage})
        await conn.done()

    return FakeUpstream(handle)


def verify(url: str, *groups: str) -> tuple[int, dict[str, dict[str, Any]]]:
    only = [arg for g in groups for arg in ("--only", g)]
    result = CliRunner().invoke(app, ["verify", url, "--key", "k", "--model", MODEL, "--json", *only])
    report = json.loads(result.stdout)
    return result.exit_code, {r["check"]: r for r in report["results"]}


def test_an_endpoint_that_keeps_the_contract_passes() -> None:
    with endpoint() as up:
        code, results = verify(up.url, "usage", "streaming")
    assert {r["status"] for r in results.values()} == {"PASS"}, results
    assert code == 0


def test_the_table_names_each_check_and_model() -> None:
    with endpoint(usage={**USAGE, "total_tokens": 50}) as up:
        result = CliRunner().invoke(app, ["verify", up.url, "--key", "k", "--model", MODEL, "--only", "usage"])
    assert result.exit_code == 1
    line = next(row for row in result.stdout.splitlines() if "total = prompt" in row)
    assert f"total = prompt + completion [{MODEL}]" in line
    assert "FAIL" in line and "plain: total_tokens 50 != prompt 10 + completion 6" in line
    assert "4 checks: 3 passed, 1 failed" in result.stdout


def test_usage_that_does_not_add_up_fails_that_check() -> None:
    with endpoint(usage={**USAGE, "total_tokens": 50}) as up:
        code, results = verify(up.url, "usage")
    total = results[f"total = prompt + completion [{MODEL}]"]
    assert total["status"] == "FAIL"
    assert total["detail"] == "plain: total_tokens 50 != prompt 10 + completion 6"
    assert results[f"reasoning within completion [{MODEL}]"]["status"] == "PASS"
    assert code == 1


def test_reasoning_over_completion_and_cache_over_prompt_fail() -> None:
    details = {
        "prompt_tokens_details": {"cached_tokens": 12, "cache_write_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 9},
    }
    with endpoint(usage={**USAGE, **details}) as up:
        code, results = verify(up.url, "usage")
    assert results[f"reasoning within completion [{MODEL}]"]["detail"] == (
        "plain: reasoning_tokens 9 > completion_tokens 6"
    )
    assert results[f"cached within prompt [{MODEL}]"]["detail"] == "plain: cached_tokens 12 > prompt_tokens 10"
    assert code == 1


def test_content_before_reasoning_fails_the_stream_order_check() -> None:
    with endpoint(content_first=True) as up:
        code, results = verify(up.url, "streaming")
    order = results["reasoning before content"]
    assert order["status"] == "FAIL"
    assert order["detail"] == "reasoning_content arrived after content had started"
    assert results["SSE framing"]["status"] == "PASS"
    assert code == 1


def test_an_endpoint_that_never_answers_fails_by_timeout_not_hang() -> None:
    async def silent(body: dict[str, Any], conn: Conn) -> None:
        import asyncio

        await asyncio.sleep(30)

    with FakeUpstream(silent) as up:
        result = CliRunner().invoke(
            app, ["verify", up.url, "--key", "k", "--model", MODEL, "--only", "errors", "--timeout", "0.5", "--json"]
        )
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    details = {r["detail"] for r in report["results"]}
    assert "no complete answer within the 0.5 s request deadline (--timeout)" in details


def test_unknown_group_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["verify", "http://127.0.0.1:9/v1", "--only", "nonsense"])
    assert result.exit_code == 2
    assert "unknown group 'nonsense'" in result.stderr


def test_an_unreachable_endpoint_is_said_in_words() -> None:
    result = CliRunner().invoke(app, ["verify", "http://127.0.0.1:9/v1", "--key", "k"])
    assert result.exit_code == 2
    assert "cannot reach http://127.0.0.1:9/v1" in result.stderr


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_has_checks(group: str) -> None:
    assert any(c.group == group for c in load())
