"""``kimi-server chat`` as a user runs it: the real command in a subprocess, lines on its stdin,
against servers on real sockets: a Moonshot-style API (reasoning_content), kimi-server in front of
it (--upstream), kimi-server on the scripted engine, and the real tiny model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.engines.upstream.engine import UpstreamEngine
from kimi_server.engines.upstream.relay import Upstream
from kimi_server.gate.auth import KeyRing
from kimi_server.http.app import create_app
from kimi_server.policy.catalogue import CATALOGUE
from kimi_server.serving.common import EngineSet
from kimi_server.settings import Settings, UpstreamConfig
from tests.conftest import start_server, stop_server
from tests.gateway_util import STATIC_KEY, free_port, make_app, serve
from tests.upstreams.fake import Conn, FakeUpstream, chunk

DIM = re.compile(r"\x1b\[2m(.*?)\x1b\[0m", re.S)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def run_chat(
    url: str, key: str | None, lines: list[str], *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("KIMI_API_KEY", "OPENAI_API_KEY", "KIMI_BASE_URL")}
    env = {**base, "FORCE_COLOR": "1", "COLUMNS": "200", **(env or {})}  # styles kept in a pipe: dim is visible
    cmd = [sys.executable, "-m", "kimi_server.cli", "chat", "--url", url, *(("--key", key) if key else ()), *flags]
    stdin = "".join(line + "\n" for line in lines)
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env, timeout=600, check=False)


def dimmed(out: str) -> str:
    return "".join(DIM.findall(out))


def thinking_moonshot(reasoning: bool = True) -> FakeUpstream:
    """Moonshot's streaming shape: reasoning_content deltas, then content, then usage."""

    async def handler(body: dict[str, Any], conn: Conn) -> None:
        n = len(server.bodies)
        await conn.head()
        if reasoning:
            for piece in ("Thinking about ", f"turn {n}."):
                await conn.event(chunk({"role": "assistant", "reasoning_content": piece}))
        for piece in ("Answer ", str(n)):
            await conn.event(chunk({"content": piece}))
        await conn.event(chunk({}, "stop"))
        usage = {
            "prompt_tokens": 9,
            "completion_tokens": 6,
            "total_tokens": 15,
            "completion_tokens_details": {"reasoning_tokens": 2 if reasoning else 0},
        }
        await conn.event({**chunk({}), "choices": [], "usage": usage})
        await conn.done()

    server = FakeUpstream(handler)
    return server


def history(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in body["messages"]]


def test_moonshot_style_api_reasoning_then_answer_history_and_effort() -> None:
    with thinking_moonshot() as api:
        result = run_chat(api.url, "sk-moonshot", ["first", "/effort high", "second", "/quit"])
    assert result.returncode == 0, result.stderr
    assert "Thinking about turn 1." in dimmed(result.stdout)  # the reasoning, dimmed
    text = ANSI.sub("", result.stdout)
    assert text.index("turn 1.") < text.index("Answer 1") < text.index("turn 2.") < text.index("Answer 2")
    assert "Answer 1" not in dimmed(result.stdout)
    first, second = api.bodies
    assert first["model"] == second["model"] == "m"  # the only model the API lists
    assert history(first) == [("user", "first")]
    assert history(second) == [("user", "first"), ("assistant", "Answer 1"), ("user", "second")]
    assert "reasoning_effort" not in first and second["reasoning_effort"] == "high"
    assert result.stderr == ""


def test_hidden_reasoning_and_a_server_without_any() -> None:
    with thinking_moonshot() as api:
        hidden = run_chat(api.url, "k", ["hello"], "--hide-reasoning")
    assert "Thinking about" not in hidden.stdout
    assert "(thought for 2 tokens)" in ANSI.sub("", hidden.stdout)  # the count the server reported
    assert "Answer 1" in hidden.stdout
    with thinking_moonshot(reasoning=False) as plain:
        result = run_chat(plain.url, "k", ["hello"], "--hide-reasoning")
    assert result.returncode == 0, result.stderr
    assert "Answer 1" in result.stdout and "thought for" not in result.stdout


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[tuple[str, ScriptedEngine]]:
    app, engine = make_app(tmp_path)
    with serve(app) as origin:
        yield f"{origin}/v1", engine


def texts(engine: ScriptedEngine, n: int) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in engine.requests[n].messages]


def test_responses_endpoint_carries_the_history_as_input_items(scripted: tuple[str, ScriptedEngine]) -> None:
    url, engine = scripted
    lines = ["/responses", "first", "second", "/chat", "third", "/reset", "fourth", "/quit"]
    result = run_chat(url, STATIC_KEY, lines, "--model", "kimi-k3.1-pro")
    assert result.returncode == 0, result.stderr
    assert dimmed(result.stdout).count("Let me think.") == 4  # the reasoning summary, each turn
    answer = "Hello there."
    assert texts(engine, 0) == [("user", "first")]
    assert texts(engine, 1) == [("user", "first"), ("assistant", answer), ("user", "second")]
    # back on Chat Completions, the same conversation goes on; /reset forgets it.
    assert texts(engine, 2) == [*texts(engine, 1), ("assistant", answer), ("user", "third")]
    assert texts(engine, 3) == [("user", "fourth")]


