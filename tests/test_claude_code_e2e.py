"""Claude Code's own binary (npm ``@anthropic-ai/claude-code``, pinned; ``scripts/test`` installs
it under ``.tools/claude-code``) pointed at kimi-server with the two environment variables a user
sets: it answers on the embedded model; on a scripted engine that answers with tool calls it runs
its Write tool and the file appears; its WebSearch finds a document in the server's local index."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.engines.types import (
    ContentDelta,
    EngineEvent,
    Finish,
    GenerationRequest,
    ReasoningDelta,
    ToolCallDelta,
    Usage,
)
from tests.conftest import LiveServer
from tests.gateway_util import STATIC_KEY, make_app, serve

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
CLAUDE = ROOT / ".tools" / "claude-code" / "node_modules" / ".bin" / "claude"
VERSION = "2.1.328"
DOC = "# Zorblax harbour\n\nThe Zorblax harbour lighthouse was painted teal in 2024.\n"


def claude(
    base_url: str, key: str, cwd: Path, *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    if not CLAUDE.exists():
        pytest.fail(
            f"Claude Code is not installed at {CLAUDE.relative_to(ROOT)}: run ./scripts/test (it runs "
            f"`npm install --prefix .tools/claude-code @anthropic-ai/claude-code@{VERSION}`; npm is needed)",
            pytrace=False,
        )
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": key,
        # Nothing beyond the server: no telemetry, update checks or other traffic.
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        **(env or {}),
    }
    return subprocess.run(
        [str(CLAUDE), "--print", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_pinned_version() -> None:
    if not CLAUDE.exists():
        claude("", "", ROOT)  # fails, saying what is missing
    shown = subprocess.run([str(CLAUDE), "--version"], capture_output=True, text=True, timeout=60)
    assert shown.stdout.startswith(VERSION)


def test_bare_print_answers_on_the_embedded_model(default_model_server: LiveServer, tmp_path: Path) -> None:
    base = default_model_server.base_url.removesuffix("/v1") + "/anthropic"
    # Claude Code asks for up to 32,000 output tokens; the 0.5B model sometimes rambles on to
    # that cap, for many minutes on two cores. Its own setting asks for fewer.
    bounded = {"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "400"}
    run = claude(base, default_model_server.key, tmp_path, "--bare", "--effort", "low", "--", "Say hello.", env=bounded)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip()
    log = default_model_server.log.read_text()
    assert '"path":"/anthropic/v1/messages","status":200' in log


class AgentScript(ScriptedEngine):
    """Answers as an agent would: a call of the tool the conversation is about, then, once its
    result is back, a closing sentence; on the web-search side request, a $web_search call
    (run by the server) and then a summary."""

    def __init__(self, target: Path) -> None:
        super().__init__()
        self.target = target

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        self.requests.append(request)
        names = {t.name for t in request.tools}
        answered = any(m.role == "tool" for m in request.messages)
        call: ToolCallDelta | None = None
        text = "Nothing to do."
        if "Write" in names and not answered:
            call = ToolCallDelta(
                0, "call_w", "Write", f'{{"file_path": "{self.target}", "content": "hello from kimi\\n"}}'
            )
        elif "WebSearch" in names and not answered:
            call = ToolCallDelta(0, "call_s", "WebSearch", '{"query": "Zorblax harbour lighthouse"}')
        elif any(t.kind == "web_search" for t in request.tools) and not answered:
            call = ToolCallDelta(0, "ws_1", "$web_search", '{"query": "Zorblax lighthouse"}', kind="builtin_function")
        elif answered:
            text = "All done: the lighthouse is teal." if "WebSearch" in names or not names else "All done."
        yield ReasoningDelta("Planning.")
        if call is not None:
            yield call
        else:
            yield ContentDelta(text)
        yield Finish("tool_calls" if call else "stop", Usage(prompt_tokens=40, completion_tokens=3, reasoning_tokens=1))


def test_write_tool_runs_and_the_run_ends_with_the_models_text(tmp_path: Path) -> None:
    target = tmp_path / "hello.txt"
    engine = AgentScript(target)
    app, _ = make_app(tmp_path, engine)
    with serve(app) as url:
        run = claude(
            url + "/anthropic",
            STATIC_KEY,
            tmp_path,
            "--tools",
            "Write",
            "--permission-mode",
            "acceptEdits",
            "--",
            "Write hello.txt.",
        )
    assert run.returncode == 0, run.stderr[-2000:]
    assert target.read_text() == "hello from kimi\n"
    assert run.stdout.strip().endswith("All done.")
    # The tool's own report came back to the model as the result of its call.
    results = [m for m in engine.requests[-1].messages if m.role == "tool"]
    assert results and str(target) in results[-1].text


def test_web_search_finds_a_document_in_the_local_index(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "zorblax.md").write_text(DOC)
    index = tmp_path / "index.sqlite3"
    indexing = ["search", "index", str(docs), "--index", str(index), "--url", "https://kb.example.org/"]
    subprocess.run(
        [sys.executable, "-m", "kimi_server.cli", *indexing],
        check=True,
        capture_output=True,
    )
    engine = AgentScript(tmp_path / "unused")
    app, _ = make_app(tmp_path, engine, web_search_index=index)
    with serve(app) as url:
        run = claude(
            url + "/anthropic",
            STATIC_KEY,
            tmp_path,
            "--tools",
            "WebSearch",
            "--allowedTools",
            "WebSearch",
            "--",
            "Search the web: what colour is the Zorblax lighthouse?",
        )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "teal" in run.stdout
    # The search ran on the server (the side request's second round read its result), and
    # Claude Code handed what it found back to the model as WebSearch's result.
    side = [r for r in engine.requests if any(t.kind == "web_search" for t in r.tools)]
    assert any("teal" in m.text for r in side for m in r.messages if m.role == "tool")
    final = engine.requests[-1]
    returned = [m.text for m in final.messages if m.role == "tool"]
    assert returned and "kb.example.org/zorblax.md" in returned[-1]
