"""Bridges llama.cpp's blocking, callback-streaming completion call into asyncio.

Each call runs in its own worker thread (xllamacpp's handlers are thread-safe and llama.cpp
batches concurrent slots together); chunks cross to the event loop through a queue. Closing the
iterator sets a flag that the next callback sees, which makes llama.cpp stop that slot.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from kimi_server.engines.owner import CallCounters
from kimi_server.errors import EngineUnavailableError, InvalidRequestError


class CompletionServer(Protocol):
    def handle_completions(self, body: dict[str, Any], callback: Any = ...) -> Any: ...


@dataclass(frozen=True)
class CompletionResult:
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cut: bool = False  # stopped part-way: by the caller's stop_after, or the KV cache running out
    looped: bool = False  # the caller's stop_after ended it (the repetition guard)
    # The stop string that ended it, when the call asked llama.cpp to say ("verbose").
    stopping_word: str | None = None
    # llama.cpp's time computing the prompt (its batches, with whatever other slots shared them).
    prompt_ms: float = 0.0


_DONE = object()


class CompletionRunner:
    def __init__(self, server: CompletionServer, max_workers: int = 64, *, pinned: bool = False) -> None:
        self._server = server
        # pinned: every call must name its slot. Left to choose, llama.cpp could pick a slot
        # holding another API key's prompt and reuse it (see engines/llamacpp/prompt_cache.py).
        self._pinned = pinned
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="llama")
        self._pending: set[asyncio.Future[None]] = set()
        # Calls in flight, and calls stopped because their consumer went away first.
        self.calls = CallCounters()

    @property
    def cancelled(self) -> int:
        return self.calls.cancelled

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def stream(
        self, body: dict[str, Any], stop_after: Callable[[str], bool] | None = None
    ) -> AsyncIterator[str | CompletionResult]:
        """Yields text pieces, then one ``CompletionResult``. ``stop_after(piece)`` true ends
        the call there, with ``finish_reason`` "length" and the counts so far; so does the
        shared KV cache running out part-way (the tokens made are still counted)."""
        if self._pinned and "id_slot" not in body:
            raise RuntimeError("a completion on a pinned runner must name its slot (id_slot)")
        body = {**body, "timings_per_token": True}  # counts in every chunk, for a cut
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancelled = threading.Event()
        future = self._start(body, loop, queue, cancelled)
        owner = self.calls.start()
        future.add_done_callback(lambda _: self.calls.end(owner))
        text: list[str] = []
        final: dict[str, Any] | None = None
        last: dict[str, Any] = {}  # the last chunk that carried text
        ended = stopped = False
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    ended = True
                    break
                if isinstance(item, BaseException) or "error" in item:
                    result = _cut_or_raise(item, text, last)
                    stopped = True
                    yield result
                    return
                choice = (item.get("choices") or [{}])[0]
                piece = choice.get("text") or ""
                if piece:
                    text.append(piece)
                    last = item
                    yield piece
                    if stop_after is not None and stop_after(piece):
                        stopped = True
                        yield replace(_cut_result("".join(text), len(text), item), looped=True)
                        return
                if choice.get("finish_reason") is not None or "usage" in item:
                    final = item
            if final is None:
                raise EngineUnavailableError("The engine ended without a result.")
            yield _result("".join(text), final)
        finally:
            self._release(future, cancelled, owner, consumer_left=not ended and not stopped)

    def _start(
        self,
        body: dict[str, Any],
        loop: asyncio.AbstractEventLoop,
        queue: asyncio.Queue[Any],
        cancelled: threading.Event,
    ) -> asyncio.Future[None]:
        """Runs the streaming call on a worker thread: its chunks, an error reply or exception,
        then ``_DONE`` go to ``queue``; ``cancelled`` set stops it at its next chunk."""

        def on_chunk(chunk: Any) -> bool:
            if cancelled.is_set():
                return True
            loop.call_soon_threadsafe(queue.put_nowait, chunk)
            return False

        def work() -> None:
            try:
                ret = self._server.handle_completions({**body, "stream": True}, on_chunk)
                if isinstance(ret, dict) and "error" in ret:
                    loop.call_soon_threadsafe(queue.put_nowait, ret)
            except BaseException as exc:  # handed to the event loop, re-raised there
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        return loop.run_in_executor(self._pool, work)

    def _release(
        self, future: asyncio.Future[None], cancelled: threading.Event, owner: str, *, consumer_left: bool
    ) -> None:
        """Lets go of a call however its stream ended. The worker sees the flag at its next
        token and llama.cpp frees the slot; nothing here needs to wait for that."""
        if consumer_left:
            self.calls.cancel(owner)
        cancelled.set()
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)


def _cut_or_raise(item: Any, text: list[str], last: dict[str, Any]) -> CompletionResult:
    """A failed call's end: the worker's exception or llama.cpp's error reply raises, except
    the shared KV cache running out after some text, which ends the call cut there."""
    if isinstance(item, BaseException):
        raise EngineUnavailableError("The engine failed to generate a response.")
    error = _engine_error(item["error"])
    if text and getattr(error, "code", None) == "context_length_exceeded":
        return _cut_result("".join(text), len(text), last)
    raise error


def _result(text: str, final: dict[str, Any]) -> CompletionResult:
    choice = (final.get("choices") or [{}])[0]
    usage = final.get("usage") or {}
    timings = final.get("timings") or {}
    prompt = int(usage.get("prompt_tokens", 0))
    cached = int(timings.get("cache_n", (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)))
    # llama.cpp's own result, beside the OpenAI-shaped one, only for a call that asked for it.
    native = final.get("__verbose") or {}
    word = native.get("stopping_word") if native.get("stop_type") == "word" else None
    return CompletionResult(
        text=text,
        finish_reason=str(choice.get("finish_reason") or "stop"),
        prompt_tokens=prompt,
        cached_tokens=min(cached, prompt),
        completion_tokens=int(usage.get("completion_tokens", timings.get("predicted_n", 0))),
        stopping_word=word if isinstance(word, str) and word else None,
        prompt_ms=_milliseconds(timings.get("prompt_ms")),
    )


def _milliseconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and value >= 0 else 0.0


def _cut_result(text: str, pieces: int, last: dict[str, Any]) -> CompletionResult:
    """The result of a call stopped here: its counts from the last chunk's timings."""
    timings = last.get("timings") or {}
    cached = int(timings.get("cache_n", 0))
    return CompletionResult(
        text=text,
        finish_reason="length",
        prompt_tokens=cached + int(timings.get("prompt_n", 0)),
        cached_tokens=cached,
        completion_tokens=int(timings.get("predicted_n", pieces)),
        cut=True,
    )


def _engine_error(error: Any) -> Exception:
    message = str(error.get("message", "")) if isinstance(error, dict) else str(error)
    if "context" in message.lower() and ("exceed" in message.lower() or "size" in message.lower()):
        return InvalidRequestError(
            "The prompt is longer than this model's context window allows.",
            param="messages",
            code="context_length_exceeded",
        )
    return EngineUnavailableError("The engine could not complete the request.")
