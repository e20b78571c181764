"""Connection-level protection through the real server process (`kimi-server serve` with the
scripted engine): keys before bodies on every route, slow bodies, connection caps sized from
the descriptor limit, and accept errors logged once per interval."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import OTHER_KEY, TEST_KEY, TEST_MODEL, _free_port, stop_server

pytestmark = pytest.mark.e2e

ADMIN_KEY = "sk-admin-edge"
SCRIPTED = {"KIMI_TEST_ENGINE": "scripted", "KIMI_ADMIN_KEY": ADMIN_KEY}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


CHAT = {"model": "kimi-k3", "messages": [{"role": "user", "content": "Hi"}]}


class Server:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.url = f"http://127.0.0.1:{port}"

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def connect(self, source: str = "127.0.0.1") -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", self.port), source_address=(source, 0))
        conn.settimeout(10)  # a bound for the test only: every answer here comes at once
        return conn


def launch(tmp: Path, env: dict[str, str], nofile: int | None = None) -> Server:
    """The real server as `kimi-server serve` runs it, optionally under a descriptor limit
    (soft and hard, so that it cannot raise it)."""
    tmp.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = tmp / "server.log"

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    full_env = {**os.environ, "KIMI_DATA_DIR": str(tmp / "data"), **SCRIPTED, **env}
    cmd = [
        sys.executable,
        "-m",
        "kimi_server.cli",
        "serve",
        "--port",
        str(port),
        "--model",
        TEST_MODEL,
        "--api-key",
        TEST_KEY,
        "--api-key",
        OTHER_KEY,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, preexec_fn=limit)
    server = Server(proc, port, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not become healthy in time")


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(env: dict[str, str] | None = None, nofile: int | None = None) -> Server:
        server = launch(tmp_path / str(len(started)), env or {}, nofile)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            stop_server(server.proc)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server with its default limits (and an admin key)."""
    started = launch(tmp_path_factory.mktemp("edge"), {})
    try:
        yield started
    finally:
        stop_server(started.proc)


def raise_own_descriptor_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < needed:
        pytest.skip(f"the test client needs {needed} descriptors")


def head(method: str, path: str, length: int, key: str | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", "Content-Type: application/json", f"Content-Length: {length}"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    got = b""
    try:
        while chunk := conn.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass  # closed with our unsent body pending: what came before the reset is the answer
    return got


def split(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    top, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


# -- keys before bodies -----------------------------------------------------------------------


def test_keyless_dribbled_bodies_are_refused_at_once_and_normal_requests_are_served(server: Server) -> None:
    raise_own_descriptor_limit(2_200)
    base = server.descriptors()
    dribblers = []
    for i in range(2_000):
        conn = server.connect()
        path = "/admin/v1/keys" if i % 2 else "/v1/chat/completions"
        conn.sendall(head("POST", path, 100_000) + b'{"name": "')  # and the rest never comes
        dribblers.append(conn)
    try:
        normal = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=bearer(TEST_KEY), timeout=30)
        assert normal.status_code == 200
        for conn in dribblers:
            status, headers, body = split(answer(conn))
            assert status == 401 and headers["connection"] == "close"
            assert json.loads(body)["error"]["type"] == "authentication_error"
        # Every dribbler is still open on this side; the server holds none of them.
        assert server.descriptors() < base + 50
    finally:
        for conn in dribblers:
            conn.close()


def test_an_8mb_body_without_the_admin_key_gets_401_before_it_is_sent(server: Server) -> None:
    for key, status in ((None, 401), (TEST_KEY, 403), ("sk-wrong", 403)):
        with server.connect() as conn:
            conn.sendall(head("POST", "/admin/v1/keys", 8_000_000, key))  # no byte of the body
            got, headers, body = split(answer(conn))
            assert got == status and headers["connection"] == "close"
            assert json.loads(body)["error"]["type"] in ("authentication_error", "permission_error")
    created = httpx.post(f"{server.url}/admin/v1/keys", json={"name": "edge"}, headers=bearer(ADMIN_KEY))
    assert created.status_code == 200 and created.json()["secret"]


def test_a_body_to_health_is_never_read(server: Server) -> None:
    with server.connect() as conn:
        conn.sendall(head("POST", "/health", 1_000_000))
        status, headers, _ = split(answer(conn))
        assert status == 405 and headers["connection"] == "close"
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}


