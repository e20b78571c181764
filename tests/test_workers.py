"""``serve --workers 2`` through a real server: two processes on one port share a stored key's
requests-per-minute limit and budget, the counts of failed authentications and the console's
sessions, write one ledger row per answered request, and ``/metrics`` and the console's Live
page count every worker's requests whichever worker answers. The parent gives a worker
``worker_start_timeout`` to start and says why it replaced one.

Requests are sent over keep-alive connections known to belong to different workers (found from
/proc: which process holds the server side of each connection), alternating between them, so
a limit counted per worker would admit twice as many.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import _free_port, start_server, stop_server
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


def summed(metrics: str, name: str, label: str) -> dict[str, int]:
    """A counter's samples in a ``/metrics`` text, by one label's value."""
    out: dict[str, int] = {}
    for line in metrics.splitlines():
        if line.startswith(name + "{"):
            value = re.search(label + r'="([^"]*)"', line)
            assert value is not None, line
            out[value.group(1)] = out.get(value.group(1), 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def get(conn: http.client.HTTPConnection, path: str, cookie: str) -> str:
    conn.request("GET", path, headers={"Cookie": cookie})
    resp = conn.getresponse()
    text = resp.read().decode()
    assert resp.status == 200, (resp.status, text[:300])
    return text


def console_session(conn: http.client.HTTPConnection) -> str:
    """Signs in with the admin key on this connection's worker; the session's cookie."""
    conn.request("GET", "/console/login")
    resp = conn.getresponse()
    form = re.search(r'name="csrf" value="([^"]+)"', resp.read().decode())
    login = resp.getheader("set-cookie", "").split(";")[0]
    assert form is not None and login
    body = f"csrf={form.group(1)}&key={ADMIN}"
    headers = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": login}
    conn.request("POST", "/console/login", body=body, headers=headers)
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 303, resp.status
    return next(c for c in resp.headers.get_all("set-cookie") or [] if c.startswith("kimi_console=")).split(";")[0]


@pytest.mark.e2e
def test_two_workers_share_limits_ledger_and_metrics(tmp_path: Path) -> None:
    failures = 4  # the failure that reaches this count is answered 429, and the address is locked
    env = {
        "KIMI_ADMIN_KEY": ADMIN,
        "KIMI_LOG_LEVEL": "warning",
        "KIMI_AUTH_MAX_FAILURES": str(failures),
        "KIMI_AUTH_MAX_DELAY": "0.05",
    }
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
            # Signed in on one worker, the session holds on the other; each shows both workers' refusals.
            cookie = console_session(conns[0])
            panels = [get(conn, "/console/live/panel", cookie) for conn in conns]
            # Wrong keys alternate between the workers: the lock comes after the failures of both.
            guesses = [post(conns[n % 2], "/v1/models", None, "sk-kimi-wrong-" + "x" * 32)[0] for n in range(8)]
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
    assert summed(text.decode(), "kimi_rejections_total", "reason") == {"requests": 2 * RPM}
    for panel in panels:
        assert f'data-reason="requests" data-count="{2 * RPM}"' in panel
    # Counted per worker, the lock would come after twice as many.
    assert guesses[: failures - 1] == [401] * (failures - 1) and set(guesses[failures - 1 :]) == {429}, guesses


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


SUPERVISE = """
import sys
import uvicorn
from kimi_server.http.supervisor import Supervisor

port, start_timeout = int(sys.argv[1]), float(sys.argv[2])
config = uvicorn.Config("tests.slow_start_app:app", factory=True, host="127.0.0.1", port=port, workers=1)
Supervisor(config, [config.bind_socket()], start_timeout=start_timeout, health_timeout=5).run()
"""


def supervise(port: int, start_timeout: float, slow_start: float, log: Path) -> subprocess.Popen[bytes]:
    """The parent of one worker whose app takes ``slow_start`` seconds to build."""
    env = {**os.environ, "SLOW_START_SECONDS": str(slow_start), "PYTHONPATH": os.getcwd()}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", SUPERVISE, str(port), str(start_timeout)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def until(what: Any, message: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 90
    while not what():
        assert proc.poll() is None, "the parent exited"
        assert time.monotonic() < deadline, message
        time.sleep(0.2)


def served_by(log: Path) -> list[int]:
    """The workers' processes, in the order they were started (uvicorn names each one)."""
    return [int(pid) for pid in re.findall(r"Started server process \[(\d+)\]", log.read_text())]


