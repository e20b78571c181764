"""Overload and abuse through a real HTTP server (uvicorn on a socket) with the scripted engine:
the fair queue and its refusals, bounded work before the engine, HTTP hygiene, tenant-only
stats and owner-only key files."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.gate.auth import KeyRing, development_key
from kimi_server.gate.queues import server_totals
from kimi_server.http.app import create_app
from kimi_server.http.connections import uvicorn_options
from kimi_server.policy.catalogue import CATALOGUE
from kimi_server.settings import Settings
from tests.conftest import ScriptedApp, scripted_engines

A, B, C = "sk-tenant-a", "sk-tenant-b", "sk-tenant-c"
MODEL = CATALOGUE[0].id
HI = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@contextmanager
def serving(tmp: Path, engine: ScriptedEngine, **overrides: Any) -> Iterator[tuple[str, Any]]:
    """A real uvicorn server on a free port, as the CLI runs it, around the scripted engine."""
    settings = Settings(api_keys=[A, B, C], data_dir=tmp / "data", **overrides)
    app = create_app(settings, scripted_engines(engine), KeyRing([A, B, C]))
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", **uvicorn_options(settings))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def slow_engine(delay: float) -> ScriptedEngine:
    return ScriptedEngine(Script(delay=delay))  # six events: about 6 x delay per request


async def own_stats(client: httpx.AsyncClient, url: str, key: str) -> dict[str, Any]:
    r = await client.get(f"{url}/v1/engine/stats", headers=auth(key))
    data: dict[str, Any] = r.json()["data"][0]
    return data


async def until(client: httpx.AsyncClient, url: str, key: str, **want: int) -> None:
    """Waits until the key's own stats show ``want`` (no timing asserted, only a safety bound)."""
    for _ in range(500):
        got = await own_stats(client, url, key)
        if all(got[k] == v for k, v in want.items()):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"stats never reached {want}: {got}")


# -- the fair queue ---------------------------------------------------------------------------


def test_a_full_queue_answers_503_with_retry_after(tmp_path: Path) -> None:
    async def run(url: str) -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            first = asyncio.create_task(c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(A)))
            await until(c, url, A, admitted_requests=1)
            second = asyncio.create_task(c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(B)))
            await until(c, url, B, queued_requests=1)
            third = await c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(C))
            assert third.status_code == 503
            assert third.json()["error"]["code"] == "server_overloaded"
            assert int(third.headers["retry-after"]) >= 1
            assert (await first).status_code == 200
            assert (await second).status_code == 200
            assert (await own_stats(c, url, C))["rejected_queue_full"] == 1

    with serving(tmp_path, slow_engine(0.1), parallel=1, queue_max=1) as (url, _):
        asyncio.run(run(url))


def test_a_key_over_its_share_of_the_queue_gets_429_and_others_still_queue(tmp_path: Path) -> None:
    async def run(url: str) -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            post = f"{url}/v1/responses"
            body = {"model": MODEL, "input": "hi"}
            held = [asyncio.create_task(c.post(post, json=body, headers=auth(A)))]
            await until(c, url, A, admitted_requests=1)
            held.append(asyncio.create_task(c.post(post, json=body, headers=auth(A))))
            await until(c, url, A, queued_requests=1)
            over = await c.post(post, json=body, headers=auth(A))
            assert over.status_code == 429
            assert over.json()["error"]["type"] == "rate_limit_error"
            assert int(over.headers["retry-after"]) >= 1
            other = await c.post(post, json=body, headers=auth(B))  # B's share is untouched
            assert other.status_code == 200
            assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]

    with serving(tmp_path, slow_engine(0.1), parallel=1, queue_max_per_key=1) as (url, _):
        asyncio.run(run(url))


def test_a_key_over_its_share_is_told_to_retry_after_the_measured_time_a_request_takes(tmp_path: Path) -> None:
    async def run(url: str) -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            post = f"{url}/v1/chat/completions"
            assert (await c.post(post, json=HI, headers=auth(A))).status_code == 200  # at least 1.5 s
            held = [asyncio.create_task(c.post(post, json=HI, headers=auth(A)))]
            await until(c, url, A, admitted_requests=1)
            held.append(asyncio.create_task(c.post(post, json=HI, headers=auth(A))))
            await until(c, url, A, queued_requests=1)
            over = await c.post(post, json=HI, headers=auth(A))
            assert over.status_code == 429
            # No request has waited yet: the hint comes from how long one holds its slot.
            assert int(over.headers["retry-after"]) >= 2
            assert [r.status_code for r in await asyncio.gather(*held)] == [200, 200]

    with serving(tmp_path, slow_engine(0.25), parallel=1, queue_max_per_key=1) as (url, _):
        asyncio.run(run(url))


