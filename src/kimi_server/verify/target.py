"""The endpoint under test: the ``openai`` SDK for what a client sees, raw HTTP for statuses,
error bodies and SSE framing. Both go through one client whose requests end by their wall-clock
deadline (``verify/transport.py``), so no check can hang a run."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import openai

from kimi_server.verify import deadline, transport
from kimi_server.verify.contracts import Contract, ModelRules, rules_for
from kimi_server.verify.outcome import Failed, expect

# Output caps: 1 where only acceptance matters; room for a short reasoning phase and a short
# answer where the answer is inspected (a model stops early; the cap only bounds a runaway).
ACCEPT_TOKENS = 1
ANSWER_TOKENS = 256
SAY_OK = [{"role": "user", "content": "Reply with OK."}]
T = TypeVar("T")


@dataclass
class Target:
    base_url: str
    key: str
    models: list[str]  # every model id under test; the first is the one most checks use
    contract: Contract
    timeout: float = 120.0  # each request's wall-clock deadline, seconds
    check_timeout: float = 0.0  # each check's; 0: three requests' worth
    other_key: str | None = None  # a second key, for the checks that one key cannot see another's
    anthropic_url: str = ""  # the Messages door's base (…/anthropic); empty: the OpenAI base's host
    body_limit: int = 0  # the request-body limit the endpoint states, bytes; 0: not stated
    limited_key: str = ""  # a key the endpoint rate-limits; empty: none given
    memo: dict[str, Any] = field(default_factory=dict)  # answers several checks inspect
    _locks: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        if self.check_timeout <= 0:
            self.check_timeout = 3 * self.timeout
        self.http = transport.client(self.base_url, self.timeout)
        # One client for both, so the SDK's requests keep the same deadlines. The SDK takes an
        # httpx client as well as its own httpx2 one (it checks for either), though its
        # annotation names only the latter.
        sdk_client: Any = self.http
        self.sdk = openai.OpenAI(
            base_url=self.base_url, api_key=self.key, max_retries=0, timeout=self.timeout, http_client=sdk_client
        )

    def close(self) -> None:
        self.http.close()
        self.sdk.close()

    def once(self, key: str, make: Callable[[], T]) -> T:
        """``make()`` asked once per run, however many checks (threads) want its answer."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        deadline.acquire(lock)  # the check asking first fetches it, under its own deadline
        try:
            if key not in self.memo:
                self.memo[key] = make()
            value: T = self.memo[key]
            return value
        finally:
            lock.release()

    def listed(self) -> dict[str, dict[str, Any]]:
        """The endpoint's ``GET /models``: model id -> the object it lists (empty when it lists
        nothing readable): what the endpoint says about each model."""
        return self.once("listing", self._listing)

    def _listing(self) -> dict[str, dict[str, Any]]:
        resp = self.http.get(self.base_url + "/models", headers={"Authorization": f"Bearer {self.key}"})
        try:
            data = resp.json().get("data") if resp.status_code == 200 else None
        except (ValueError, AttributeError):
            data = None
        listed = data if isinstance(data, list) else []
        return {str(m["id"]): m for m in listed if isinstance(m, dict) and "id" in m}

    def declared(self, model: str, capability: str) -> bool | None:
        """What ``GET /models`` says the model has (``capabilities.<name>``); None: it does not say."""
        capabilities = self.listed().get(model, {}).get("capabilities")
        value = capabilities.get(capability) if isinstance(capabilities, dict) else None
        return value if isinstance(value, bool) else None

    @property
    def model(self) -> str:
        return self.models[0]

    def rules(self, model: str | None = None) -> ModelRules:
        return rules_for(model or self.model)

    def low_effort(self, model: str | None = None) -> dict[str, Any]:
        """The cheapest reasoning level the model takes (nothing where it has only one)."""
        efforts = self.rules(model).efforts
        return {"reasoning_effort": efforts[0]} if len(efforts) > 1 else {}

    # -- raw HTTP -------------------------------------------------------------------------

    def post(self, path: str, body: Any, *, key: str | None = None, raw: bytes | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.key if key is None else key}"}
        if raw is not None:
            headers["Content-Type"] = "application/json"
            return self.http.post(self.base_url + path, content=raw, headers=headers)
        return self.http.post(self.base_url + path, json=body, headers=headers)

    def ok(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A request that must be answered: the JSON body, or a failure quoting the error."""
        resp = self.post(path, body)
        expect(resp.status_code == 200, f"HTTP {resp.status_code}: {error_text(resp)}")
        data: dict[str, Any] = resp.json()
        return data

    def chat(self, **body: Any) -> dict[str, Any]:
        body.setdefault("model", self.model)
        body.setdefault("messages", SAY_OK)
        return self.ok("/chat/completions", body)

    def refused(self, path: str, body: Any, *, param: str | None = None, status: int = 400) -> dict[str, Any]:
        """A request that must be refused with ``status`` in the error shape, naming ``param``."""
        resp = self.post(path, body)
        got = "200 (accepted)" if resp.status_code == 200 else f"{resp.status_code}: {error_text(resp)[:120]}"
        expect(resp.status_code == status, f"expected {status}, got {got}")
        error = error_shape(resp)
        if param is not None:
            named = f"{error.get('param') or ''} {error.get('message') or ''}"
            expect(param in named, f"the error does not name {param!r}: {error.get('message')!r}")
        return error

    def events(self, path: str, body: dict[str, Any]) -> Iterator[tuple[str | None, str]]:
        """(event name, data) for each SSE event of a streamed answer, ``[DONE]`` included."""
        return self.sse(self.base_url + path, body, {"Authorization": f"Bearer {self.key}"})

    def sse(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> Iterator[tuple[str | None, str]]:
        """(event name, data) for each SSE event the POST to ``url`` answers with."""
        with self.http.stream("POST", url, json=body, headers=headers) as resp:
            if resp.status_code != 200:
                resp.read()
                raise Failed(f"HTTP {resp.status_code}: {error_text(resp)}")
            name: str | None = None
            data: list[str] = []
            for line in resp.iter_lines():
                if line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
                elif not line and data:
                    yield name, "\n".join(data)
                    name, data = None, []
            if data:
                yield name, "\n".join(data)

    def stream_json(self, path: str, body: dict[str, Any]) -> Streamed:
        """The decoded events of a stream, when each arrived, and whether ``[DONE]`` ended it."""
        out = Streamed(started=time.monotonic())
        for _, data in self.events(path, body):
            if data == "[DONE]":
                out.done = True
                continue
            expect(not out.done, "an event arrived after [DONE]")
            try:
                out.events.append(json.loads(data))
            except ValueError:
                raise Failed(f"an SSE event is not JSON: {data[:60]!r}") from None
            out.times.append(time.monotonic())
        return out


@dataclass
class Streamed:
    started: float
    events: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # monotonic arrival of each event
    done: bool = False


def error_text(resp: httpx.Response) -> str:
    try:
        err = resp.json().get("error")
    except (ValueError, AttributeError):
        return resp.text[:160].replace("\n", " ")
    if isinstance(err, dict):
        return str(err.get("message"))[:160]
    return str(err)[:160]


def error_shape(resp: httpx.Response) -> dict[str, Any]:
    """The ``error`` object, failing unless it is ``{"error": {"message", "type", "code"}}``."""
    try:
        body = resp.json()
    except ValueError:
        raise Failed(f"HTTP {resp.status_code} with a body that is not JSON: {resp.text[:80]!r}") from None
    error = body.get("error") if isinstance(body, dict) else None
    expect(isinstance(error, dict), f"no error object in the body: {str(body)[:100]}")
    assert isinstance(error, dict)
    missing = [k for k in ("message", "type", "code") if k not in error]
    expect(not missing, f"the error object lacks {', '.join(missing)}")
    expect(isinstance(error["message"], str) and bool(error["message"]), "the error message is empty")
    expect(isinstance(error["type"], str), "error.type is not a string")
    expect(error["code"] is None or isinstance(error["code"], str), "error.code is neither a string nor null")
    return error
