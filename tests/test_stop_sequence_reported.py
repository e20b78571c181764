"""The stop string that ended an answer, reported in ``Finish.stop_sequence`` where the engine
can tell (a Messages ``stop_sequence``): the embedded engine (llama.cpp names it in the verbose
result the call asks for), vLLM's ``stop_reason``, llama.cpp server's ``stopping_word``."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from kimi_server.engines.llamacpp.embedded_config import EmbeddedConfig
from kimi_server.engines.llamacpp.engine import EmbeddedEngine
from kimi_server.engines.scripted import Script, ScriptedEngine
from kimi_server.engines.types import EngineEvent, Finish, GenerationRequest, Message, ReasoningBudget
from kimi_server.engines.upstream.normalise import Normaliser
from tests.conftest import TEST_MODEL, model_path
from tests.test_phases import FakeLlama, request, run


class StoppingLlama(FakeLlama):
    """Says ``w0 w1 `` and stops at the client's first stop string; names it when asked."""

    def handle_completions(self, body: dict[str, Any], callback: Any = None) -> None:
        self.calls.append(body)
        word = next((s for s in body.get("stop", ()) if s.startswith("STOP")), None)
        if word is None or body["n_predict"] < 3:
            super().handle_completions(body, callback)
            return
        for i in range(2):
            callback({"choices": [{"text": f"w{i} ", "finish_reason": None}]})
        final: dict[str, Any] = {
            "choices": [{"text": "", "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3},
        }
        if body.get("verbose"):
            final["__verbose"] = {"stop_type": "word", "stopping_word": word}
        callback(final)


def finish_of(events: list[EngineEvent]) -> Finish:
    last = events[-1]
    assert isinstance(last, Finish)
    return last


def test_the_embedded_engine_reports_the_clients_stop_string() -> None:
    llama = StoppingLlama(natural_stop=2)
    finish = finish_of(run(llama, dataclasses.replace(request(floor=4, cap=50, max_out=100), stop=("STOP1", "STOP2"))))
    assert finish.reason == "stop" and finish.stop_sequence == "STOP1"
    # Asked only of calls that the client's stop strings may end.
    assert all(c.get("verbose") is True for c in llama.calls if "STOP1" in c.get("stop", ()))
    llama = StoppingLlama(natural_stop=2)
    finish = finish_of(run(llama, request(floor=4, cap=50, max_out=100)))
    assert finish.stop_sequence is None and not any("verbose" in c for c in llama.calls)


def test_a_stop_that_is_not_the_clients_is_not_reported() -> None:
    """The reasoning markers stop calls too; only the client's strings are its stop_sequence."""
    llama = StoppingLlama(natural_stop=2)
    req = dataclasses.replace(request(floor=4, cap=50, max_out=100), stop=("OTHER",))
    finish = finish_of(run(llama, req))
    assert finish.stop_sequence is None


def test_the_scripted_engine_can_say_one() -> None:
    async def main() -> list[EngineEvent]:
        engine = ScriptedEngine(Script(stop_sequence="END"))
        return [e async for e in engine.generate(request(floor=1, cap=2, max_out=100))]

    assert finish_of(asyncio.run(main())).stop_sequence == "END"


def _normalised(chunk_extra: dict[str, Any], choice_extra: dict[str, Any], reason: str = "stop") -> Finish:
    normaliser = Normaliser(report_cache=False, separate_writes=False)
    normaliser.feed({"choices": [{"delta": {"content": "1 2 3"}}]})
    normaliser.feed({"choices": [{"delta": {}, "finish_reason": reason, **choice_extra}], **chunk_extra})
    return finish_of(normaliser.finish())


def test_upstreams_report_it_where_they_say() -> None:
    assert _normalised({}, {"stop_reason": "END"}).stop_sequence == "END"  # vLLM
    assert _normalised({}, {"stop_reason": 128009}).stop_sequence is None  # a stop token's id
    assert _normalised({"__verbose": {"stopping_word": "END"}}, {}).stop_sequence == "END"  # llama.cpp
    assert _normalised({}, {}).stop_sequence is None
    assert _normalised({}, {"stop_reason": "END"}, reason="length").stop_sequence is None


@pytest.mark.e2e
def test_the_real_model_reports_the_stop_string_it_hit() -> None:
    """The tiny model through llama.cpp: an answer about the sea holds a space or an 'e', so it
    ends at one of them, named; a string it cannot write names nothing."""
    path = model_path(TEST_MODEL)
    assert path.exists(), f"{path.name} is not pulled (scripts/test pulls it)"

    async def main() -> tuple[Finish, Finish]:
        engine = EmbeddedEngine(EmbeddedConfig(path, n_ctx=2048, n_parallel=1, n_threads=1))
        await engine.start()
        try:
            ask = GenerationRequest(
                model="kimi-k3.1-pro",
                messages=(Message("user", "Write two sentences about the sea."),),
                effort="low",
                budget=ReasoningBudget(8, 16),
                max_output_tokens=96,
                stop=(" ", "e"),
                seed=7,
            )
            hit = [e async for e in engine.generate(ask)]
            missed = [e async for e in engine.generate(dataclasses.replace(ask, stop=("@@@@",)))]
            return finish_of(hit), finish_of(missed)
        finally:
            await engine.close()

    hit, missed = asyncio.run(main())
    assert hit.reason == "stop" and hit.stop_sequence in (" ", "e")
    assert missed.stop_sequence is None