def test_a_quiet_key_is_served_before_a_flooding_key_drains(tmp_path: Path) -> None:
    finished: list[str] = []

    async def run(url: str) -> None:
        async with httpx.AsyncClient(timeout=120) as c:

            async def one(key: str, name: str) -> None:
                r = await c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(key))
                assert r.status_code == 200
                finished.append(name)

            flood = [asyncio.create_task(one(A, f"a{i}")) for i in range(8)]
            await until(c, url, A, admitted_requests=1, queued_requests=7)
            await one(B, "b")
            await asyncio.gather(*flood)

    with serving(tmp_path, slow_engine(0.05), parallel=1) as (url, _):
        asyncio.run(run(url))
    # First come, first served would put b last; the fair queue serves it next.
    assert finished.index("b") <= 2, finished


def test_a_request_that_waits_too_long_gets_a_clean_503_instead_of_starting(tmp_path: Path) -> None:
    engine = slow_engine(0.3)

    async def run(url: str) -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            first = asyncio.create_task(c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(A)))
            await until(c, url, A, admitted_requests=1)
            late = await c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(B))
            assert late.status_code == 503
            assert late.json()["error"]["code"] == "queue_timeout"
            assert "retry-after" in late.headers
            assert (await first).status_code == 200
            assert (await own_stats(c, url, B))["timed_out"] == 1

    with serving(tmp_path, engine, parallel=1, queue_max_wait=0.2) as (url, _):
        asyncio.run(run(url))
    assert len(engine.requests) == 1  # the late one never reached the engine


def test_a_request_predicted_to_wait_too_long_is_refused_at_once(tmp_path: Path) -> None:
    engine = slow_engine(0.05)  # about 0.3 s a request

    async def run(url: str) -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            for _ in range(8):  # what a request takes, measured
                assert (await c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(A))).status_code == 200
            # Eight at once, one slot at about 0.3 s a request: the later ones would wait past
            # the 1 s limit, and are told so at once instead of after waiting it out.
            burst = [c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(A)) for _ in range(8)]
            answers = await asyncio.gather(*burst)
            refused = [r for r in answers if r.status_code == 503]
            assert refused and all(r.status_code == 200 for r in answers if r not in refused)
            early = [r for r in refused if "not queued" in r.json()["error"]["message"]]
            assert early and all(r.json()["error"]["code"] == "queue_timeout" for r in early)
            assert all(int(r.headers["retry-after"]) >= 1 for r in early)
            assert (await own_stats(c, url, A))["refused_early"] == len(early)
            metrics = (await c.get(f"{url}/metrics")).text
            assert f'reason="predicted_wait"}} {float(len(early))}' in metrics

    with serving(tmp_path, engine, parallel=1, queue_max_wait=1.0, metrics_public=True) as (url, _):
        asyncio.run(run(url))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream-before-first-event"])
def test_a_client_that_leaves_stops_its_generation_and_frees_its_slot(tmp_path: Path, stream: bool) -> None:
    engine = slow_engine(0.5)  # the first event comes after 0.5 s, the answer after 3 s

    async def run(url: str) -> None:
        async with httpx.AsyncClient(timeout=0.25) as c:
            with pytest.raises(httpx.ReadTimeout):
                await c.post(f"{url}/v1/chat/completions", json={**HI, "stream": stream}, headers=auth(A))
        async with httpx.AsyncClient(timeout=30) as c:
            await until(c, url, A, admitted_requests=0)

    with serving(tmp_path, engine, parallel=1) as (url, _):
        asyncio.run(run(url))
        for _ in range(200):
            if engine.cancelled:
                break
            time.sleep(0.02)
    assert engine.cancelled == 1


def test_a_client_that_leaves_while_queued_gives_its_place_back(tmp_path: Path) -> None:
    async def run(url: str) -> None:
        async with httpx.AsyncClient(timeout=60) as c:
            first = asyncio.create_task(c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(A)))
            await until(c, url, A, admitted_requests=1)
            async with httpx.AsyncClient(timeout=0.3) as impatient:
                with pytest.raises(httpx.ReadTimeout):
                    await impatient.post(f"{url}/v1/chat/completions", json=HI, headers=auth(B))
            await until(c, url, B, queued_requests=0, left_while_waiting=1, admitted=0)
            assert (await first).status_code == 200

    with serving(tmp_path, slow_engine(0.3), parallel=1) as (url, _):
        asyncio.run(run(url))


