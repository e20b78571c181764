"""A fault-injecting upstream on 127.0.0.1: for each fault the client gets a complete answer
(after retry or failover) or a clean error in the API's shape, nothing hangs past its timeout,
no output is duplicated, and the circuit breaker opens and closes as documented."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest

from kimi_server.engines.upstream.breaker import CircuitBreaker
from tests.conftest import start_server, stop_server
from tests.upstreams.fake import Conn, FakeUpstream, chunk
from tests.upstreams.front import Front, config, front

BODY = {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 50}


async def good(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"reasoning_content": "Hm."}))
    for piece in ("Hello", " there."):
        await c.event(chunk({"content": piece}))
    await c.event(chunk({}, "stop"))
    await c.done()


def first_then_good(fault: Any, times: int = 1) -> Any:
    """A handler that injects ``fault`` on its first ``times`` requests, then answers well."""
    seen = {"n": 0}

    async def handler(body: dict[str, Any], c: Conn) -> None:
        seen["n"] += 1
        await (fault(body, c) if seen["n"] <= times else good(body, c))

    return handler


async def stall_before_headers(body: dict[str, Any], c: Conn) -> None:
    await asyncio.sleep(60)


async def stall_mid_stream(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"content": "Hello"}))
    await asyncio.sleep(60)


async def reset_before_headers(body: dict[str, Any], c: Conn) -> None:
    c.reset()


async def reset_mid_stream(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"content": "Hello"}))
    c.reset()


async def status_500(body: dict[str, Any], c: Conn) -> None:
    await c.json(500, {"error": {"message": "CUDA out of memory at /opt/secret/path"}})


async def status_400(body: dict[str, Any], c: Conn) -> None:
    await c.json(400, {"error": {"message": "max_tokens is too large for this context"}})


def status_429(after: str) -> Any:
    async def handler(body: dict[str, Any], c: Conn) -> None:
        await c.json(429, {"error": {"message": "slow down"}}, Retry_After=after)

    return handler


async def malformed_first(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.raw(b"data: {not json\n\n")


async def malformed_mid(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"content": "Hello"}))
    await c.raw(b"data: {not json\n\n")


async def truncated(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"content": "Hello"}))
    await c.raw(b'data: {"choices": [{"delta": {"content": " th')


async def endless(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    while True:
        await c.event(chunk({"content": "la "}))
        await asyncio.sleep(0.001)


def state_of(breaker: CircuitBreaker) -> str:
    """Read anew each time (a literal comparison would make mypy think the state is fixed)."""
    return breaker.state


def post(f: Front, **extra: Any) -> httpx2.Response:  # the TestClient speaks httpx2
    return f.http.post("/v1/chat/completions", json={**BODY, **extra})


def stream_frames(f: Front) -> list[Any]:
    frames: list[Any] = []
    with f.http.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                frames.append(data if data == "[DONE]" else json.loads(data))
    return frames


def text_of(frames: list[Any]) -> str:
    return "".join(
        fr["choices"][0]["delta"].get("content") or "" for fr in frames if isinstance(fr, dict) and fr.get("choices")
    )


def assert_error_shape(body: dict[str, Any], code: str) -> None:
    err = body["error"]
    assert set(err) >= {"message", "type", "code"} and err["code"] == code
    assert "/opt" not in err["message"] and "127.0.0.1" not in err["message"]


def test_retry_before_first_byte_gives_one_complete_answer(tmp_path: Path) -> None:
    for fault in (reset_before_headers, status_500, malformed_first, stall_before_headers):
        with FakeUpstream(first_then_good(fault)) as up, front(tmp_path, config(up.url)) as f:
            r = post(f)
            assert r.status_code == 200, (fault.__name__, r.text)
            assert r.json()["choices"][0]["message"]["content"] == "Hello there."
            assert len(up.bodies) == 2
            assert f.engine.stats()["retries"] == 1


def test_retry_after_is_honoured(tmp_path: Path) -> None:
    with FakeUpstream(first_then_good(status_429("0.3"))) as up, front(tmp_path, config(up.url)) as f:
        started = time.monotonic()
        r = post(f)
        assert r.status_code == 200
        assert time.monotonic() - started >= 0.3
        assert len(up.bodies) == 2


def test_exhausted_retries_map_to_the_right_errors(tmp_path: Path) -> None:
    cases = [
        (stall_before_headers, 504, "upstream_timeout"),
        (status_500, 502, "upstream_error"),
        (reset_before_headers, 502, "upstream_error"),
        (malformed_first, 502, "upstream_error"),
        (status_429("120"), 429, "rate_limit_exceeded"),  # longer than we wait: no retry
    ]
    for fault, status, code in cases:
        with FakeUpstream(fault) as up, front(tmp_path, config(up.url, retries=1)) as f:
            r = post(f)
            assert r.status_code == status, (fault, r.text)
            assert_error_shape(r.json(), code)
            assert len(up.bodies) == (1 if status == 429 else 2)


def test_upstream_400_is_the_clients_400_without_retry(tmp_path: Path) -> None:
    with FakeUpstream(status_400) as up, front(tmp_path, config(up.url)) as f:
        r = post(f)
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "max_tokens is too large" in err["message"]
        assert len(up.bodies) == 1


def test_failover_to_the_next_upstream(tmp_path: Path) -> None:
    with (
        FakeUpstream(stall_before_headers) as bad,
        FakeUpstream(good) as ok,
        front(tmp_path, config(bad.url, retries=0, weight=1000), config(ok.url, weight=1)) as f,
    ):
        for _ in range(3):
            r = post(f)
            assert r.status_code == 200
            assert r.json()["choices"][0]["message"]["content"] == "Hello there."
        assert len(ok.bodies) == 3 and f.engine.stats()["failovers"] >= 1


def test_faults_after_output_end_the_stream_with_an_error_event(tmp_path: Path) -> None:
    for fault in (stall_mid_stream, reset_mid_stream, malformed_mid, truncated):
        with FakeUpstream(fault) as up, front(tmp_path, config(up.url)) as f:
            frames = stream_frames(f)
            assert text_of(frames) == "Hello", fault.__name__  # sent once, never repeated
            assert frames[-1] == "[DONE]"
            assert_error_shape(frames[-2], "upstream_error")
            assert len(up.bodies) == 1  # no retry once output has gone out
            r = post(f)  # the same faults without streaming: a clean 502
            assert r.status_code == 502
            assert_error_shape(r.json(), "upstream_error")


def test_endless_stream_stops_at_the_output_cap(tmp_path: Path) -> None:
    with FakeUpstream(endless) as up, front(tmp_path, config(up.url)) as f:
        r = post(f, max_tokens=20)
        assert r.status_code == 200
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "length"
        assert choice["message"]["content"].count("la") < 200


def test_breaker_opens_then_probes_and_closes(tmp_path: Path) -> None:
    state = {"healthy": False}
    now = [0.0]  # the breaker's clock, moved by the test: no sleeping, no timing

    async def flaky(body: dict[str, Any], c: Conn) -> None:
        await (good(body, c) if state["healthy"] else status_500(body, c))

    with FakeUpstream(flaky) as up, front(tmp_path, config(up.url, retries=0)) as f:
        [upstream] = f.engine.upstreams
        upstream.breaker = CircuitBreaker(threshold=2, cooldown=30, clock=lambda: now[0])
        assert post(f).status_code == 502
        assert state_of(upstream.breaker) == "closed"
        assert post(f).status_code == 502
        assert state_of(upstream.breaker) == "open"
        r = post(f)  # refused here, the upstream never sees it
        assert r.status_code == 503 and len(up.bodies) == 2
        assert_error_shape(r.json(), "upstream_unavailable")
        now[0] += 30
        assert state_of(upstream.breaker) == "half_open"
        assert post(f).status_code == 502  # the probe fails: open again for another cooldown
        assert state_of(upstream.breaker) == "open" and len(up.bodies) == 3
        assert post(f).status_code == 503 and len(up.bodies) == 3
        now[0] += 30
        state["healthy"] = True
        assert post(f).status_code == 200  # the probe succeeds: closed
        assert state_of(upstream.breaker) == "closed"
        health = f.http.get("/health?deep=1").json()
        assert health["upstreams"][0]["state"] == "closed"


@pytest.mark.e2e
def test_client_disconnect_closes_the_upstream_request(tmp_path: Path) -> None:
    """Through a real uvicorn server: the client leaves mid-stream, the upstream sees it go."""
    with FakeUpstream(endless) as up:
        # One worker: the per-key engine counters read below are those of one process.
        proc, server = start_server(tmp_path, "--upstream", up.url, "--model", "no-such-model", "--workers", "1")
        try:
            headers = {"Authorization": f"Bearer {server.key}"}
            with httpx.stream(
                "POST",
                f"{server.base_url}/chat/completions",
                headers=headers,
                timeout=30,
                json={**BODY, "stream": True, "max_tokens": 100000},
            ) as r:
                for line in r.iter_lines():
                    if "la" in line:
                        break
            deadline = time.monotonic() + 20
            while up.disconnects == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert up.disconnects == 1
            stats = httpx.get(f"{server.base_url}/engine/stats", headers=headers).json()["data"][0]
            assert stats["cancelled_calls"] == 1 and stats["active_calls"] == 0
        finally:
            stop_server(proc)


@pytest.mark.e2e
def test_client_leaving_a_non_streaming_request_closes_the_upstream_request(tmp_path: Path) -> None:
    """Through a real uvicorn server, whose protocol tells the request its connection is gone:
    the client gives up waiting for a whole answer, and the upstream sees the relay go too."""
    with FakeUpstream(endless) as up:
        proc, server = start_server(tmp_path, "--upstream", up.url, "--model", "no-such-model", "--workers", "1")
        try:
            headers = {"Authorization": f"Bearer {server.key}"}
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(
                    f"{server.base_url}/chat/completions",
                    headers=headers,
                    timeout=httpx.Timeout(30, read=1.5),
                    json={**BODY, "max_tokens": 100000},
                )
            deadline = time.monotonic() + 20
            while up.disconnects == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert up.disconnects == 1
            stats = httpx.get(f"{server.base_url}/engine/stats", headers=headers).json()["data"][0]
            assert stats["cancelled_calls"] == 1 and stats["active_calls"] == 0
            # The server goes on serving: the cancellation ended that request alone.
            assert httpx.get(f"{server.base_url}/models", headers=headers).status_code == 200
        finally:
            stop_server(proc)


@pytest.mark.parametrize("fault", [stall_mid_stream])
def test_nothing_hangs_past_the_read_timeout(fault: Any, tmp_path: Path) -> None:
    with FakeUpstream(fault) as up, front(tmp_path, config(up.url, read_timeout=0.5)) as f:
        started = time.monotonic()
        frames = stream_frames(f)
        assert frames[-1] == "[DONE]"
        assert time.monotonic() - started < 20  # bounded by the read timeout, not the stall


def test_responses_stream_fault_after_output_is_response_failed(tmp_path: Path) -> None:
    with FakeUpstream(reset_mid_stream) as up, front(tmp_path, config(up.url)) as f:
        body = {"model": "kimi-k3.1-pro", "input": "Hi", "max_output_tokens": 50, "stream": True}
        with f.http.stream("POST", "/v1/responses", json=body) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1]["type"] == "response.failed"
        # The Responses core reports any 5xx failure as a generic server_error.
        assert events[-1]["response"]["error"]["code"] == "server_error"
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        assert "".join(deltas) == "Hello" and len(up.bodies) == 1
