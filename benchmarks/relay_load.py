"""The load side of ``benchmarks/relay.py``: a raw keep-alive HTTP/1.1 client (so the client is
never what limits a relay) and the processes under test: start, pin to cores, CPU time, memory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
from typing import Any

import httpx

BODY: dict[str, Any] = {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
STREAM_BODY = {**BODY, "max_tokens": 1000, "stream": True}
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- the load generator: one raw keep-alive connection per worker -----------------------------------


class Conn:
    def __init__(self, port: int, path: str, key: str) -> None:
        self.port = port
        self.head = (
            f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {key}\r\n"
        ).encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> tuple[int, bytes]:
        for attempt in range(2):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                return await self._exchange(body)
            except (asyncio.IncompleteReadError, ConnectionError):
                self.close()  # the server closed an idle connection: one fresh try
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def _exchange(self, body: bytes) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        self.writer.write(self.head + b"content-length: %d\r\n\r\n" % len(body) + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                parts.append((await self.reader.readexactly(size + 2))[:-2])
            data = b"".join(parts)
        else:
            at = lower.find(b"content-length:")
            data = await self.reader.readexactly(int(lower[at + 15 : lower.index(b"\r\n", at)]))
        if b"connection: close" in lower:
            self.close()
        return status, data

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def _check(status: int, data: bytes) -> bytes:
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {data[:300]!r}")
    return data


async def sequential(conn: Conn, body: bytes) -> float:
    t = time.perf_counter()
    _check(*await conn.post(body))
    return time.perf_counter() - t


async def rps(port: int, path: str, key: str, total: int, concurrency: int) -> float:
    body = json.dumps(BODY).encode()
    conns = [Conn(port, path, key) for _ in range(concurrency)]
    queue = iter(range(total))

    async def worker(conn: Conn) -> None:
        for _ in queue:
            _check(*await conn.post(body))

    # Connections are opened before the clock starts: a request/s figure, not a connect rate.
    await asyncio.gather(*(c.post(body) for c in conns))
    t = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - t
    for c in conns:
        c.close()
    return total / elapsed


async def events(port: int, path: str, key: str, streams: int, concurrency: int) -> tuple[float, int]:
    body = json.dumps(STREAM_BODY).encode()
    conns = [Conn(port, path, key) for _ in range(concurrency)]
    queue = iter(range(streams))
    count = 0

    async def worker(conn: Conn) -> None:
        nonlocal count
        for _ in queue:
            data = _check(*await conn.post(body))
            count += data.count(b"data: ") - data.count(b"data: [DONE]")

    t = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - t
    for c in conns:
        c.close()
    return count / elapsed, count


# -- processes: start, pin, CPU time ----------------------------------------------------------------


def tree_cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants (uvicorn's workers)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += times.get(p, 0.0)
        todo += [c for c, parent in parents.items() if parent == p]
    return total


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def pin(pid: int, cores: set[int] | None) -> None:
    if cores and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, cores)


def start(
    args: list[str], port: int, cores: set[int] | None, env: dict[str, str] | None = None, health: str = "/"
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        args, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    pin(proc.pid, cores)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args} exited during start")
        try:
            httpx.get(f"http://127.0.0.1:{port}{health}", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{args} did not start")
