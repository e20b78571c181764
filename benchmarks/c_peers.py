"""nginx as the fake upstream and wrk as the load generator, where both are installed.

Both are C: per request they cost a few tens of microseconds where the Python fake upstream and
client cost several hundred. On a machine whose every core also runs the relay (the ``--workers``
scaling run), that keeps the cores for the relay, so what is measured is how it scales rather
than what the peers take away from it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

import httpx


def available() -> bool:
    return shutil.which("nginx") is not None and shutil.which("wrk") is not None


class NginxUpstream:
    """``return 200`` with one prebuilt SSE answer for every request: nginx never runs any code
    per request beyond its own parser, and discards the request body."""

    def __init__(self, port: int, answer: bytes) -> None:
        self.port = port
        self._dir = tempfile.mkdtemp(prefix="relay-nginx-")
        text = answer.decode()
        if "'" in text or "$" in text or "\\" in text:
            raise ValueError("the answer must not need quoting in nginx's configuration")
        temp = "".join(
            f"{kind}_temp_path {self._dir}/{kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        conf = f"""worker_processes 1;
pid {self._dir}/nginx.pid;
error_log {self._dir}/error.log crit;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  {temp}
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      default_type text/event-stream;
      return 200 '{text}';
    }}
  }}
}}
"""
        path = os.path.join(self._dir, "nginx.conf")
        with open(path, "w") as f:
            f.write(conf)
        self.proc = subprocess.Popen(
            ["nginx", "-c", path, "-p", self._dir, "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={}, timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError("nginx did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)


@dataclass
class WrkResult:
    requests: int
    seconds: float
    errors: int  # non-2xx answers and socket errors

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def wrk(url: str, key: str, body: str, connections: int, seconds: float) -> WrkResult:
    """One wrk thread holding ``connections`` keep-alive connections, POSTing ``body``."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(
            'wrk.method = "POST"\n'
            f"wrk.body = [[{body}]]\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
            f'wrk.headers["Authorization"] = "Bearer {key}"\n'
        )
    try:
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", script.name, url],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    finally:
        os.unlink(script.name)
    done = re.search(r"(\d+) requests in ([\d.]+)(m?s)", out)
    if done is None:
        raise RuntimeError(f"unexpected wrk output: {out}")
    secs = float(done.group(2)) / (1000 if done.group(3) == "ms" else 1)
    errors = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if socket_errors:
        errors += sum(int(n) for n in socket_errors.groups())
    return WrkResult(int(done.group(1)), secs, errors)
