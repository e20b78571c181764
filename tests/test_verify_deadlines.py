"""``kimi-server verify`` against endpoints that never stop sending: an endless SSE stream and a
JSON body trickled a byte at a time. Each read gets its byte in time, so only a wall-clock
deadline can end such a request; the run must end, with every check reported and each failure
naming the deadline that ended it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from kimi_server.verify.registry import load
from tests.upstreams.fake import Conn, FakeUpstream, chunk

MODEL = "kimi-k3.1-pro"
# Only a guard against a hang: a run that keeps its deadlines ends long before it.
HANG_GUARD_S = 240


async def endless_stream(body: dict[str, Any], conn: Conn) -> None:
    """Every request, streamed or not, is answered by SSE chunks that never end."""
    await conn.head()
    await conn.event(chunk({"role": "assistant", "content": ""}))
    while True:
        await conn.event(chunk({"reasoning_content": "and"}))
        await asyncio.sleep(0.02)


async def trickled_json(body: dict[str, Any], conn: Conn) -> None:
    """A JSON answer that announces a large body and sends it one byte at a time, forever."""
    await conn.head(200, "application/json", Content_Length=str(1 << 30))
    await conn.raw(b'{"id": "chatcmpl-1", "object": "chat.completion", "choices": [')
    while True:
        await conn.raw(b" ")
        await asyncio.sleep(0.02)


async def trickled_headers(body: dict[str, Any], conn: Conn) -> None:
    """A status line, then header lines one at a time, never the blank line that ends them."""
    await conn.raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
    while True:
        await conn.raw(b"X-Pad: 1\r\n")
        await asyncio.sleep(0.02)


def run_verify(url: str, *extra: str) -> tuple[int, dict[str, Any]]:
    """The command in its own process, as a user runs it, so a hang could be killed."""
    cmd = [sys.executable, "-m", "kimi_server.cli", "verify", url, "--key", "k", "--model", MODEL, "--json", *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    return done.returncode, json.loads(done.stdout)


@pytest.mark.parametrize("handler", [endless_stream, trickled_json], ids=["endless-sse", "trickled-json"])
def test_a_run_against_an_endpoint_that_never_stops_ends_with_every_check_reported(handler: Any) -> None:
    # The fake answers GET …/models itself; Anthropic's model list gets the endless answer too.
    with FakeUpstream(handler, routes={"/anthropic/v1/models": handler}) as up:
        code, report = run_verify(up.url, "--timeout", "0.4", "--check-timeout", "1", "--concurrency", "16")
    assert code == 1
    assert report["deadlines"] == {"request": 0.4, "check": 1.0}
    reported = [(r["group"], r["check"]) for r in report["results"]]
    expected = [(c.group, f"{c.name} [{MODEL}]" if c.per_model else c.name) for c in load()]
    assert reported == expected  # every check, once, in the registry's order
    statuses = {r["status"] for r in report["results"]}
    assert statuses <= {"FAIL", "SKIP"}, statuses
    failed = [r for r in report["results"] if r["status"] == "FAIL"]
    # The checks that skip do so before asking anything (a rule this model lacks); every other
    # check asked, and was ended by a deadline that its report names.
    assert len(failed) > len(report["results"]) // 2
    for r in failed:
        assert r["detail"] in (
            "no complete answer within the 0.4 s request deadline (--timeout)",
            "not finished within the 1 s check deadline (--check-timeout)",
        ), r
    # verify hung up on the endpoint rather than the endpoint stopping.
    assert up.disconnects > 0


def test_the_check_deadline_ends_a_check_whose_request_still_has_time() -> None:
    with FakeUpstream(trickled_json) as up:
        code, report = run_verify(up.url, "--only", "errors", "--timeout", "60", "--check-timeout", "0.5")
    assert code == 1
    details = {r["check"]: r["detail"] for r in report["results"]}
    assert len(details) == len([c for c in load() if c.group == "errors"])
    assert set(details.values()) == {"not finished within the 0.5 s check deadline (--check-timeout)"}


def test_headers_that_never_end_are_cut_at_the_request_deadline() -> None:
    with FakeUpstream(trickled_headers) as up:
        code, report = run_verify(up.url, "--only", "errors", "--timeout", "0.4")
    assert code == 1
    details = {r["detail"] for r in report["results"]}
    assert details == {"no complete answer within the 0.4 s request deadline (--timeout)"}


def test_the_table_names_the_deadlines() -> None:
    with FakeUpstream(endless_stream) as up:
        cmd = [sys.executable, "-m", "kimi_server.cli", "verify", up.url, "--key", "k", "--model", MODEL]
        cmd += ["--only", "errors", "--timeout", "0.3"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert done.returncode == 1
    assert "deadlines: request 0.3 s, check 0.9 s" in done.stdout
    assert "no complete answer within the 0.3 s request deadline" in done.stdout
