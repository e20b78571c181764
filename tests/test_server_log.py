"""The real server's log: after the start-up lines, every line is one JSON object with an ISO
8601 timestamp, and a request leaves exactly one line (no second access line from uvicorn)."""

from __future__ import annotations

import json
import secrets
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_server, stop_server

pytestmark = pytest.mark.e2e


def _after_start_up(log: str) -> list[str]:
    """The lines from uvicorn's first on: before it, ``serve`` prints a few for people (what it
    serves, the base URL, the key)."""
    lines = log.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith('{"ts"') and '"logger":"uvicorn' in line)
    assert all(line.startswith('{"ts"') for line in lines[:first] if not line.startswith(("kimi-server:", "  ")))
    return lines[first:]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_one_json_line_per_request(tmp_path: Path, workers: str) -> None:
    proc, server = start_server(tmp_path, "--workers", workers, env={"KIMI_TEST_ENGINE": "scripted"})
    request_id = "ops-" + secrets.token_hex(8)
    try:
        answer = httpx.post(
            f"{server.base_url}/chat/completions",
            json={"model": "kimi-k3", "messages": [{"role": "user", "content": "Hi"}]},
            headers={"Authorization": f"Bearer {server.key}", "x-request-id": request_id},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        refused = httpx.get(f"{server.base_url}/models", timeout=30)  # no key: a warning-free 401
        assert refused.status_code == 401
    finally:
        stop_server(proc)  # every line written and flushed
    lines = _after_start_up(server.log.read_text())
    parsed: list[dict[str, Any]] = []
    for line in lines:
        entry = json.loads(line)  # fails on a text prefix or an access line
        assert isinstance(entry, dict), line
        assert datetime.fromisoformat(entry["ts"]).tzinfo is not None, line
        assert entry["level"] and entry["logger"] and "message" in entry, line
        parsed.append(entry)
    mine = [e for e in parsed if request_id in json.dumps(e)]
    assert len(mine) == 1, mine
    (logged,) = mine
    assert logged["logger"] == "kimi_server.requests" and logged["message"] == "request"
    assert (logged["path"], logged["status"], logged["model"]) == ("/v1/chat/completions", 200, "kimi-k3")
    assert logged["completion_tokens"] > 0
    assert not any("/v1/models" in e.get("message", "") for e in parsed)  # no uvicorn access line
    assert any(e.get("path") == "/v1/models" and e.get("status") == 401 for e in parsed)
    assert any(e["logger"].startswith("uvicorn") for e in parsed)  # uvicorn's own lines, as JSON