@pytest.mark.e2e
def test_a_worker_gets_worker_start_timeout_to_start_and_each_replacement_says_why(tmp_path: Path) -> None:
    # Given too little time, a worker still building its app is replaced, and the log says why.
    log = tmp_path / "short.log"
    proc = supervise(_free_port(), start_timeout=1, slow_start=4, log=log)
    try:
        until(lambda: "worker_start_timeout" in log.read_text(), "no replacement was logged", proc)
    finally:
        stop_server(proc)
    said = log.read_text()
    assert re.search(r"worker \[\d+\] replaced: it did not finish starting within 1 s \(worker_start_timeout\)", said)

    # Given the time, the same slow worker starts and serves; killed, it is replaced, and the
    # log names the signal.
    log = tmp_path / "long.log"
    port = _free_port()
    proc = supervise(port, start_timeout=60, slow_start=2, log=log)
    try:
        until(lambda: answers(port), "the worker never served", proc)
        (worker,) = served_by(log)
        os.kill(worker, signal.SIGKILL)
        until(lambda: len(served_by(log)) == 2 and answers(port), "no worker replaced it", proc)
    finally:
        stop_server(proc)
    said = log.read_text()
    assert "did not finish starting" not in said, said
    assert f"worker [{worker}] replaced: it was killed by SIGKILL" in said, said


USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
PRICE = {"kimi-k3": {"input": "100", "output": "100"}}  # USD per 1M tokens: 15 tokens = $0.0015
COST = 15 * 100 / 1_000_000  # one answered request, in USD
RACERS = 200


async def answer_with_usage(body: dict[str, Any], c: Conn) -> None:
    await c.head()
    await asyncio.sleep(0.05)  # long enough for the race to find holds in flight
    await c.event(chunk({"content": "Hello."}))
    await c.event({**chunk({}, "stop"), "usage": USAGE})
    await c.done()


async def race(base: str, key: str) -> list[tuple[int, str]]:
    """Every racer asks until it is answered or told the budget is spent, waiting out each
    refusal that names a hold (as the openai SDK would, from Retry-After)."""
    outcomes: list[tuple[int, str]] = []
    limits = httpx.Limits(max_connections=RACERS)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:

        async def racer() -> None:
            for _ in range(60):
                r = await client.post(
                    "/v1/chat/completions",
                    content=BODY,
                    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                )
                kind = r.json()["error"]["type"] if r.status_code != 200 else ""
                outcomes.append((r.status_code, kind))
                if kind != "budget_held":
                    return
                await asyncio.sleep(float(r.headers["retry-after"]))

        await asyncio.gather(*(racer() for _ in range(RACERS)))
    return outcomes


@pytest.mark.e2e
def test_a_budget_race_on_two_workers_spends_the_budget_and_never_past_it(tmp_path: Path) -> None:
    """Holds are what a request can cost (its max_tokens here), shared by both workers: a
    200-way race spends most of the budget, refusals while holds fill it say so and are waited
    out, and the spend never passes the budget by more than one request."""
    budget = 40 * COST
    env = {
        "KIMI_ADMIN_KEY": ADMIN,
        "KIMI_LOG_LEVEL": "warning",
        "KIMI_PRICES": json.dumps(PRICE),
        "KIMI_QUEUE_MAX": "1024",
        "KIMI_QUEUE_MAX_PER_KEY": "1024",
    }
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "kimi_server.cli",
            "keys",
            "create",
            "--name",
            "racer",
            "--budget",
            f"{budget:.6f}",
            "--models",
            "kimi-k3",
        ],
        env={**os.environ, **env, "KIMI_DATA_DIR": str(tmp_path / "data")},
        capture_output=True,
        text=True,
        check=True,
    )
    key = made.stdout.strip().splitlines()[-1]
    with FakeUpstream(answer_with_usage) as up:
        proc, server = start_server(
            tmp_path, "--upstream", up.url, "--model", "no-such-model", "--workers", "2", env=env
        )
        try:
            outcomes = asyncio.run(race(server.base_url.removesuffix("/v1"), key))
        finally:
            stop_server(proc)
    answered = outcomes.count((200, ""))
    held = outcomes.count((429, "budget_held"))
    spent_refusals = outcomes.count((429, "insufficient_quota"))
    assert answered + held + spent_refusals == len(outcomes), sorted(set(outcomes))
    assert held > 0 and spent_refusals > 0
    with sqlite3.connect(tmp_path / "data" / "kimi.db") as db:
        spent = db.execute("SELECT COALESCE(SUM(cost_nanos), 0) FROM usage").fetchone()[0] / 10**9
    assert spent == pytest.approx(answered * COST)
    assert 0.8 * budget <= spent <= budget + COST, (spent, budget)
