"""cpu_poll auto on the real server: beside work that takes every core, llama.cpp is given one
thread, asleep while it waits, and still answers; /metrics shows what it runs on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import start_server, stop_server

pytestmark = pytest.mark.e2e

BUSY_LOOP = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass\n"


def gauges(origin: str) -> dict[str, float]:
    text = httpx.get(f"{origin}/metrics", timeout=30).text
    found = re.findall(r'^(kimi_engine_cpu_\w+)\{engine="embedded:[^"]*"\} (\S+)$', text, re.MULTILINE)
    return {name: float(value) for name, value in found}


def test_beside_work_on_every_core_the_engine_runs_one_sleeping_thread(tmp_path: Path) -> None:
    proc, server = start_server(tmp_path, env={"KIMI_THREADS": "2", "KIMI_METRICS_PUBLIC": "true"})
    origin = server.base_url.removesuffix("/v1")
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        first = gauges(origin)
        assert first["kimi_engine_cpu_threads"] in (1, 2)
        assert first["kimi_engine_cpu_spinning"] in (0, 1)
        hogs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(os.cpu_count() or 2)]
        seen = first
        for _ in range(150):  # a safety bound, not a timing: the governor reads every 0.2 s
            seen = gauges(origin)
            if seen["kimi_engine_cpu_threads"] == 1 and seen["kimi_engine_cpu_spinning"] == 0:
                break
            time.sleep(0.1)
        assert (seen["kimi_engine_cpu_threads"], seen["kimi_engine_cpu_spinning"]) == (1, 0), seen
        answer = openai.OpenAI(base_url=server.base_url, api_key=server.key, max_retries=0).chat.completions.create(
            model="kimi-k3.1-pro", messages=[{"role": "user", "content": "Say hi."}], max_tokens=24
        )
        assert answer.choices[0].message.content or answer.choices[0].finish_reason == "length"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        stop_server(proc)
