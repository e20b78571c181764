"""Overload and abuse against the real server (real tiny model through llama.cpp): inputs that
gave a 5xx, a departed non-streaming client, a huge prompt, and what the process listens on."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, start_server, stop_server

pytestmark = pytest.mark.e2e

MODEL = "kimi-k3.1-pro"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, LiveServer]]:
    # effort max reasons for at least 4000 tokens here: a request that surely outlasts its client.
    budgets = '{"low": {"floor": 8, "cap": 48}, "max": {"floor": 4000, "cap": 8000}}'
    proc, live = start_server(tmp_path_factory.mktemp("overload"), "--parallel", "2", env={"KIMI_BUDGETS": budgets})
    try:
        yield proc.pid, live
    finally:
        stop_server(proc)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def post(live: LiveServer, path: str, body: Any, key: str | None = None, timeout: float = 300) -> httpx.Response:
    raw = body if isinstance(body, str) else json.dumps(body)
    headers = {**auth(key or live.key), "content-type": "application/json"}
    return httpx.post(live.base_url + path, content=raw, headers=headers, timeout=timeout)


def small(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "reasoning_effort": "low", "max_completion_tokens": 24, **extra}


def stats(live: LiveServer, key: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(live.base_url + "/engine/stats", headers=auth(key), timeout=30).json()["data"][0]
    return data


# -- what the process listens on --------------------------------------------------------------


def _listening_inodes(pid: int) -> dict[str, set[str]]:
    """Inode -> kind, for every listening socket the process holds (from /proc)."""
    owned = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            owned.add(target[8:-1])
    found: dict[str, set[str]] = {"tcp": set(), "unix": set()}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in owned:  # 0A: LISTEN
                found["tcp"].add(str(int(cols[1].rsplit(":", 1)[1], 16)))
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        cols = line.split()
        # flags 00010000: __SO_ACCEPTCON, a listening socket
        if cols[6] in owned and int(cols[3], 16) & 0x10000:
            found["unix"].add(cols[7] if len(cols) > 7 else "")
    return found


def test_nothing_listens_but_the_configured_port(server: tuple[int, LiveServer]) -> None:
    pid, live = server
    port = live.base_url.rsplit(":", 1)[1].split("/")[0]
    found = _listening_inodes(pid)
    assert found["tcp"] == {port}
    # llama.cpp's own listener is a Unix socket whose name is gone: nothing can connect to it.
    for name in found["unix"]:
        assert not name or not os.path.exists(name.lstrip("@"))


# -- inputs that must never give a 5xx --------------------------------------------------------


def test_lone_surrogates_deep_nesting_and_unicode_patterns_never_5xx(server: tuple[int, LiveServer]) -> None:
    _, live = server
    hi = [{"role": "user", "content": "Say hi."}]
    surrogate = '{"model": "%s", "max_completion_tokens": 8, "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    r = post(live, "/chat/completions", surrogate % MODEL)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
    r = post(live, "/responses", '{"model": "%s", "max_output_tokens": 8, "input": "\\udfff"}' % MODEL)  # noqa: UP031
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"

    deep: dict[str, Any] = {}
    node = deep
    for _ in range(900):
        node["x"] = {}
        node = node["x"]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x-meta": deep}}}
    r = post(live, "/chat/completions", small(messages=hi, tools=[tool]))
    assert r.status_code == 400 and r.json()["error"]["code"] == "json_too_deep"

    letters = {
        "type": "object",
        "properties": {"word": {"type": "string", "pattern": "^\\p{L}{1,8}$"}},
        "required": ["word"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": letters, "strict": True}}
    r = post(live, "/chat/completions", small(messages=hi, response_format=fmt, max_completion_tokens=120))
    assert r.status_code == 200, r.text
    word = json.loads(r.json()["choices"][0]["message"]["content"])["word"]
    assert word.isalpha()
    bad = {**letters, "properties": {"word": {"type": "string", "pattern": "(unclosed"}}}
    bad_fmt = {**fmt, "json_schema": {"name": "w", "schema": bad}}
    r = post(live, "/chat/completions", small(messages=hi, response_format=bad_fmt))
    assert r.status_code == 400
    assert "Traceback" not in live.log.read_text(errors="replace")


# -- bounded work before the engine -----------------------------------------------------------


def test_a_huge_prompt_is_refused_at_once_and_another_key_is_served(server: tuple[int, LiveServer]) -> None:
    _, live = server
    flood = {"model": MODEL, "messages": [{"role": "user", "content": "a"}] * 100_000}
    answers: dict[str, httpx.Response] = {}

    def huge() -> None:
        answers["huge"] = post(live, "/chat/completions", flood)

    thread = threading.Thread(target=huge)
    thread.start()
    other = post(live, "/chat/completions", small(messages=[{"role": "user", "content": "Hi"}]), key=live.other_key)
    thread.join()
    assert other.status_code == 200
    assert answers["huge"].status_code == 400
    assert answers["huge"].json()["error"]["code"] == "too_many_messages"
    assert stats(live, live.key)["active_calls"] == 0


# -- a departed client costs nothing ------------------------------------------------


def test_a_non_streaming_request_whose_client_leaves_frees_its_slot(server: tuple[int, LiveServer]) -> None:
    _, live = server
    before = stats(live, live.key)["cancelled_calls"]
    story = [{"role": "user", "content": "Write a very long story."}]
    body = {"model": MODEL, "messages": story, "max_completion_tokens": 100000}
    # The client gives up after a few seconds; the generation would run for minutes.
    with pytest.raises(httpx.ReadTimeout):
        post(live, "/chat/completions", body, timeout=3)
    deadline = time.monotonic() + 60
    now = stats(live, live.key)
    while time.monotonic() < deadline and not (now["cancelled_calls"] > before and now["active_calls"] == 0):
        time.sleep(0.2)
        now = stats(live, live.key)
    assert now["cancelled_calls"] > before
    assert now["active_calls"] == 0
    assert now["admitted_requests"] == 0  # the queue ticket went back too