# -- bounded work before the engine -----------------------------------------------------------


def test_prompts_that_cannot_fit_are_refused_before_the_engine(tmp_path: Path) -> None:
    engine = ScriptedEngine()
    engine.window = 4096  # the engine's own window bounds its prompts
    with serving(tmp_path, engine, ctx_size=4096) as (url, _), httpx.Client(timeout=60) as c:
        many = {"model": MODEL, "messages": [{"role": "user", "content": "a"}] * 100_000}
        r = c.post(f"{url}/v1/chat/completions", json=many, headers=auth(A))
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "messages"
        assert r.json()["error"]["code"] == "too_many_messages"
        long = {"model": MODEL, "input": "word " * 10_000}  # 50,000 characters > 8 x 4096
        r = c.post(f"{url}/v1/responses", json=long, headers=auth(A))
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "input"
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(B)).status_code == 200
    assert len(engine.requests) == 1


# -- inputs that must never give a 5xx --------------------------------------------------------


def test_lone_surrogates_deep_nesting_and_unicode_patterns_are_answered_cleanly(tmp_path: Path) -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(900):
        node["x"] = {}
        node = node["x"]
    letters = {
        "type": "object",
        "properties": {"w": {"type": "string", "pattern": "^\\p{L}+$"}},
        "required": ["w"],
        "additionalProperties": False,
    }
    tool: dict[str, Any] = {"type": "function", "function": {"name": "f", "strict": True, "parameters": letters}}
    with serving(tmp_path, ScriptedEngine()) as (url, _), httpx.Client(timeout=60) as c:
        h = {**auth(A), "content-type": "application/json"}
        raw = '{"model": "%s", "messages": [{"role": "user", "content": "x\\ud800"}]}' % MODEL  # noqa: UP031
        r = c.post(f"{url}/v1/chat/completions", content=raw, headers=h)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content"
        raw = '{"model": "%s", "input": [{"role": "user", "content": "ok"}], "\\udc00": 1}' % MODEL  # noqa: UP031
        assert c.post(f"{url}/v1/responses", content=raw, headers=h).status_code == 400
        nested = {**HI, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"x-a": deep}}}]}
        r = c.post(f"{url}/v1/chat/completions", content=json.dumps(nested), headers=h)
        assert r.status_code == 400 and r.json()["error"]["code"] == "json_too_deep"
        assert c.post(f"{url}/v1/chat/completions", json={**HI, "tools": [tool]}, headers=auth(A)).status_code == 200
        broken = {**letters, "properties": {"w": {"type": "string", "pattern": "[unclosed"}}}
        tool["function"]["parameters"] = broken
        r = c.post(f"{url}/v1/chat/completions", json={**HI, "tools": [tool]}, headers=auth(A))
        assert r.status_code == 400 and r.json()["error"]["param"].endswith("pattern")


# -- HTTP hygiene -----------------------------------------------------------------------------


def test_a_chunked_body_over_the_limit_gets_413_and_the_connection_closes(tmp_path: Path) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "'
        for _ in range(9 * 16):
            yield b"a" * 65536
        yield b'"}]}'

    with serving(tmp_path, ScriptedEngine()) as (url, _), httpx.Client(timeout=60) as c:
        h = {**auth(A), "content-type": "application/json"}
        r = c.post(f"{url}/v1/chat/completions", content=chunks(), headers=h)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "request_too_large"
        assert r.headers["connection"] == "close"


def test_the_key_is_checked_before_the_body_is_read(tmp_path: Path) -> None:
    with serving(tmp_path, ScriptedEngine()) as (url, _), httpx.Client(timeout=60) as c:
        h = {"content-type": "application/json"}
        r = c.post(f"{url}/v1/chat/completions", content=b"{not json", headers=h)
        assert r.status_code == 401
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["error"]["type"] == "authentication_error"
        r = c.post(f"{url}/v1/responses", content=b"{not json", headers={**h, **auth("sk-wrong")})
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        r = c.post(f"{url}/v1/chat/completions", content=b"{not json", headers={**h, **auth(A)})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        assert c.get(f"{url}/v1/models").headers["www-authenticate"].startswith("Bearer")


def test_head_health_works(tmp_path: Path) -> None:
    with serving(tmp_path, ScriptedEngine()) as (url, _), httpx.Client(timeout=60) as c:
        r = c.head(f"{url}/health")
        assert r.status_code == 200 and r.content == b""


