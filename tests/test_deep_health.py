"""`GET /health?deep=1`: names what serves each model id and makes one real one-token call to
it, on the real embedded model (smollm2-135m) and on an upstream over a real socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kimi_server.engines.llamacpp.health import one_token
from kimi_server.engines.llamacpp.runner import CompletionResult
from tests.conftest import LiveServer, start_server, stop_server
from tests.upstreams.fake import Conn, FakeUpstream


def _deep(base_url: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(base_url.removesuffix("/v1") + "/health?deep=1", headers=headers, timeout=60)


@pytest.mark.e2e
def test_embedded_model_answers_one_token(live_server: LiveServer) -> None:
    assert _deep(live_server.base_url, None).status_code == 401
    report = _deep(live_server.base_url, live_server.key).json()
    assert report["status"] == "ok" and report["upstreams"] == []
    (model,) = report["models"]
    assert "smollm2" in model["model"].lower() and model["model"].endswith(".gguf")
    assert "/" not in model["model"]  # the file's name, not where it lives
    assert "kimi-k3" in model["served_as"]
    assert model["ok"] is True and model["tokens"] == 1 and model["latency_ms"] > 0


class StalledRunner:
    """A runner whose call never produces a token; counts the calls it was given."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[str | CompletionResult]:
        self.calls.append(body)
        await asyncio.sleep(3600)
        yield ""


def test_a_stuck_or_missing_engine_is_reported_with_a_reason() -> None:
    async def run() -> tuple[dict[str, Any], list[dict[str, Any]], StalledRunner]:
        missing = await one_token(None, 0)
        runner = StalledRunner()
        together = await asyncio.gather(*(one_token(runner, 9, timeout=0.2) for _ in range(5)))  # type: ignore[arg-type]
        return missing, together, runner

    missing, together, runner = asyncio.run(run())
    assert missing == {"ok": False, "reason": "the model is not loaded"}
    assert all(r["ok"] is False and r["reason"].startswith("no token within 0.2 s") for r in together)
    # Probes at the same time share one call, on the slot they were given, of one token.
    assert len(runner.calls) == 1
    assert runner.calls[0]["id_slot"] == 9 and runner.calls[0]["n_predict"] == 1


def _upstream(state: dict[str, Any]) -> dict[str, Any]:
    """An upstream whose model list and chat status the test changes as it goes."""

    async def models(_: dict[str, Any], c: Conn) -> None:
        await c.json(200, {"object": "list", "data": [{"id": i, "object": "model"} for i in state["served"]]})

    async def chat(body: dict[str, Any], c: Conn) -> None:
        if state["chat_status"] != 200:
            await c.json(state["chat_status"], {"error": {"message": "boom", "type": "server_error"}})
            return
        await c.json(
            200,
            {
                "id": "x",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "OK"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            },
        )

    return {"/v1/models": models, "/v1/chat/completions": chat}


@pytest.mark.e2e
def test_upstreams_are_named_listed_and_called(tmp_path: Path) -> None:
    async def unused(_: dict[str, Any], c: Conn) -> None:
        raise AssertionError

    state: dict[str, Any] = {}
    with FakeUpstream(unused, routes=_upstream(state)) as up:
        proc, server = start_server(
            tmp_path, "--upstream", up.url, "--upstream-model", "served-model", "--workers", "1"
        )
        try:
            for served, chat_status, reason in (
                (["served-model"], 200, None),
                (["other-model"], 200, "the upstream does not serve the model"),
                (["served-model"], 500, "the one-token call failed"),
            ):
                state.update(served=served, chat_status=chat_status)
                up.routed.clear()
                report = _deep(server.base_url, server.key).json()
                calls = [body for path, body in up.routed if path == "/v1/chat/completions"]
                assert report["models"] == []
                (upstream,) = report["upstreams"]
                assert upstream["name"] == f"127.0.0.1:{up.port}" and "kimi-k3" in upstream["served_as"]
                assert upstream["upstream_models"] == ["served-model"]
                if reason is None:
                    assert report["status"] == "ok" and upstream["ok"] is True, report
                    assert [(c["model"], c["max_completion_tokens"]) for c in calls] == [("served-model", 1)]
                else:
                    assert report["status"] == "degraded" and upstream["reason"] == reason, report
                    assert up.url not in json.dumps(report)  # any key may ask: no upstream URL in it
        finally:
            stop_server(proc)
