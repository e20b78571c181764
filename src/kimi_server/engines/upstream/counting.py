"""Counting the tokens of a request whose upstream reported no usage, so every token is billed.

Many OpenAI-compatible servers send ``usage`` only when asked, and some never do; billing
such a request as ``prompt_tokens: 0`` undercounts the bill and the key's TPM. When the final
chunk comes without counts, the prompt (the body this server sent) and the output (the text
the client received) are counted with the upstream's own tokenizer where its dialect has an
endpoint for it:

- llama.cpp's ``llama-server``: ``POST /apply-template`` renders the chat body through the
  model's template exactly as a completion would, ``POST /tokenize`` (``content``) counts it;
- vLLM: ``POST /tokenize`` takes the chat messages (and tools) and applies the template itself
  (``count``); output text goes as ``prompt``;
- SGLang: ``POST /tokenize`` takes text only (``prompt`` → ``count``): the messages' text is
  counted exactly, the template's few framing tokens per message are added from estimate.py.

Anything else (the generic ``openai`` dialect, Moonshot, or a tokenize call that fails or
takes longer than TOKENIZE_TIMEOUT) falls back to estimate.py's generous local count, worked
out in a thread off the event loop. The usage says which (``server_count`` or
``server_estimate``) and so does the ledger row. An upstream whose tokenizer failed is not
asked again for RETRY_AFTER seconds, so a server without the endpoint costs one try a minute.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Protocol

import httpx

from kimi_server.engines.types import ContentDelta, EngineEvent, ReasoningDelta, ToolCallDelta
from kimi_server.engines.upstream.estimate import MESSAGE_FRAMING, REPLY_FRAMING, estimate_tokens
from kimi_server.engines.upstream.normalise import Counts
from kimi_server.engines.upstream.relay import Upstream

log = logging.getLogger(__name__)

TOKENIZE_TIMEOUT = 5.0  # for all of one request's tokenize calls together
RETRY_AFTER = 60.0
MEDIA_TOKENS = 768  # an image or video part, as the gateway's reservation counts it
_CHAT_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")


class Transcript:
    """The output as the client received it: what the upstream generated."""

    def __init__(self) -> None:
        self.answer: list[str] = []
        self.reasoning: list[str] = []
        self.calls = 0
        # The model ended its turn itself: it generated an end-of-turn token the text lacks
        # (llama.cpp and vLLM count it in completion_tokens).
        self.stopped = False

    def add(self, event: EngineEvent) -> None:
        if isinstance(event, ContentDelta):
            self.answer.append(event.text)
        elif isinstance(event, ReasoningDelta):
            self.reasoning.append(event.text)
        elif isinstance(event, ToolCallDelta):
            if event.name:
                self.calls += 1
                self.answer.append(event.name)
            self.answer.append(event.arguments)


class TokenizerUnavailable(Exception):
    """The upstream's tokenize endpoint did not answer as documented."""


class _Http:
    def __init__(self, up: Upstream) -> None:
        self._up = up
        base = up.base
        # The tokenize endpoints live at the server's root, beside /v1.
        self.root = base[: -len("/v1")] if base.endswith("/v1") else base

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = await self._up.client.post(
            self.root + path, json=body, headers=self._up.headers, timeout=TOKENIZE_TIMEOUT
        )
        if resp.status_code != 200:
            raise TokenizerUnavailable(f"HTTP {resp.status_code}")
        out = resp.json()
        if not isinstance(out, dict):
            raise TokenizerUnavailable("not an object")
        return out


def _length(answer: dict[str, Any]) -> int:
    count = answer.get("count")
    if isinstance(count, int) and count >= 0:
        return count
    tokens = answer.get("tokens")
    if isinstance(tokens, list):
        return len(tokens)
    raise TokenizerUnavailable("no count")


