"""A long prompt being read when its client leaves, and when the server stops: the real server
and the real tiny model. A departed client's request ends (499) and frees the engine for the
next one; a request still in prefill when the graceful shutdown runs out gets a 503 to retry
elsewhere, not a 500 with a traceback."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start_server, stop_server

pytestmark = pytest.mark.e2e

LONG = "a\nb\nc\n" * 1000  # about 6,000 tokens: read for tens of seconds on two cores


def long_body(tag: str) -> dict[str, Any]:
    content = f"{tag}\n{LONG}"
    return {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": content}], "max_completion_tokens": 4}


def logged_statuses(log: Path) -> list[int]:
    out = []
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("path") == "/v1/chat/completions" and "status" in entry:
            out.append(int(entry["status"]))
    return out


def test_a_departed_client_frees_the_engine_and_shutdown_answers_503(tmp_path: Path) -> None:
    proc, server = start_server(tmp_path)
    headers = {"Authorization": f"Bearer {server.key}"}
    url = server.base_url + "/chat/completions"
    at_shutdown: list[httpx.Response] = []
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(url, json=long_body("one"), headers=headers, timeout=3)
        short = {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 8}
        assert httpx.post(url, json=short, headers=headers, timeout=120).status_code == 200

        def in_flight() -> None:
            at_shutdown.append(httpx.post(url, json=long_body("two"), headers=headers, timeout=120))

        sender = threading.Thread(target=in_flight)
        sender.start()
        time.sleep(4)  # well inside the prompt's reading
    finally:
        stop_server(proc)
    sender.join(timeout=60)
    (answer,) = at_shutdown
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["code"] == "server_shutting_down" and answer.headers["retry-after"] == "1"
    log = tmp_path / "server.log"
    assert logged_statuses(log) == [499, 200, 503]
    text = log.read_text()
    assert "Traceback" not in text and "Exception in ASGI application" not in text
