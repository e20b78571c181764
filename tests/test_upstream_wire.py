"""The relay's lean HTTP/1.1 client (engines/upstream/wire.py) against real sockets on
127.0.0.1: keep-alive and its limits, bodies of every framing, timeouts, TLS, and the httpx path
kept for proxied upstreams."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kimi_server.engines.types import ContentDelta, EngineEvent, Finish
from kimi_server.engines.upstream.errors import GatewayTimeoutError, UpstreamStreamError, UpstreamUnavailableError
from kimi_server.engines.upstream.normalise import Normaliser
from kimi_server.engines.upstream.relay import Failure, Upstream
from kimi_server.engines.upstream.transport import (
    BrokenConnection,
    ConnectError,
    ConnectTimeout,
    PoolTimeout,
    ReadTimeout,
)
from kimi_server.engines.upstream.wire_pool import Pool, Timeouts, WireTransport, encode_body, request_head
from kimi_server.settings import UpstreamConfig
from tests.upstreams.fake import Conn, FakeUpstream, chunk

QUICK = Timeouts(connect=2.0, read=2.0, pool=2.0)
PROXY_VARS = [v for name in ("http", "https", "all", "no") for v in (f"{name}_proxy", f"{name.upper()}_PROXY")]

# An answer writes one response and says whether the connection stays open for another
# request; it gets the connection's number (from 1) and the request's (from 1, over all).
Answer = Callable[[asyncio.StreamWriter, int, int], Awaitable[bool]]


class Server:
    """A raw HTTP/1.1 server: reads each request whole, then lets ``answer`` write bytes."""

    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer
        self.tls = tls
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._writers: list[asyncio.StreamWriter] = []

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/v1/chat/completions"

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        # Handlers still reading end at the EOF their closing brings; ones left stalling by
        # design are cancelled.
        for writer in self._writers:
            writer.close()
        _done, stalled = await asyncio.wait(self._tasks, timeout=0.2)
        for task in stalled:
            task.cancel()
        await asyncio.gather(*stalled, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.append(task)
        self._writers.append(writer)
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                fields = dict(line.lower().split(b":", 1) for line in head.split(b"\r\n")[1:] if line)
                length = int(fields[b"content-length"])
                self.requests.append((head, await reader.readexactly(length)))
                if not await self.answer(writer, number, len(self.requests)):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()


def json_reply(body: bytes = b'{"ok":true}', *extra: str) -> bytes:
    head = ["HTTP/1.1 200 OK", "Content-Type: application/json", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def keep_alive(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
    writer.write(json_reply(json.dumps({"n": n}).encode()))
    await writer.drain()
    return True


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def pool_for(server: Server, max_connections: int = 4, **kw: Any) -> tuple[Pool, bytes]:
    url = server.url(kw.pop("scheme", "http"))
    return Pool(url, max_connections, **kw), request_head(url, {"Authorization": "Bearer k"})


async def fetch(pool: Pool, head: bytes, timeouts: Timeouts = QUICK) -> tuple[int, dict[str, str], bytes]:
    async with pool.post(head, encode_body({"q": 1}), timeouts) as resp:
        return resp.status, resp.headers, await resp.read()


def test_sequential_requests_share_one_connection() -> None:
    async def run() -> None:
        async with Server(keep_alive) as server:
            pool, head = pool_for(server)
            for n in (1, 2, 3):
                status, headers, body = await fetch(pool, head)
                assert (status, json.loads(body)) == (200, {"n": n})
                assert headers["content-type"] == "application/json"
            assert server.connections == 1
            assert pool.count == 1 and len(pool.idle) == 1
            sent_head, sent_body = server.requests[0]
            lines = sent_head.decode().split("\r\n")
            assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
            assert f"Host: 127.0.0.1:{server.port}" in lines
            assert "Authorization: Bearer k" in lines
            assert "Content-Type: application/json" in lines
            assert f"Content-Length: {len(sent_body)}" in lines
            assert sent_body == b'{"q":1}'
            pool.close()

    asyncio.run(run())


def test_an_idle_connection_the_server_dropped_is_retried_on_a_new_one() -> None:
    async def answer(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
        if conn == 1 and n == 2:
            return False  # closes without a byte of an answer, as a keep-alive race does
        return await keep_alive(writer, conn, n)

    async def run() -> None:
        async with Server(answer) as server:
            pool, head = pool_for(server, max_connections=1)
            assert json.loads((await fetch(pool, head))[2]) == {"n": 1}
            assert json.loads((await fetch(pool, head))[2]) == {"n": 3}  # request 2 went unanswered
            assert server.connections == 2
            assert pool.count == 1
            pool.close()

    asyncio.run(run())


def test_a_new_connection_closed_before_an_answer_fails() -> None:
    async def hang_up(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
        return False

    async def run() -> None:
        async with Server(hang_up) as server:
            pool, head = pool_for(server)
            with pytest.raises(BrokenConnection):
                await fetch(pool, head)
            assert server.connections == 1  # not retried: it was never used before
            assert pool.count == 0

    asyncio.run(run())


def test_a_connection_handed_to_a_waiter_then_closed_is_replaced() -> None:
    release = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
        if n == 1:
            writer.write(SSE_HEAD + b"5\r\nfirst\r\n")
            await writer.drain()
            await release.wait()
            writer.write(b"0\r\n\r\n")  # the end, and the connection's, though it said keep-alive
            return False
        return await keep_alive(writer, conn, n)

    async def run() -> None:
        async with Server(answer) as server:
            pool, head = pool_for(server, max_connections=1)
            async with pool.post(head, b"{}", QUICK) as first:
                second = asyncio.create_task(fetch(pool, head))
                await asyncio.sleep(0.05)
                release.set()
                assert await first.read() == b"first"
            assert json.loads((await second)[2]) == {"n": 2}
            assert server.connections == 2
            assert pool.count == 1
            pool.close()

    asyncio.run(run())


def test_an_idle_connection_past_its_expiry_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kimi_server.engines.upstream.wire_pool.KEEPALIVE_EXPIRY", 0.05)

    async def run() -> None:
        async with Server(keep_alive) as server:
            pool, head = pool_for(server)
            await fetch(pool, head)
            await asyncio.sleep(0.1)
            await fetch(pool, head)
            assert server.connections == 2
            assert pool.count == 1
            pool.close()

    asyncio.run(run())


def test_chunked_bodies_stream_as_they_arrive() -> None:
    async def answer(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
        writer.write(SSE_HEAD)
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def run() -> None:
        async with Server(answer) as server:
            pool, head = pool_for(server)
            for _ in range(2):
                async with pool.post(head, b"{}", QUICK) as resp:
                    assert resp.headers["transfer-encoding"] == "chunked"
                    parts = [part async for part in resp]
                assert parts == [b"data: 1\n\n", b"data: 2\n\n"]  # one at a time, not at the end
            assert server.connections == 1
            pool.close()

    asyncio.run(run())


def test_a_body_that_ends_at_eof_is_whole_and_not_kept() -> None:
    async def answer(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        writer.write(b"data: [DONE]\n\n")
        await writer.drain()
        return False

    async def run() -> None:
        async with Server(answer) as server:
            pool, head = pool_for(server)
            assert (await fetch(pool, head))[2] == b"data: [DONE]\n\n"
            await fetch(pool, head)
            assert server.connections == 2
            assert not pool.idle

    asyncio.run(run())


def test_a_truncated_body_is_a_transport_error() -> None:
    async def answer(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
        await writer.drain()
        return False

    async def run() -> None:
        async with Server(answer) as server:
            pool, head = pool_for(server)
            with pytest.raises(BrokenConnection):
                await fetch(pool, head)

    asyncio.run(run())


def test_leaving_before_the_body_ended_closes_the_connection() -> None:
    release = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
        writer.write(SSE_HEAD + b"5\r\nfirst\r\n")
        await writer.drain()
        await release.wait()
        writer.write(chunked(b"rest"))
        await writer.drain()
        return True

    async def run() -> None:
        async with Server(answer) as server:
            pool, head = pool_for(server)
            async with pool.post(head, b"{}", QUICK) as resp:
                assert await resp.__anext__() == b"first"
            assert pool.count == 0 and not pool.idle
            release.set()
            async with pool.post(head, b"{}", QUICK) as resp:
                assert await resp.read() == b"firstrest"
            assert server.connections == 2
            pool.close()

    asyncio.run(run())


def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nobody listens once it closes

    async def run() -> None:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        pool = Pool(url, 2)
        with pytest.raises(ConnectError):
            await fetch(pool, request_head(url, {}))
        assert pool.count == 0

    asyncio.run(run())


def test_a_connection_that_cannot_be_made_in_time_is_a_connect_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()  # accepts, then never answers the TLS handshake
        finally:
            writer.close()

    async def run() -> None:
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
        pool = Pool(url, 2, ssl.create_default_context())
        started = time.monotonic()
        with pytest.raises(ConnectTimeout):
            await fetch(pool, request_head(url, {}), Timeouts(connect=0.2, read=2.0, pool=2.0))
        assert time.monotonic() - started < 2
        assert pool.count == 0
        server.close()

    asyncio.run(run())


def test_silence_past_the_read_timeout_is_a_read_timeout() -> None:
    async def answer(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
        if n == 1:
            await asyncio.sleep(5)  # no head at all
            return False
        writer.write(SSE_HEAD + b"5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.sleep(5)  # then nothing more
        return False

    async def run() -> None:
        async with Server(answer) as server:
            pool, head = pool_for(server)
            quick = Timeouts(connect=2.0, read=0.3, pool=2.0)
            started = time.monotonic()
            with pytest.raises(ReadTimeout):
                await fetch(pool, head, quick)
            assert 0.25 < time.monotonic() - started < 2
            async with pool.post(head, b"{}", quick) as resp:
                assert await resp.__anext__() == b"first"
                await asyncio.sleep(0.5)  # the consumer's own time does not count
                started = time.monotonic()
                with pytest.raises(ReadTimeout):
                    await resp.__anext__()
                assert 0.25 < time.monotonic() - started < 2
            assert pool.count == 0

    asyncio.run(run())


def test_a_full_pool_makes_requests_wait_their_turn_up_to_the_pool_timeout() -> None:
    release = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
        if n == 1:
            writer.write(SSE_HEAD + b"5\r\nfirst\r\n")
            await writer.drain()
            await release.wait()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        return await keep_alive(writer, conn, n)

    async def run() -> None:
        async with Server(answer) as server:
            pool, head = pool_for(server, max_connections=1)
            async with pool.post(head, b"{}", QUICK) as first:
                with pytest.raises(PoolTimeout):
                    await fetch(pool, head, Timeouts(connect=2.0, read=2.0, pool=0.2))
                assert not pool.waiters
                waiting = [asyncio.create_task(fetch(pool, head)) for _ in range(2)]
                await asyncio.sleep(0.05)
                assert len(pool.waiters) == 2
                release.set()
                assert await first.read() == b"first"
            answers = [json.loads(body) for _, _, body in await asyncio.gather(*waiting)]
            assert answers == [{"n": 2}, {"n": 3}]  # first come, first served
            assert server.connections == 1  # handed over, never a second connection
            pool.close()

    asyncio.run(run())


def test_a_reader_that_falls_behind_pauses_the_socket() -> None:
    big = b"x" * (1024 * 1024)

    async def answer(writer: asyncio.StreamWriter, conn: int, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big)
        await writer.drain()
        return True

    async def run() -> None:
        async with Server(answer) as server:
            pool, head = pool_for(server)
            async with pool.post(head, b"{}", QUICK) as resp:
                await asyncio.sleep(0.2)
                assert resp._conn.paused
                assert resp._buffered < 2 * 256 * 1024
                assert await resp.read() == big
            assert len(pool.idle) == 1  # resumed and kept
            pool.close()

    asyncio.run(run())


def test_the_pool_starts_afresh_on_another_event_loop() -> None:
    async def elsewhere(pool: Pool, head: bytes) -> None:
        assert (await fetch(pool, head))[0] == 200
        pool.close()

    async def both() -> None:
        async with Server(keep_alive) as server:
            pool, head = pool_for(server)
            assert (await fetch(pool, head))[0] == 200
            first = pool.idle[0]
            # The same pool from a second loop in another thread, as a new asyncio.run would.
            await asyncio.to_thread(asyncio.run, elsewhere(pool, head))
            assert server.connections == 2
            await asyncio.sleep(0)
            assert first.closed  # closed by its own loop

    asyncio.run(both())


def self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_https_with_a_trusted_self_signed_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(cert, key)
    trusting = ssl.create_default_context(cafile=str(cert))

    async def run() -> None:
        async with Server(keep_alive, tls=served) as server:
            pool, head = pool_for(server, scheme="https", ssl_context=trusting)
            for n in (1, 2):
                assert json.loads((await fetch(pool, head))[2]) == {"n": n}
            assert server.connections == 1
            pool.close()
            # The default context (httpx's) does not trust it: the connection is refused.
            untrusting, head = pool_for(server, scheme="https")
            with pytest.raises(ConnectError):
                await fetch(untrusting, head)

    asyncio.run(run())


def test_the_head_is_built_once_and_refuses_what_it_cannot_send() -> None:
    head = request_head("https://api.example.com/v1/chat/completions", {"Authorization": "Bearer k"})
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: api.example.com\r\n")
    assert head.endswith(b"Authorization: Bearer k\r\n")
    assert b"Host: [::1]:8000\r\n" in request_head("http://[::1]:8000/v1/chat/completions", {})
    for url, headers in (
        ("http://user:pw@example.com/v1/chat/completions", {}),
        ("http://example.com/v1/chat/completions", {"Authorization": "Bearer k\r\nX-Evil: 1"}),
        ("http://example.com/v1/chat/completions", {"Authorization": "Bearer ключ"}),
    ):
        with pytest.raises(ValueError):  # noqa: PT011 (three causes, one contract)
            request_head(url, headers)


def clear_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in PROXY_VARS:
        monkeypatch.delenv(var, raising=False)


def test_a_proxied_upstream_keeps_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    def transport(url: str, **fields: Any) -> str:
        return Upstream(UpstreamConfig(base_url=url, **fields)).transport.name

    clear_proxies(monkeypatch)
    assert transport("http://gpu.internal/v1") == "wire"
    assert transport("http://gpu.internal/v1", transport="httpx") == "httpx"  # asked for
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    assert transport("http://gpu.internal/v1") == "httpx"
    assert transport("https://gpu.internal/v1") == "wire"  # no HTTPS_PROXY
    monkeypatch.setenv("NO_PROXY", "gpu.internal")
    assert transport("http://gpu.internal/v1") == "wire"
    assert transport("http://other.internal/v1") == "httpx"


def sse(body: dict[str, Any], c: Conn) -> Awaitable[None]:
    async def go() -> None:
        await c.head()
        await c.event(chunk({"content": "Hi"}))
        await c.event(chunk({}, finish="stop"))
        await c.done()

    return go()


async def relay(up: Upstream) -> list[EngineEvent]:
    normaliser = Normaliser(report_cache=False, separate_writes=False)
    deadline = time.monotonic() + 10
    return [e async for e in up.attempt({"model": "m"}, normaliser, piece_limit=100, deadline=deadline)]


@pytest.mark.parametrize("path", ["wire", "httpx"])
def test_an_attempt_relays_on_either_path(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clear_proxies(monkeypatch)
    with FakeUpstream(sse) as fake:

        async def run() -> list[EngineEvent]:
            up = Upstream(UpstreamConfig(base_url=fake.url, transport="auto" if path == "wire" else "httpx"))
            assert up.transport.name == path
            try:
                return await relay(up)
            finally:
                await up.close()

        events = asyncio.run(run())
    assert isinstance(events[0], ContentDelta) and events[0].text == "Hi"
    assert isinstance(events[-1], Finish) and events[-1].reason == "stop"


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        (ConnectTimeout(), GatewayTimeoutError, "The model's engine did not connect in time."),
        (PoolTimeout(), GatewayTimeoutError, "The model's engine did not connect in time."),
        (ReadTimeout(), GatewayTimeoutError, "The model's engine did not respond in time."),
        (ConnectError(), UpstreamUnavailableError, "The model's engine is unreachable."),
        (BrokenConnection(), UpstreamStreamError, "The model's engine dropped the connection."),
    ],
)
def test_transport_errors_become_failures(
    error: Exception, kind: type, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def run() -> None:
        up = Upstream(UpstreamConfig(base_url="http://127.0.0.1:9/v1"))

        async def broken(*_: object) -> Any:
            raise error

        assert isinstance(up.transport, WireTransport)
        monkeypatch.setattr(up.transport.pool, "acquire", broken)
        with pytest.raises(Failure) as caught:
            await relay(up)
        assert type(caught.value.error) is kind
        assert caught.value.error.message == message

    asyncio.run(run())


async def silent(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await asyncio.sleep(5)


async def cut_short(body: dict[str, Any], c: Conn) -> None:
    await c.head(200, "text/event-stream", Transfer_Encoding="chunked")
    await c.raw(b"40\r\ndata: ")  # a chunk promised, then the connection reset
    c.reset()


@pytest.mark.parametrize("path", ["wire", "httpx"])
@pytest.mark.parametrize(
    ("handler", "kind"),
    [(None, UpstreamUnavailableError), (silent, GatewayTimeoutError), (cut_short, UpstreamStreamError)],
    ids=["refused", "silent", "reset"],
)
def test_either_transport_fails_the_same_way(
    path: str, handler: Any, kind: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One error tree above the seam: the relay cannot tell which client met the fault."""
    clear_proxies(monkeypatch)

    async def run(url: str) -> Failure:
        cfg = UpstreamConfig(
            base_url=url, read_timeout=0.5, connect_timeout=1.0, transport="auto" if path == "wire" else "httpx"
        )
        up = Upstream(cfg)
        try:
            with pytest.raises(Failure) as caught:
                await relay(up)
            return caught.value
        finally:
            await up.close()

    if handler is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"  # bound, never listening
            failure = asyncio.run(run(url))
    else:
        with FakeUpstream(handler) as fake:
            failure = asyncio.run(run(fake.url))
    assert type(failure.error) is kind