def ask_health(conn: socket.socket) -> bytes:
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = b""
    while b'{"status":"ok"}' not in reply:
        part = conn.recv(1024)
        if not part:
            break  # closed
        reply += part
    return reply


def test_connections_that_send_no_request_head_in_time_are_closed(tmp_path: Path) -> None:
    """A head must be complete in time, on a new connection and once begun after a response;
    an idle connection after a response is kept for the keep-alive timeout, not the head's."""
    with serving(tmp_path, ScriptedEngine(), http_header_timeout=0.3, http_keep_alive_timeout=3) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        silent = socket.create_connection((host, int(port)))
        dribble = socket.create_connection((host, int(port)))
        dribble.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        for conn in (silent, dribble):
            conn.settimeout(20)  # a bound for the test, far above the configured 0.3 s
            assert conn.recv(1024) == b""  # the server closed it
            conn.close()
        kept = socket.create_connection((host, int(port)))
        kept.settimeout(20)
        assert ask_health(kept).startswith(b"HTTP/1.1 200")
        time.sleep(1.0)  # idle past the head's 0.3 s, within the keep-alive's 3 s: still open
        assert ask_health(kept).startswith(b"HTTP/1.1 200")
        assert kept.recv(1024) == b""  # idle after its answer: closed after the keep-alive timeout
        kept.close()
        slow = socket.create_connection((host, int(port)))
        slow.settimeout(20)
        assert ask_health(slow).startswith(b"HTTP/1.1 200")
        slow.sendall(b"GET /health HTTP/1.1\r\n")  # a head begun after a response, never finished
        assert slow.recv(1024) == b""  # uvicorn's keep-alive timer stops at the first byte: this is the head's
        slow.close()


# -- tenant-only figures ----------------------------------------------------------------------


def test_a_key_sees_only_its_own_figures_and_operators_get_the_totals(tmp_path: Path) -> None:
    with serving(tmp_path, ScriptedEngine()) as (url, app), httpx.Client(timeout=60) as c:
        theirs = c.get(f"{url}/v1/engine/stats", headers=auth(B)).json()["data"][0]
        for _ in range(3):
            assert c.post(f"{url}/v1/chat/completions", json=HI, headers=auth(A)).status_code == 200
        mine = c.get(f"{url}/v1/engine/stats", headers=auth(A)).json()["data"][0]
        assert mine["admitted"] == 3
        assert c.get(f"{url}/v1/engine/stats", headers=auth(B)).json()["data"][0] == theirs
        cache = c.get(f"{url}/v1/cache/stats", headers=auth(A)).json()
        assert "server" not in cache
        totals = server_totals(app.state.kimi.queues)
        assert totals[0]["queue_admitted"] == 3
        assert totals[0]["queue_slots"] == Settings().parallel


# -- key files --------------------------------------------------------------------------------


def test_key_files_others_can_read_are_made_owner_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "data"
    data.mkdir()
    dev = data / "dev-api-key"
    dev.write_text("sk-kimi-known\n")
    dev.chmod(0o644)
    assert development_key(data) == "sk-kimi-known"
    assert stat.S_IMODE(dev.stat().st_mode) == 0o600
    sealing = data / "responses.key"
    sealing.write_text("A" * 43 + "=\n")
    os.chmod(sealing, 0o640)
    with serving(tmp_path, ScriptedEngine()):
        pass
    assert stat.S_IMODE(sealing.stat().st_mode) == 0o600
    assert "other users could access it" in caplog.text


# -- the log ----------------------------------------------------------------------------------


def test_an_unexpected_failure_is_logged_without_its_message(
    scripted_app: ScriptedApp, caplog: pytest.LogCaptureFixture
) -> None:
    from kimi_server.engines.types import GenerationRequest

    def fail(request: GenerationRequest) -> None:
        raise RuntimeError(f"cannot handle {request.messages[-1].text!r}")  # quotes the client

    engine = ScriptedEngine(on_generate=fail)
    secret = "client-secret-text-42"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": secret}]}
    with scripted_app(engine, keys=[A]) as c:
        assert c.post("/v1/chat/completions", json=chat).status_code == 500
        assert c.post("/v1/chat/completions", json={**chat, "stream": True}).status_code == 500
        assert c.post("/v1/responses", json={"model": MODEL, "input": secret}).status_code == 500
    assert caplog.text.count("RuntimeError") >= 3
    assert secret not in caplog.text
