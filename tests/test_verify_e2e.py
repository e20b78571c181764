"""``kimi-server verify`` end to end: the real server on the default model under each
contract, and the server in front of llama.cpp's own HTTP server. Every check must pass or
skip with a reason; a failure prints the checks that failed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kimi_server.settings import Settings
from tests.conftest import DEFAULT_MODEL, LiveServer, start_server, stop_server
from tests.upstreams.fixtures import llamacpp_server

pytestmark = pytest.mark.e2e

# kimi-k3.1-pro-highspeed has the same rules as kimi-k3.1-pro: two models cover the table. The
# other runs check kimi-k3 alone, the model whose rules the two contracts disagree on (each model
# adds minutes of generation on two CPU cores).
MODELS = ("kimi-k3.1-pro", "kimi-k3")
ALL_MODELS = ("kimi-k3.1-pro", "kimi-k3.1-pro-highspeed", "kimi-k3")
BODY_LIMIT = Settings.model_fields["max_body_bytes"].default  # the server's, unless configured


def verify(
    server: LiveServer, contract: str, *extra: str, models: tuple[str, ...] = ("kimi-k3",)
) -> tuple[int, dict[str, Any]]:
    """Runs the command as a user would, in its own process."""
    model_args = [arg for m in models for arg in ("--model", m)]
    cmd = [
        sys.executable,
        "-m",
        "kimi_server.cli",
        "verify",
        server.base_url,
        "--key",
        server.key,
        "--contract",
        contract,
        "--json",
        "--timeout",
        "600",
        *model_args,
        *extra,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    return done.returncode, json.loads(done.stdout)


def by_status(report: dict[str, Any], status: str) -> list[str]:
    return [f"{r['group']}: {r['check']}: {r['detail']}" for r in report["results"] if r["status"] == status]


def passes(report: dict[str, Any], code: int) -> None:
    assert by_status(report, "FAIL") == []
    assert code == 0
    assert report["ok"] is True
    skipped = by_status(report, "SKIP")
    assert all(line.split(": ", 2)[2] for line in skipped), "a skip without a reason"


@pytest.fixture(scope="module")
def moonshot_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    proc, server = start_server(
        tmp_path_factory.mktemp("verify-moonshot"), "--model", DEFAULT_MODEL, "--contract", "moonshot"
    )
    try:
        yield server
    finally:
        stop_server(proc)


# The groups whose generation costs most (tool calls, the strict corpus, search loops) run here
# through llama.cpp's server (the evolink run below) and, on the embedded engine, in their own
# e2e modules through the openai SDK (test_structured_e2e, test_tools_default_model,
# test_web_search_e2e): this run leaves them out.
COVERED_ELSEWHERE = ["--skip", "tools", "--skip", "structured", "--skip", "web_search"]


def test_the_embedded_default_model_keeps_the_evolink_contract(default_model_server: LiveServer) -> None:
    code, report = verify(
        default_model_server,
        "evolink",
        "--other-key",
        default_model_server.other_key,
        "--body-limit",
        str(BODY_LIMIT),
        *COVERED_ELSEWHERE,
        models=MODELS,
    )
    passes(report, code)
    groups = {r["group"] for r in report["results"] if r["status"] == "PASS"}
    # Everything the embedded engine does is checked, not skipped.
    assert groups >= {
        "params",
        "effort",
        "contract",
        "streaming",
        "usage",
        "dynamic_tools",
        "media",
        "files",
        "estimate",
        "balance",
        "responses",
        "messages",
        "errors",
        "cache",
    }
    assert "files: another key cannot see a file" not in "\n".join(by_status(report, "SKIP"))
    assert [r["status"] for r in report["results"] if r["group"] == "latency"] == ["INFO", "INFO"]
    # The rules the contracts disagree on are probed the evolink way, not skipped.
    passed = {f"{r['group']}: {r['check']}": r["detail"] for r in report["results"] if r["status"] == "PASS"}
    assert passed["contract: penalties [kimi-k3]"] == "0.5 accepted and ignored"
    assert passed["contract: thinking switch [kimi-k3]"] == "thinking disabled ignored: reasoning stays on"
    assert passed["contract: tool name length [kimi-k3.1-pro]"].startswith("64 characters accepted, 65 refused")
    # The embedded engine counts with the model's own tokenizer: count_tokens is what it bills.
    assert passed["messages: count_tokens equals the billed input"].endswith(" tokens both")
    assert all(
        passed[f"estimate: estimate equals the billed prompt_tokens [{m}]"].endswith(" tokens both") for m in MODELS
    )
    assert "messages: thinking sent back; tampered refused" in passed
    assert passed["messages: body over the limit is 413 request_too_large"].endswith(f"(limit {BODY_LIMIT})")


# Groups whose checks are the same under both contracts, and whose server paths no contract rule
# changes: the evolink runs cover them on the same engines, so the moonshot runs leave them out
# (minutes of generation on two CPU cores). What the contracts disagree on (params, effort,
# contract, errors, usage) runs under both, and streaming (quick).
SAME_UNDER_BOTH = [
    arg
    for group in (
        "tools",
        "structured",
        "dynamic_tools",
        "partial",
        "web_search",
        "media",
        "files",
        "estimate",
        "balance",
        "responses",
        "messages",
        "cache",
    )
    for arg in ("--skip", group)
]


def test_the_embedded_default_model_keeps_the_moonshot_contract(moonshot_server: LiveServer) -> None:
    code, report = verify(moonshot_server, "moonshot", *SAME_UNDER_BOTH)
    passes(report, code)
    passed = {f"{r['group']}: {r['check']}" for r in report["results"] if r["status"] == "PASS"}
    assert {
        "contract: penalties [kimi-k3]",
        "contract: temperature with thinking disabled [kimi-k3]",
        "contract: thinking switch [kimi-k3]",
        "contract: tool name length [kimi-k3]",
    } <= passed


def test_the_wrong_contract_is_caught(default_model_server: LiveServer, moonshot_server: LiveServer) -> None:
    """A server held to the other contract's rules fails where the two differ, either way round."""
    code, report = verify(default_model_server, "moonshot", "--only", "contract", models=MODELS)
    assert code == 1
    failed = "\n".join(by_status(report, "FAIL"))
    assert "contract: penalties [kimi-k3]: presence_penalty 0.5: expected 400, got 200" in failed
    assert "contract: thinking switch [kimi-k3.1-pro]: reasoning_content present with thinking disabled" in failed
    assert "contract: tool name length [kimi-k3.1-pro]: a 256-character name in request tools" in failed
    code, report = verify(moonshot_server, "evolink", "--only", "contract")
    assert code == 1
    failed = "\n".join(by_status(report, "FAIL"))
    assert "contract: thinking switch [kimi-k3]: thinking disabled turned reasoning off" in failed
    assert "contract: tool name length [kimi-k3]: a 65-character name in request tools" in failed


