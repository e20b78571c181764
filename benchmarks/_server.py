"""Starts a real kimi-server for a benchmark and stops it afterwards."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

KEY = "sk-bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(model: str, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """Yields the base URL (``.../v1``) of a server on a free loopback port, once it is healthy."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "kimi_server.cli", "serve", "--port", str(port)]
        cmd += ["--model", model, "--api-key", KEY, *extra]
        full_env = {**os.environ, "KIMI_DATA_DIR": tmp, **(env or {})}
        log = Path(tmp) / "server.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, env=full_env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_healthy(proc, port, log)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_healthy(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited during start:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not become healthy within 600 s")
