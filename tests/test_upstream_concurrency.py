"""An upstream is admitted as many requests at once as it serves (``max_concurrency``), not
the embedded engine's ``parallel`` slots: a GPU cluster behind kimi-server must not be held to
what one CPU llama.cpp can run. Beyond its share, requests wait in the fair queue."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.upstreams.fake import Conn, FakeUpstream, chunk
from tests.upstreams.front import config, front

REQUESTS = 4


class Gauge:
    """Counts requests in flight at the upstream and remembers the most seen at once."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self.lock = threading.Lock()

    async def handler(self, body: dict[str, Any], c: Conn) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            # Long enough that requests the queue lets through at once overlap here.
            for _ in range(50):
                await asyncio.sleep(0.02)
                if self.peak >= REQUESTS:
                    break
            await c.head()
            await c.event(chunk({"content": "Hello."}))
            await c.event(chunk({}, "stop"))
            await c.done()
        finally:
            with self.lock:
                self.now -= 1


def ask_at_once(tmp: Path, gauge: Gauge, **upstream: Any) -> list[str]:
    with FakeUpstream(gauge.handler) as up, front(tmp, config(up.url, **upstream), parallel=1) as f:

        def ask(_: int) -> str:
            resp = f.sdk.chat.completions.create(model="kimi-k3.1-pro", messages=[{"role": "user", "content": "Hi"}])
            return resp.choices[0].message.content or ""

        with ThreadPoolExecutor(REQUESTS) as pool:
            return list(pool.map(ask, range(REQUESTS)))


def test_an_upstream_is_not_held_to_the_embedded_engines_slots(tmp_path: Path) -> None:
    gauge = Gauge()
    answers = ask_at_once(tmp_path, gauge)  # parallel = 1; the upstream's default share is 64
    assert answers == ["Hello."] * REQUESTS
    assert gauge.peak == REQUESTS


def test_requests_beyond_an_upstreams_share_wait_their_turn(tmp_path: Path) -> None:
    gauge = Gauge()
    answers = ask_at_once(tmp_path, gauge, max_concurrency=2)
    assert answers == ["Hello."] * REQUESTS  # all served, two at a time
    assert gauge.peak == 2