@pytest.fixture(scope="module")
def llamacpp_upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llamacpp_server(tmp_path_factory.mktemp("verify-llamacpp"), DEFAULT_MODEL) as url:
        yield url


@pytest.mark.parametrize("contract", ["evolink", "moonshot"])
def test_the_server_in_front_of_llamacpp_keeps_the_contract(
    llamacpp_upstream: str, contract: str, tmp_path: Path
) -> None:
    # llama.cpp's server reports its cache reads, so the route says so (prompt_cache); a model
    # name that cannot be loaded: with every id routed upstream the embedded engine never starts.
    upstream = {"base_url": llamacpp_upstream, "dialect": "llamacpp", "capabilities": {"prompt_cache": True}}
    routes = {model: {"engine": "upstream", "upstreams": [upstream]} for model in ALL_MODELS}
    proc, front = start_server(
        tmp_path, "--model", "no-such-model", "--contract", contract, env={"KIMI_ROUTES": json.dumps(routes)}
    )
    try:
        code, report = verify(front, contract, *(SAME_UNDER_BOTH if contract == "moonshot" else []))
    finally:
        stop_server(proc)
    passes(report, code)
    skipped = "\n".join(by_status(report, "SKIP"))
    # llama.cpp's server runs a model without a thinking mode: the rules about reasoning are
    # skipped with that reason, never failed and never hidden.
    assert "streaming: reasoning before content: the model answered with no reasoning at all" in skipped
    if contract == "evolink":  # the groups the embedded run leaves out are checked here
        groups = {r["group"] for r in report["results"] if r["status"] == "PASS"}
        assert {"tools", "structured"} <= groups