def test_kimi_server_in_front_of_an_upstream(tmp_path: Path) -> None:
    with thinking_moonshot() as api:
        engine = UpstreamEngine([Upstream(UpstreamConfig(base_url=api.url, dialect="moonshot"))])
        settings = Settings(api_keys=[STATIC_KEY], data_dir=tmp_path / "data")
        app = create_app(settings, EngineSet({spec.id: engine for spec in CATALOGUE}), KeyRing([STATIC_KEY]))
        with serve(app) as origin:
            result = run_chat(f"{origin}/v1", STATIC_KEY, ["first", "second"])
    assert result.returncode == 0, result.stderr
    assert "Thinking about turn 1." in dimmed(result.stdout)
    assert "Answer 2" in result.stdout
    assert history(api.bodies[1])[:2] == [("user", "first"), ("assistant", "Answer 1")]


def test_errors_are_one_line_without_a_traceback(scripted: tuple[str, ScriptedEngine]) -> None:
    url, _ = scripted
    refused = run_chat(f"http://127.0.0.1:{free_port()}/v1", "k", ["hello"])
    wrong_key = run_chat(url, "sk-wrong", ["hello"])
    for result, words in ((refused, "Connection refused"), (wrong_key, "401")):
        assert result.returncode == 1
        lines = ANSI.sub("", result.stderr).strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], result.stderr
    # the key from the environment, as the SDKs take it.
    from_env = run_chat(
        url,
        None,
        ["hello"],
        env={
            "KIMI_API_KEY": STATIC_KEY,
        },
    )
    assert from_env.returncode == 0 and "Hello there." in from_env.stdout, from_env.stderr
    # a mid-session refusal (too many output tokens for the model: 400) is shown and the
    # session goes on.
    result = run_chat(url, STATIC_KEY, ["hello", "/quit"], "--max-tokens", "2000000")
    assert result.returncode == 0
    assert "400" in result.stderr and "Traceback" not in result.stderr


def test_an_effort_or_model_the_server_refuses_is_refused_at_once(scripted: tuple[str, ScriptedEngine]) -> None:
    """The efforts come from /v1/models: a choice that would fail the next turn is refused when
    it is made, and the session keeps the one it had."""
    url, engine = scripted
    lines = [
        "/effort bogus",  # no such level
        "hello",
        "/model kimi-k3",  # takes max only: not at low
        "/model nope",  # not listed
        "/effort default",
        "/model kimi-k3",
        "/effort high",  # not one of kimi-k3's
        "hello",
        "/quit",
    ]
    result = run_chat(url, STATIC_KEY, lines, "--model", "kimi-k3.1-pro", "--effort", "low")
    assert result.returncode == 0, result.stderr
    said = ANSI.sub("", result.stdout)
    assert "kimi-k3.1-pro takes effort low, high, max" in said and "not bogus; effort stays low" in said
    assert "kimi-k3 takes effort max; not low" in said and "model stays kimi-k3.1-pro" in said
    assert "the server lists no model nope" in said
    assert "kimi-k3 takes effort max; not high; effort stays server default" in said
    assert result.stderr == ""  # no turn failed
    assert [(r.model, r.effort) for r in engine.requests] == [("kimi-k3.1-pro", "low"), ("kimi-k3", "max")]
    # Given on the command line, the same checks stop it before any turn.
    bad = run_chat(url, STATIC_KEY, ["hello"], "--model", "kimi-k3", "--effort", "low")
    assert bad.returncode == 2 and "--effort: kimi-k3 takes effort max; not low" in ANSI.sub("", bad.stderr)
    assert len(engine.requests) == 2


@pytest.mark.e2e
def test_real_model_both_endpoints(tmp_path: Path) -> None:
    proc, server = start_server(tmp_path, env={"KIMI_THREADS": "1"})
    try:
        lines = ["Say hello.", "/effort high", "/responses", "Say it again.", "/quit"]
        result = run_chat(server.base_url, server.key, lines, "--effort", "low", "--max-tokens", "160")
    finally:
        stop_server(proc)
    assert result.returncode == 0, result.stderr
    notes = {"effort: high", "endpoint: /v1/responses", "bye"}
    reasoning = [d for d in DIM.findall(result.stdout) if d.strip() and d.strip() not in notes and " at http" not in d]
    assert "".join(reasoning).strip()  # the reasoning streamed, dimmed
    answers = ANSI.sub("", DIM.sub("", result.stdout)).strip()
    assert answers  # and an answer after it
    requests = [json.loads(line) for line in server.log.read_text().splitlines() if '"message":"request"' in line]
    turns = [r for r in requests if r["path"] in ("/v1/chat/completions", "/v1/responses")]
    assert [(r["path"], r["status"]) for r in turns] == [("/v1/chat/completions", 200), ("/v1/responses", 200)]
    # the second turn's prompt carries the first turn: it is longer than the first prompt.
    assert turns[1]["prompt_tokens"] > turns[0]["prompt_tokens"]