# -- slow bodies --------------------------------------------------------------------------------


def test_a_dribbled_body_with_a_valid_key_gets_408_and_the_connection_closes(serving: Callable[..., Server]) -> None:
    pace = {"KIMI_HTTP_BODY_TIMEOUT": "2", "KIMI_HTTP_BODY_MIN_RATE": "100", "KIMI_HTTP_BODY_RATE_GRACE": "0.5"}
    server = serving(pace)
    for send_more in (False, True):
        with server.connect() as conn:
            conn.sendall(head("POST", "/v1/chat/completions", 1_000, TEST_KEY) + b'{"model"')
            if send_more:  # a byte now and then, far under 100 bytes/s
                for _ in range(3):
                    time.sleep(0.2)
                    conn.sendall(b" ")
            status, headers, body = split(answer(conn))
            assert status == 408 and headers["connection"] == "close"
            assert json.loads(body)["error"]["code"] == "request_timeout"
    fast = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=bearer(TEST_KEY))
    assert fast.status_code == 200
    stop_server(server.proc)
    assert '"status":408' in server.log.read_text()  # the request log says what the client got


# -- connection caps ----------------------------------------------------------------------------


def test_connections_past_the_per_address_and_total_caps_get_503(serving: Callable[..., Server]) -> None:
    server = serving({"KIMI_HTTP_MAX_CONNECTIONS_PER_IP": "3", "KIMI_HTTP_MAX_CONNECTIONS": "5"})
    held = [server.connect("127.0.0.1") for _ in range(3)]
    try:
        refused = server.connect("127.0.0.1")  # answered at once, whatever it would send
        status, headers, body = split(answer(refused))
        assert status == 503 and headers["connection"] == "close" and int(headers["retry-after"]) >= 1
        error = json.loads(body)["error"]
        assert error["code"] == "too_many_connections" and "from one address" in error["message"]
        refused.close()
        # A client that sends its request first reads the same answer.
        r = httpx.get(f"{server.url}/health", timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_connections"
        # Another address still gets in, up to the total.
        held += [server.connect("127.0.0.2") for _ in range(2)]
        other = server.connect("127.0.0.3")
        status, _, body = split(answer(other))
        assert status == 503 and "in all" in json.loads(body)["error"]["message"]
        other.close()
    finally:
        for conn in held:
            conn.close()
    # Places free up as connections close.
    for _ in range(100):
        try:
            if httpx.get(f"{server.url}/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    else:
        raise AssertionError("the server never accepted a connection again")


def flood(server: Server, count: int) -> list[socket.socket]:
    """Starts ``count`` connections at once without waiting for any (the server accepts them
    as its listen backlog lets it)."""
    conns = []
    for _ in range(count):
        conn = socket.socket()
        conn.setblocking(False)
        conn.connect_ex(("127.0.0.1", server.port))
        conns.append(conn)
    return conns


def test_default_caps_follow_the_descriptor_limit_so_it_is_never_reached(serving: Callable[..., Server]) -> None:
    server = serving({"KIMI_HTTP_HEADER_TIMEOUT": "60"}, nofile=256)
    conns = flood(server, 600)
    try:
        time.sleep(2)  # the first connections hold their places; the rest are turned away
        with server.connect() as late:
            status, _, body = split(answer(late))
            assert status == 503 and json.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for conn in conns:
            conn.close()
    stop_server(server.proc)
    log = server.log.read_text()
    assert "turned away" in log
    assert "Too many open files" not in log and "accept() failed" not in log and "out of system resource" not in log


def test_accept_errors_are_logged_once_per_interval(serving: Callable[..., Server]) -> None:
    server = serving({"KIMI_HTTP_HEADER_TIMEOUT": "60"})
    # The descriptor limit drops below the caps the server chose at start: it runs out.
    resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (64, 64))
    conns = flood(server, 300)
    try:
        time.sleep(2.5)  # asyncio retries accept() every second
    finally:
        for conn in conns:
            conn.close()
    stop_server(server.proc)
    log = server.log.read_text()
    assert 1 <= log.count("accept() failed") <= 2
    assert "out of system resource" not in log and "Traceback" not in log
