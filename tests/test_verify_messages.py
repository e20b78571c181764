"""``kimi-server verify``'s ``messages`` group: against kimi-server's own Messages door (a
scripted engine, a real socket) every check passes, through ``…/v1/messages`` and through an
Anthropic base given with ``--anthropic-url``; against fakes that answer the wrong shapes, or
accept any signature, the checks about those fail, each with its reason."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from kimi_server.cli import app
from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import EngineEvent, GenerationRequest, ToolCallDelta
from tests.conftest import TEST_KEY, build_app
from tests.gateway_util import ADMIN_KEY, serve
from tests.upstreams.fake import Conn, FakeUpstream

MODEL = "kimi-k3.1-pro"
BODY_LIMIT = 64 * 1024


@dataclass
class ModelLikeEngine(ScriptedEngine):
    """The scripted engine answering as a model does where the group looks: the call a request
    forces, a system prompt seen before read from the cache, and the prompt counted exactly
    (as the embedded engine counts it with the model's own tokenizer)."""

    seen: set[str] = field(default_factory=set)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        system = next((m.text for m in request.messages if m.role == "system"), "")
        named = request.tool_choice.name if request.tool_choice.mode == "named" else None
        calls = (ToolCallDelta(0, "call_1", named, '{"city": "Paris"}'),) if named else ()
        self.script = Script(tool_calls=calls, cached_tokens=10 if system in self.seen else 0)
        self.seen.add(system)
        async for event in super().generate(request):
            yield event

    async def count_prompt_tokens(self, request: GenerationRequest) -> int | None:
        return Script().prompt_tokens

    def prompt_token_limit(self) -> int | None:
        return None

    def counts_exactly(self) -> bool:
        return True


def verify(url: str, *extra: str) -> tuple[int, dict[str, dict[str, Any]]]:
    args = ["verify", url, "--key", TEST_KEY, "--model", MODEL, "--only", "messages", "--json", "--timeout", "30"]
    result = CliRunner().invoke(app, [*args, *extra])
    return result.exit_code, {r["check"]: r for r in json.loads(result.stdout)["results"]}


def test_kimi_servers_messages_door_passes_every_check(tmp_path: Path) -> None:
    server = build_app(tmp_path / "data", ModelLikeEngine(), admin_key=ADMIN_KEY, max_body_bytes=BODY_LIMIT)
    with serve(server) as root:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        limited = httpx.post(f"{root}/admin/v1/keys", json={"name": "limited", "rpm": 2}, headers=admin).json()[
            "secret"
        ]
        door = ("--body-limit", str(BODY_LIMIT), "--limited-key", limited)
        code, results = verify(f"{root}/v1", *door)
        base_code, through_base = verify(f"{root}/v1", "--anthropic-url", f"{root}/anthropic")
    assert {name: r["status"] for name, r in results.items() if r["status"] != "PASS"} == {}, results
    assert code == 0
    details = {name: r["detail"] for name, r in results.items()}
    assert details["stream events"] == "12 events in order; thinking, text; end_turn"
    assert details["forced tool, then tool_result"] == "input {'city': 'Paris'}; the tool_result turn answered"
    assert details["count_tokens equals the billed input"] == "12 tokens both"
    assert details["cache_control prefix read from the cache"].startswith("10 of 12 input tokens read")
    assert details["body over the limit is 413 request_too_large"].endswith(f"(limit {BODY_LIMIT})")
    assert details["rate limit is 429 rate_limit_error"].startswith("refused at request 3, retry-after ")
    assert details["model list in Anthropic's shape"] == f"3 models at {root}/anthropic/v1/models"
    skipped = {name: r["detail"] for name, r in through_base.items() if r["status"] != "PASS"}
    assert skipped == {
        "body over the limit is 413 request_too_large": "no body limit given (--body-limit)",
        "rate limit is 429 rate_limit_error": "no rate-limited key given (--limited-key)",
    }
    assert base_code == 0


def test_an_engine_that_only_estimates_skips_the_count_saying_so(tmp_path: Path) -> None:
    with serve(build_app(tmp_path / "data")) as root:
        _, results = verify(f"{root}/v1")
    count = results["count_tokens equals the billed input"]
    assert count["status"] == "SKIP"
    assert count["detail"].startswith(
        f"GET /models says {MODEL}'s engine does not count prompts exactly (capabilities.exact_token_count: false)"
    )


# -- fakes ------------------------------------------------------------------------------------

USAGE = {
    "input_tokens": 2,
    "output_tokens": 3,
    "cache_creation_input_tokens": 10,
    "cache_read_input_tokens": 0,
    "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 0},
}
THINKING = {"type": "thinking", "thinking": "Say OK.", "signature": "c2lnbmVkLWJ5LW5vYm9keQ"}


def message(content: list[dict[str, Any]], stop: str = "end_turn", usage: dict[str, Any] = USAGE) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


async def sse(conn: Conn, events: list[dict[str, Any]]) -> None:
    await conn.head()
    for e in events:
        await conn.raw(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode())


def text_events(close_before_delta: bool) -> list[dict[str, Any]]:
    start = {**message([]), "stop_reason": None}
    block: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "OK"}},
    ]
    stop: dict[str, Any] = {"type": "content_block_stop", "index": 0}
    ended = {"stop_reason": "end_turn", "stop_sequence": None}
    end: dict[str, Any] = {"type": "message_delta", "delta": ended, "usage": USAGE}
    tail = [stop, end] if close_before_delta else [end, stop]
    return [{"type": "message_start", "message": start}, {"type": "ping"}, *block, *tail, {"type": "message_stop"}]


