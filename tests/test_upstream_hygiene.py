"""What an upstream says about itself stays inside: its URLs, hosts, addresses and paths never
reach a client or the log, and its Retry-After reaches the client (bounded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import start_server, stop_server
from tests.upstreams.fake import Conn, FakeUpstream
from tests.upstreams.front import config, front

BODY: dict[str, Any] = {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 50}


def refusal(status: int, retry_after: str) -> Any:
    async def handler(body: dict[str, Any], c: Conn) -> None:
        await c.json(status, {"error": {"message": "busy"}}, Retry_After=retry_after)

    return handler


@pytest.mark.parametrize(
    ("status", "sent", "bound", "heard"),
    [(429, "3", 10.0, "3"), (429, "3600", 10.0, "10"), (503, "2.5", 10.0, "3"), (503, "120", 30.0, "30")],
)
def test_upstream_retry_after_reaches_the_client_bounded(
    tmp_path: Path, status: int, sent: str, bound: float, heard: str
) -> None:
    with (
        FakeUpstream(refusal(status, sent)) as up,
        front(tmp_path, config(up.url, retries=0, max_retry_after=bound)) as f,
    ):
        with pytest.raises(openai.APIStatusError) as caught:
            f.sdk.chat.completions.create(**BODY)
        assert caught.value.status_code == status
        assert caught.value.response.headers.get("retry-after") == heard
        assert len(up.bodies) == 1


def test_control_and_bidi_characters_in_upstream_errors_arrive_escaped(tmp_path: Path, caplog: Any) -> None:
    """ESC sequences would recolour a terminal that prints the error; RLO and its kin would
    reorder what follows them. They arrive as visible escapes, in the client's error and the log."""

    async def hostile(body: dict[str, Any], c: Conn) -> None:
        message = "bad \x1b[31mred\x1b[0m field\u202e txt.exe\u2066 \x07 line\nbreak: max_tokens too large"
        await c.json(400, {"error": {"message": message}})

    with FakeUpstream(hostile) as up, front(tmp_path, config(up.url)) as f:
        r = f.http.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.endswith(
        "bad \\x1b[31mred\\x1b[0m field\\u202e txt.exe\\u2066 \\x07 line\\x0abreak: max_tokens too large"
    )
    logged = "\n".join(rec.getMessage() for rec in caplog.records if "upstream" in rec.name)
    for text in (r.text, message, logged):
        for raw in ("\x1b", "\u202e", "\u2066", "\x07"):
            assert raw not in text
    assert "\\u202e" in logged


@pytest.mark.e2e
def test_upstream_urls_hosts_and_paths_reach_neither_client_nor_log(tmp_path: Path) -> None:
    """Through the real server: the upstream's 400 names its own URL with a secret path, another
    address and a file path; the client still learns what was wrong, and nothing else."""
    port: dict[str, int] = {}

    async def leaky(body: dict[str, Any], c: Conn) -> None:
        message = (
            f"model weights missing at http://127.0.0.1:{port['n']}/secret-path/v1?token=s3cr3t "
            "(mirror 10.20.30.40:9000, file /srv/secret-models/k3.gguf): max_tokens is too large"
        )
        await c.json(400, {"error": {"message": message}})

    with FakeUpstream(leaky) as up:
        port["n"] = up.port
        proc, server = start_server(tmp_path, "--upstream", up.url, "--model", "no-such-model")
        try:
            sdk = openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0, timeout=30)
            with pytest.raises(openai.BadRequestError) as caught:
                sdk.chat.completions.create(**BODY)
            message = caught.value.response.json()["error"]["message"]
        finally:
            stop_server(proc)
    assert "max_tokens is too large" in message  # the reason survives
    log = server.log.read_text()
    assert "max_tokens is too large" in log  # the failure was logged, scrubbed
    for text in (message, log):
        for secret in ("secret", "s3cr3t", f"127.0.0.1:{up.port}/", "10.20.30.40", "/srv"):
            assert secret not in text, (secret, text[-2000:])
