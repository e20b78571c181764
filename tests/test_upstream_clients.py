"""The upstream connections spread over small pools: a request takes the least busy pool, so it
never waits for a connection in a full pool while another pool has room; and every request of
one relay is served whichever pool it lands on."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from kimi_server.engines.upstream.clients import ClientSet
from tests.upstreams.fake import Conn, FakeUpstream, chunk

HOLD_SECONDS = 20


def held_open(release: threading.Event) -> Any:
    async def handler(body: dict[str, Any], c: Conn) -> None:
        await c.head()
        await c.event(chunk({"content": "Hi"}))
        for _ in range(HOLD_SECONDS * 100):
            if release.is_set():
                break
            await asyncio.sleep(0.01)
        await c.done()

    return handler


def test_a_request_takes_the_pool_with_room() -> None:
    release = threading.Event()
    with FakeUpstream(held_open(release)) as up:

        async def run() -> list[bytes]:
            # Two pools of one connection each; waiting for a connection fails fast.
            clients = ClientSet(2, httpx.Timeout(5.0, pool=0.5))
            url = f"{up.url}/chat/completions"
            try:
                async with clients.stream("POST", url, json={"n": 1}) as first:
                    async with clients.stream("POST", url, json={"n": 2}) as second:
                        release.set()
                        await second.aread()
                    # The second pool is free again, the first still busy: the third request
                    # must take the second (round-robin alone would wait on the first and fail).
                    async with clients.stream("POST", url, json={"n": 3}) as third:
                        body = await third.aread()
                    await first.aread()
                return [body]
            finally:
                await clients.aclose()

        bodies = asyncio.run(run())
    assert b"[DONE]" in bodies[0]
    assert [b["n"] for b in up.bodies] == [1, 2, 3]


def test_pools_share_the_connection_budget() -> None:
    clients = ClientSet(256)
    assert len(clients.clients) == 16
    small = ClientSet(3)
    assert len(small.clients) == 3  # never more pools than connections
    asyncio.run(clients.aclose())
    asyncio.run(small.aclose())
