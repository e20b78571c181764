"""An ASGI app whose factory takes ``SLOW_START_SECONDS`` to return: a worker that is slow to
start, for the supervisor's tests (tests/test_workers.py). It answers every request with 200."""

from __future__ import annotations

import os
import time
from typing import Any


def app() -> Any:
    time.sleep(float(os.environ.get("SLOW_START_SECONDS", "0")))

    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    return asgi