def text_messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The messages with their text parts only, and what the media parts are reckoned to cost
    (a tokenizer endpoint would fetch and process images just to count them)."""
    out: list[dict[str, Any]] = []
    media = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            parts = [p for p in content if isinstance(p, dict)]
            media += sum(1 for p in parts if p.get("type") != "text")
            m = {**m, "content": "\n".join(str(p.get("text") or "") for p in parts if p.get("type") == "text")}
        out.append(m)
    return out, media * MEDIA_TOKENS


class TokenizeAPI(Protocol):
    async def prompt(self, http: _Http, body: dict[str, Any]) -> int: ...

    async def text(self, http: _Http, model: str, text: str) -> int: ...


class LlamaCppTokenizer:
    async def prompt(self, http: _Http, body: dict[str, Any]) -> int:
        messages, media = text_messages(body["messages"])
        fields: dict[str, Any] = {k: body[k] for k in (*_CHAT_FIELDS, "reasoning_format") if k in body}
        chat = {"messages": messages, **fields}
        rendered = (await http.post("/apply-template", chat)).get("prompt")
        if not isinstance(rendered, str):
            raise TokenizerUnavailable("no prompt")
        counted = await http.post("/tokenize", {"content": rendered, "add_special": True, "parse_special": True})
        return _length(counted) + media

    async def text(self, http: _Http, model: str, text: str) -> int:
        return _length(await http.post("/tokenize", {"content": text, "add_special": False, "parse_special": False}))


class VLLMTokenizer:
    async def prompt(self, http: _Http, body: dict[str, Any]) -> int:
        messages, media = text_messages(body["messages"])
        fields: dict[str, Any] = {k: body[k] for k in ("tools", "chat_template_kwargs") if k in body}
        chat: dict[str, Any] = {"model": body["model"], "messages": messages, "add_generation_prompt": True, **fields}
        return _length(await http.post("/tokenize", chat)) + media

    async def text(self, http: _Http, model: str, text: str) -> int:
        return _length(await http.post("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}))


class SGLangTokenizer(VLLMTokenizer):
    async def prompt(self, http: _Http, body: dict[str, Any]) -> int:
        messages, media = text_messages(body["messages"])
        text = "\n".join(_message_text(m) for m in messages)
        framing = MESSAGE_FRAMING * len(messages) + REPLY_FRAMING + await asyncio.to_thread(_tools_estimate, body)
        return await self.text(http, body["model"], text) + framing + media


# The dialects whose servers count a chat body's prompt as they bill it.
EXACT_TOKENIZERS = frozenset({"llamacpp", "vllm"})
TOKENIZERS: dict[str, TokenizeAPI] = {
    "llamacpp": LlamaCppTokenizer(),
    "vllm": VLLMTokenizer(),
    "sglang": SGLangTokenizer(),
}


def _message_text(m: dict[str, Any]) -> str:
    parts = [str(m.get("content") or ""), str(m.get("reasoning_content") or "")]
    for call in m.get("tool_calls") or ():
        fn = (call.get("function") or {}) if isinstance(call, dict) else {}
        parts += [str(fn.get("name") or ""), str(fn.get("arguments") or "")]
    return "\n".join(p for p in parts if p)


def _tools_estimate(body: dict[str, Any]) -> int:
    tools = body.get("tools")
    return estimate_tokens(json.dumps(tools, ensure_ascii=False)) if tools else 0


def estimate_counts(body: dict[str, Any], transcript: Transcript, need_prompt: bool) -> Counts:
    """estimate.py's generous count of the prompt and the output (CPU work: run it in a thread)."""
    prompt = 0
    if need_prompt:
        messages, media = text_messages(body["messages"])
        prompt = sum(estimate_tokens(_message_text(m)) + MESSAGE_FRAMING for m in messages)
        prompt += REPLY_FRAMING + _tools_estimate(body) + media
    reasoning = estimate_tokens("".join(transcript.reasoning))
    answer = estimate_tokens("".join(transcript.answer)) + _unseen_output(transcript)
    return Counts(prompt, answer + reasoning, reasoning, "server_estimate")


def _unseen_output(transcript: Transcript) -> int:
    """Generated tokens the text does not show: each tool call's markup around its name and
    arguments (a reckoning), and the end-of-turn token."""
    return MESSAGE_FRAMING * transcript.calls + int(transcript.stopped)


class TokenCounter:
    """Counts for one upstream: its tokenizer while it answers, the local estimate otherwise."""

    def __init__(self, up: Upstream) -> None:
        self._up = up
        self._api = TOKENIZERS.get(up.cfg.dialect)
        self._http = _Http(up)
        self._skip_until = 0.0

    async def prompt(self, body: dict[str, Any]) -> int | None:
        """The body's prompt by the upstream's own tokenizer; None where it has none or fails."""
        if self._api is None or time.monotonic() < self._skip_until:
            return None
        try:
            async with asyncio.timeout(TOKENIZE_TIMEOUT):
                return await self._api.prompt(self._http, body)
        except (TokenizerUnavailable, httpx.HTTPError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            self._unavailable(exc)
            return None

    def _unavailable(self, exc: Exception) -> None:
        self._skip_until = time.monotonic() + RETRY_AFTER
        log.warning(
            "upstream %s: its tokenizer did not answer (%s); token counts are estimated locally for the next %.0f s",
            self._up.name,
            type(exc).__name__,
            RETRY_AFTER,
        )

    async def count(self, body: dict[str, Any], transcript: Transcript, *, need_prompt: bool) -> Counts:
        if self._api is not None and time.monotonic() >= self._skip_until:
            try:
                async with asyncio.timeout(TOKENIZE_TIMEOUT):
                    return await self._tokenize(self._api, body, transcript, need_prompt)
            except (TokenizerUnavailable, httpx.HTTPError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                self._unavailable(exc)
        return await asyncio.to_thread(estimate_counts, body, transcript, need_prompt)

    async def _tokenize(
        self, api: TokenizeAPI, body: dict[str, Any], transcript: Transcript, need_prompt: bool
    ) -> Counts:
        model = str(body.get("model") or "")

        async def text(pieces: list[str]) -> int:
            joined = "".join(pieces)
            return await api.text(self._http, model, joined) if joined else 0

        async def nothing() -> int:
            return 0

        # Concurrently: the client waits for these (its usage follows the ledger row).
        prompt, answer, reasoning = [
            _value(r)
            for r in await asyncio.gather(
                api.prompt(self._http, body) if need_prompt else nothing(),
                text(transcript.answer),
                text(transcript.reasoning),
                return_exceptions=True,
            )
        ]
        answer += _unseen_output(transcript)
        return Counts(prompt, answer + reasoning, reasoning, "server_count")


def _value(result: int | BaseException) -> int:
    if isinstance(result, BaseException):
        raise result
    return result
