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
