"""The size checks before admission, with an engine that counts its prompts: the cheap bound
on characters comes first (nothing tokenized for a body that cannot fit), then the engine's
count against the window and the operator's bound, each a 400 naming the numbers; nothing
reaches the engine."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from fastapi.testclient import TestClient

from kimi_server.engines.scripted import ScriptedEngine
from kimi_server.engines.types import GenerationRequest
from kimi_server.policy.catalogue import CATALOGUE

MODEL = CATALOGUE[0].id


@dataclass
class CountingEngine(ScriptedEngine):
    tokens: int = 100
    bound: int | None = None
    counted: list[GenerationRequest] = field(default_factory=list)

    async def count_prompt_tokens(self, request: GenerationRequest) -> int | None:
        self.counted.append(request)
        return self.tokens

    def prompt_token_limit(self) -> int | None:
        return self.bound

    def counts_exactly(self) -> bool:
        return False


@pytest.fixture
def engine() -> CountingEngine:
    return CountingEngine(window=4096)


def chat(content: str, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


def test_a_body_over_the_character_bound_is_refused_before_any_tokenizing(
    client: TestClient, engine: CountingEngine
) -> None:
    r = client.post("/v1/chat/completions", json=chat("x" * (8 * 4096 + 1)))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert engine.counted == [] and engine.requests == []


def test_a_prompt_whose_count_leaves_no_room_for_output_is_refused(client: TestClient, engine: CountingEngine) -> None:
    engine.tokens = 4096 - 3  # three tokens left: fewer than the 100 the request asks for
    r = client.post("/v1/chat/completions", json=chat("short", max_completion_tokens=100))
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "is 4093 tokens long" in error["message"] and "context window of 4096 tokens" in error["message"]
    assert engine.requests == []
    # The same count with an output cap that fits the rest of the window is served.
    assert client.post("/v1/chat/completions", json=chat("short", max_completion_tokens=3)).status_code == 200


def test_a_prompt_over_the_engines_bound_is_refused_naming_it(client: TestClient, engine: CountingEngine) -> None:
    engine.tokens, engine.bound = 1200, 1000
    r = client.post("/v1/responses", json={"model": MODEL, "input": "a\nb\nc\n"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "input" and error["code"] == "context_length_exceeded"
    assert "is 1200 tokens long" in error["message"] and "at most 1000 tokens" in error["message"]
    assert engine.requests == []
