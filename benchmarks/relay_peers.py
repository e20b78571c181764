"""The peers ``benchmarks/relay.py`` measures relays against: a fake upstream that answers at once
(raw asyncio, prebuilt answers) and the bare Starlette + httpx relays."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

# -- the fake upstream: prebuilt answers written in one go ------------------------------------------


def sse_frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def sse_tail(n: int) -> list[bytes]:
    usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
    return [b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n", b"data: [DONE]\n\n"]


def short_sse() -> list[bytes]:
    """The streamed answer to a short request: three deltas, the usage, ``[DONE]``."""
    frames = [
        sse_frame({"role": "assistant", "content": "Hello"}),
        sse_frame({"content": " there."}),
        sse_frame({}, "stop"),
    ]
    return frames + sse_tail(3)


def upstream_answers(chunks: int) -> tuple[bytes, bytes, bytes]:
    """(JSON answer, short SSE answer, long SSE answer), each a whole HTTP response."""

    def chunked(frames: list[bytes]) -> bytes:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        return head + b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in frames) + b"0\r\n\r\n"

    answer = json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "Hello there."}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        }
    ).encode()
    plain = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(answer), answer)
    long = [sse_frame({"content": "tok "}) for _ in range(chunks)] + [sse_frame({}, "stop")]
    return plain, chunked(short_sse()), chunked(long + sse_tail(chunks))


def serve_upstream(port: int, chunks: int) -> None:
    plain, short, long = upstream_answers(chunks)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lower = head.lower()
                at = lower.find(b"content-length:")
                size = int(lower[at + 15 : lower.index(b"\r\n", at)]) if at >= 0 else 0
                body = json.loads(await reader.readexactly(size)) if size else {}
                if not body.get("stream"):
                    writer.write(plain)
                else:
                    cap = max(body.get("max_tokens") or 0, body.get("max_completion_tokens") or 0)
                    # kimi-server always streams from its upstream; a client's short request is short.
                    writer.write(long if cap >= 1000 else short)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
        await server.serve_forever()

    asyncio.run(main())


# -- the bare relays --------------------------------------------------------------------------------


def serve_bare(port: int, upstream: str, clients: int) -> None:
    """The baseline: Starlette + httpx, bytes forwarded as they come, over ``clients`` pools."""
    import itertools

    import uvicorn
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    per = max(1, 256 // clients)
    limits = httpx.Limits(max_connections=per, max_keepalive_connections=per, keepalive_expiry=2)
    pool = itertools.cycle([httpx.AsyncClient(limits=limits) for _ in range(clients)])

    async def chat(request: Request) -> Response:
        client = next(pool)
        req = client.build_request(
            "POST",
            f"{upstream}/chat/completions",
            content=await request.body(),
            headers={"content-type": "application/json"},
        )
        resp = await client.send(req, stream=True)
        return StreamingResponse(
            resp.aiter_raw(),
            status_code=resp.status_code,
            media_type=resp.headers.get("content-type"),
            background=BackgroundTask(resp.aclose),
        )

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def serve_bare_wire(port: int, upstream: str, processes: int = 1) -> None:
    """The floor: a framework-free ASGI app on uvicorn's httptools protocol, forwarding bytes
    through the same lean upstream client kimi-server uses (``engines/upstream/wire_pool.py``).
    No auth, no checks, no parsing: what relaying alone costs in Python with these parts.
    ``processes`` > 1: that many, each on its own ``SO_REUSEPORT`` socket (as ``--workers``)."""
    if processes > 1:
        _fork_and_serve(port, upstream, processes)
        return
    _serve_wire(port, upstream)


def _fork_and_serve(port: int, upstream: str, processes: int) -> None:
    import os
    import signal

    children = []
    for _ in range(processes):
        pid = os.fork()
        if pid == 0:
            _serve_wire(port, upstream)
            os._exit(0)
        children.append(pid)

    def stop(*_: object) -> None:
        for child in children:
            os.kill(child, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    for child in children:
        os.waitpid(child, 0)


def _serve_wire(port: int, upstream: str) -> None:
    import socket

    import uvicorn

    from kimi_server.engines.upstream.wire_pool import Pool, Timeouts, request_head

    url = f"{upstream}/chat/completions"
    pool = Pool(url, 256)
    head = request_head(url, {})
    timeouts = Timeouts(connect=10.0, read=60.0, pool=10.0)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        async with pool.post(head, b"".join(chunks), timeouts) as resp:
            ctype = resp.headers.get("content-type", "application/json").encode()
            await send({"type": "http.response.start", "status": resp.status, "headers": [(b"content-type", ctype)]})
            async for part in resp:
                await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    # A socket that names TCP (and is passed whole, not as a descriptor, which uvicorn takes for
    # a Unix socket): only then does asyncio turn Nagle's algorithm off on its connections.
    config = uvicorn.Config(app, log_level="warning", http="httptools", loop="asyncio")
    uvicorn.Server(config).run(sockets=[sock])