def wrong_shapes() -> FakeUpstream:
    """Answers with a thinking block without a signature, usage without the 5m/1h split, a
    stream whose message_delta comes inside a block, errors and models in OpenAI's shapes, and
    any key accepted."""

    async def messages(body: dict[str, Any], conn: Conn) -> None:
        if "max_tokens" not in body or not body.get("messages") or body.get("model") != MODEL:
            await conn.json(400, {"error": {"message": "bad request", "type": "invalid_request_error", "code": None}})
        elif body.get("stream"):
            await sse(conn, text_events(close_before_delta=False))
        else:
            usage = {k: v for k, v in USAGE.items() if k != "cache_creation"}
            await conn.json(
                200, message([{"type": "thinking", "thinking": "Hm."}, {"type": "text", "text": "OK"}], usage=usage)
            )

    async def models(body: dict[str, Any], conn: Conn) -> None:
        await conn.json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    return FakeUpstream(messages, routes={"/anthropic/v1/models": models})


def no_signature_check() -> FakeUpstream:
    """The right shapes, but any thinking block sent back accepted, a count that is not what it
    bills, and a tool's input left as a JSON string."""

    async def messages(body: dict[str, Any], conn: Conn) -> None:
        if body.get("stream"):
            await sse(conn, text_events(close_before_delta=True))
        elif body.get("tool_choice"):
            call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": '{"city": "Paris"}'}
            await conn.json(200, message([THINKING, call], stop="tool_use"), request_id="req_1")
        else:
            await conn.json(200, message([THINKING, {"type": "text", "text": "OK"}]), request_id="req_1")

    async def count(body: dict[str, Any], conn: Conn) -> None:
        await conn.json(200, {"input_tokens": 7})

    return FakeUpstream(messages, routes={"/v1/messages/count_tokens": count})


def failures(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: r["detail"] for name, r in results.items() if r["status"] == "FAIL"}


def test_wrong_shapes_fail_the_checks_about_them() -> None:
    with wrong_shapes() as fake:
        code, results = verify(fake.url)
    failed = failures(results)
    assert code == 1
    assert failed["x-api-key, anthropic-version, request-id"] == "no request-id header on the answer"
    assert failed["message object"] == "message: content[0]: thinking without a signature"
    assert failed["stream events"] == "message_delta while a block is open"
    assert failed["invalid request is 400 naming the field"].startswith(
        'no max_tokens: not {"type": "error", "error": {…}}'
    )
    assert failed["bad key is 401 authentication_error"] == "a wrong x-api-key: expected 401, got 200 (accepted)"
    assert failed["unknown model is 404 not_found_error"] == "an unknown model: expected 404, got 400: bad request"
    assert failed["forced tool, then tool_result"] == "the forced call: content[0]: thinking without a signature"
    assert failed["model list in Anthropic's shape"].startswith("an entry that is not a model")


def test_an_endpoint_that_checks_no_signature_fails_there() -> None:
    with no_signature_check() as fake:
        code, results = verify(fake.url)
    failed = failures(results)
    assert code == 1
    assert failed["thinking sent back; tampered refused"] == ("a tampered signature: expected 400, got 200 (accepted)")
    assert failed["count_tokens equals the billed input"] == (
        "count_tokens 7, billed input 12 (input + cache read + cache write)"
    )
    assert failed["forced tool, then tool_result"] == (
        'the forced call: content[1]: tool_use input is not an object: \'{"city": "Paris"}\''
    )
    for passed in (
        "message object",
        "stream events",
        "thinking block signed",
        "x-api-key, anthropic-version, request-id",
    ):
        assert results[passed]["status"] == "PASS", results[passed]
