"""``serve --workers 2`` through a real server: two processes on one port share a stored key's
requests-per-minute limit, write one ledger row per answered request, and ``/metrics`` counts
every worker's requests whichever worker answers the scrape.

Requests are sent over keep-alive connections known to belong to different workers (found from
/proc: which process holds the server side of each connection), alternating between them, so
a limit counted per worker would admit twice as many.
"""

from __future__ import annotations

import http.client
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_server, stop_server
from tests.upstreams.fake import Conn, FakeUpstream, chunk

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads connection owners from /proc")

ADMIN = "sk-admin-workers-test-0123456789"
RPM = 2  # one request back every 30 s: the test ends long before
BODY = json.dumps({"model": "kimi-k3", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20})


async def answer(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await c.event(chunk({"content": "Hello."}))
    await c.event(chunk({}, "stop"))
    await c.done()


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry))
    return out


def owner(server_port: int, client_port: int, pids: list[int]) -> int | None:
    """The worker holding the server side of the connection from ``client_port``."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == client_port:
            inode = fields[9]
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


def one_connection_per_worker(port: int, pids: list[int]) -> list[http.client.HTTPConnection]:
    """Opens connections until two different workers hold one each (the kernel picks)."""
    by_worker: dict[int, http.client.HTTPConnection] = {}
    spare = []
    for _ in range(200):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.connect()
        assert conn.sock is not None
        pid = None
        for _ in range(50):  # the worker accepts it a moment after connect() returns
            pid = owner(port, conn.sock.getsockname()[1], pids)
            if pid is not None:
                break
        if pid is not None and pid not in by_worker:
            by_worker[pid] = conn
            if len(by_worker) == 2:
                break
        else:
            spare.append(conn)
    for conn in spare:
        conn.close()
    assert len(by_worker) == 2, "could not reach both workers"
    return list(by_worker.values())


def post(conn: http.client.HTTPConnection, path: str, body: str | None, key: str) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    conn.request("POST" if body is not None else "GET", path, body=body, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read()


@pytest.mark.e2e
def test_two_workers_share_limits_ledger_and_metrics(tmp_path: Path) -> None:
    env = {"KIMI_ADMIN_KEY": ADMIN, "KIMI_LOG_LEVEL": "warning"}
    made = subprocess.run(
        [sys.executable, "-m", "kimi_server.cli", "keys", "create", "--name", "shared", "--rpm", str(RPM)],
        env={**os.environ, **env, "KIMI_DATA_DIR": str(tmp_path / "data")},
        capture_output=True,
        text=True,
        check=True,
    )
    key = made.stdout.strip().splitlines()[-1]
    with FakeUpstream(answer) as up:
        proc, server = start_server(
            tmp_path, "--upstream", up.url, "--model", "no-such-model", "--workers", "2", env=env
        )
        try:
            port = int(server.base_url.split(":")[2].split("/")[0])
            workers = children(proc.pid)
            conns = one_connection_per_worker(port, workers)
            statuses = [post(conns[n % 2], "/v1/chat/completions", BODY, key)[0] for n in range(3 * RPM)]
            status, text = post(conns[0], "/metrics", None, ADMIN)
            for conn in conns:
                conn.close()
        finally:
            stop_server(proc)
    assert statuses.count(200) == RPM and statuses.count(429) == 2 * RPM, statuses
    assert statuses[:RPM] == [200] * RPM  # both workers admitted until the shared bucket ran dry
    rows = sqlite3.connect(tmp_path / "data" / "kimi.db").execute("SELECT COUNT(*) FROM usage").fetchone()[0]
    assert rows == RPM  # one row per answered request, none for the refused
    assert status == 200
    counted = {
        line.split("status=")[1][1:4]: float(line.rsplit(" ", 1)[1])
        for line in text.decode().splitlines()
        if line.startswith("kimi_requests_total{") and "chat.completions" in line
    }
    assert counted == {"200": RPM, "429": 2 * RPM}  # both workers' requests, in one scrape


def test_workers_above_one_refused_with_the_embedded_engine(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kimi_server.cli", "serve", "--model", "smollm2-135m", "--workers", "2"],
        env={**os.environ, "KIMI_DATA_DIR": str(tmp_path / "data"), "KIMI_AUTO_PULL": "false"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "--workers above 1 needs every model relayed to upstreams" in done.stderr


def test_default_workers_one_per_core_for_upstreams_one_for_the_embedded_engine(tmp_path: Path) -> None:
    from kimi_server.bootstrap import build_engines
    from kimi_server.http.workers import usable_cores, worker_count
    from kimi_server.settings import Settings

    relayed = Settings(upstream="http://127.0.0.1:9/v1", data_dir=tmp_path)
    assert worker_count(relayed, build_engines(relayed)) == usable_cores()
    assert worker_count(relayed.model_copy(update={"workers": 3}), build_engines(relayed)) == 3
    scripted = Settings(data_dir=tmp_path)
    assert worker_count(scripted, build_engines(scripted, {"KIMI_TEST_ENGINE": "scripted"})) == 1


def test_a_workers_connections_send_small_writes_at_once() -> None:
    """Each worker's own listening socket names TCP, so asyncio switches Nagle's algorithm off
    on the connections it accepts: a response written in parts (head, body, a stream's
    events) is not held back waiting for the client's delayed ACK."""
    import asyncio
    import socket

    from kimi_server.http.workers import listen_in_worker

    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                seen.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        listener = listen_in_worker("127.0.0.1", 0, 8)
        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(accepted_nodelay()) == 1
