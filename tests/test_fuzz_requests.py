"""Fuzzing both generating endpoints (scripted engine, over a real socket): whatever a client
sends, the answer comes within a time bound, is never a 5xx and never an internal error inside a
stream.

Requests are built from the shapes of the real ones, with any field replaced, at random, by an
arbitrary JSON value (lone surrogates, deep lists, huge numbers included); schemas are now and
then hostile (``$ref`` loops, catastrophic patterns) and texts multi-line, CR/LF or Unicode edge
cases (``tests/schema_corpus.py``). ``tests/test_fuzz_real_model.py`` sends the hostile ones to
the real model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_server.policy.catalogue import CATALOGUE
from tests.conftest import build_app
from tests.gateway_util import serve
from tests.schema_corpus import EDGE_TEXTS, hostile_schemas

KEY = "sk-fuzz"
EXAMPLES = 200  # per endpoint
TIME_BOUND_S = 10.0  # per request: the scripted engine answers in milliseconds
HOSTILE = hostile_schemas()

# Any code point, lone surrogates included (json.dumps writes them as \udXXX escapes); now and
# then a multi-line, CR/LF or Unicode edge case.
any_text = st.text(st.characters(codec=None, categories=None), max_size=12)
text = st.integers(0, 5).flatmap(lambda n: st.sampled_from(EDGE_TEXTS) if n == 0 else any_text)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
anything = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=12,
)


def sometimes(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a well-formed value; now and then anything at all."""
    # A weighted choice: Hypothesis favours the first branches of a plain one_of.
    return st.integers(0, 9).flatmap(lambda n: anything if n == 7 else valid)


def _paths(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [here]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*here, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _paths(value, (*here, i))
    return found


@st.composite
def mutated(draw: st.DrawFn, bodies: st.SearchStrategy[Any]) -> Any:
    """A request as built, or with one value somewhere inside it replaced by anything."""
    body = draw(bodies)
    if not draw(st.booleans()):
        return body
    path = draw(st.sampled_from(_paths(body)))
    if not path:
        return draw(anything)
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = draw(anything)
    return body


models = sometimes(st.sampled_from([s.id for s in CATALOGUE] + ["no-such-model"]))
efforts = sometimes(st.sampled_from(["low", "medium", "high", "max", "none", "minimal", "xhigh", "bogus"]))
counts = sometimes(st.integers(min_value=-2, max_value=5000))
plain_schema = sometimes(
    st.fixed_dictionaries(
        {"type": st.just("object")},
        optional={
            "properties": st.dictionaries(
                st.sampled_from(["a", "b", "c"]),
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["string", "integer", "array", "object", "nope"])},
                    optional={
                        "pattern": st.sampled_from(["^\\p{L}+$", "[a-z", "(?=x)", "\\d{2,3}"]),
                        "enum": anything,
                        "items": anything,
                    },
                ),
                max_size=3,
            ),
            "required": sometimes(st.lists(st.sampled_from(["a", "b", "z"]), max_size=3)),
            "additionalProperties": st.booleans(),
        },
    )
)
# Now and then a $ref loop or a catastrophic pattern.
schema = st.integers(0, 3).flatmap(lambda n: st.sampled_from(HOSTILE) if n == 0 else plain_schema)
function_tool = st.fixed_dictionaries(
    {
        "type": sometimes(st.just("function")),
        "function": sometimes(
            st.fixed_dictionaries(
                {"name": sometimes(st.sampled_from(["f", "get_x", "bad name"]))},
                optional={"parameters": schema, "strict": st.booleans(), "description": text},
            )
        ),
    }
)
part = sometimes(
    st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": text}),
        st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({"url": text})}),
    )
)
message = sometimes(
    st.fixed_dictionaries(
        {
            "role": sometimes(st.sampled_from(["system", "user", "user", "assistant", "tool", "developer"])),
            "content": sometimes(text | st.lists(part, max_size=3)),
        },
        optional={
            "tool_call_id": text,
            "reasoning_content": text,
            "name": text,
        },
    )
)
chat_body = st.fixed_dictionaries(
    {"model": models, "messages": sometimes(st.lists(message, min_size=1, max_size=4))},
    optional={
        "reasoning_effort": efforts,
        "max_completion_tokens": counts,
        "max_tokens": counts,
        "stream": sometimes(st.booleans()),
        "stream_options": sometimes(st.fixed_dictionaries({"include_usage": st.booleans()})),
        "tools": sometimes(st.lists(function_tool, max_size=2)),
        "tool_choice": sometimes(st.sampled_from(["auto", "none", "required"])),
        "response_format": sometimes(
            st.sampled_from([{"type": "text"}, {"type": "json_object"}])
            | st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}, schema)
        ),
        "stop": sometimes(text | st.lists(text, max_size=2)),
        "seed": sometimes(st.integers()),
        "temperature": sometimes(st.floats(min_value=0, max_value=2)),
        "prompt_cache_options": sometimes(st.fixed_dictionaries({"ttl": st.sampled_from(["5m", "1h"])})),
        "n": sometimes(st.just(1)),
    },
)
input_item = sometimes(
    st.fixed_dictionaries(
        {"role": sometimes(st.sampled_from(["user", "assistant", "system", "developer"]))},
        optional={
            "content": sometimes(
                text
                | st.lists(
                    st.fixed_dictionaries(
                        {"type": sometimes(st.sampled_from(["input_text", "output_text"])), "text": text}
                    ),
                    max_size=2,
                )
            ),
            "type": sometimes(st.sampled_from(["message", "reasoning", "function_call_output"])),
        },
    )
)
responses_body = st.fixed_dictionaries(
    {"model": models, "input": sometimes(text | st.lists(input_item, min_size=1, max_size=3))},
    optional={
        "instructions": sometimes(text),
        "reasoning": sometimes(st.fixed_dictionaries({}, optional={"effort": efforts, "summary": anything})),
        "max_output_tokens": counts,
        "stream": sometimes(st.booleans()),
        "tools": sometimes(
            st.lists(
                st.fixed_dictionaries(
                    {"type": sometimes(st.just("function")), "name": sometimes(st.just("f"))},
                    optional={"parameters": schema, "strict": st.booleans()},
                ),
                max_size=2,
            )
        ),
        "text": sometimes(st.builds(lambda s: {"format": {"type": "json_schema", "name": "x", "schema": s}}, schema)),
        "store": sometimes(st.booleans()),
        "include": sometimes(st.lists(st.just("reasoning.encrypted_content"), max_size=1)),
        "truncation": sometimes(st.sampled_from(["auto", "disabled"])),
    },
)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    app = build_app(tmp_path_factory.mktemp("fuzz"), keys=[KEY])
    with (
        serve(app) as url,
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=TIME_BOUND_S) as c,
    ):
        yield c


def check(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    raw = json.dumps(body)  # ensure_ascii: lone surrogates travel as escapes, as a client would send them
    try:
        r = client.post(path, content=raw, headers={"content-type": "application/json"})
    except httpx.TimeoutException:
        pytest.fail(f"no answer within {TIME_BOUND_S} s: {raw[:500]}")
    assert r.status_code < 500, (r.status_code, r.text[:300], raw[:500])
    assert "internal_error" not in r.text, raw[:500]
    if r.status_code >= 400:
        assert set(r.json()["error"]) >= {"message", "type", "code"}
    return r


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same cases every run: a failure reproduces
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(body=mutated(chat_body))
def test_chat_completions_never_answers_5xx(client: httpx.Client, body: Any) -> None:
    check(client, "/v1/chat/completions", body)


@FUZZ
@given(body=mutated(responses_body))
def test_responses_never_answers_5xx(client: httpx.Client, body: Any) -> None:
    check(client, "/v1/responses", body)


@pytest.mark.parametrize("index", range(len(HOSTILE)))
def test_every_hostile_schema_is_answered_in_time_on_both_endpoints(client: httpx.Client, index: int) -> None:
    schema = HOSTILE[index]
    tool = {"type": "function", "function": {"name": "f", "parameters": schema, "strict": True}}
    chat = {"model": "kimi-k3.1-pro", "messages": [{"role": "user", "content": "Hi"}]}
    check(client, "/v1/chat/completions", {**chat, "tools": [tool], "tool_choice": "required"})
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    fmt = check(client, "/v1/chat/completions", {**chat, "response_format": response_format})
    text_format = {"format": {"type": "json_schema", "name": "x", "schema": schema}}
    check(client, "/v1/responses", {"model": "kimi-k3.1-pro", "input": "Hi", "text": text_format})
    if fmt.status_code == 400:  # refused: the error names the field
        assert fmt.json()["error"]["param"].startswith("response_format.json_schema")


def test_references_that_only_loop_are_refused_naming_the_field(client: httpx.Client) -> None:
    loop = {
        "type": "object",
        "properties": {"v": {"$ref": "#/$defs/a"}},
        "required": ["v"],
        "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
    }
    body: dict[str, Any] = {
        "model": "kimi-k3.1-pro",
        "messages": [{"role": "user", "content": "Hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": loop, "strict": True}},
    }
    r = check(client, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "response_format.json_schema.schema.properties.v.$ref" and "loops back" in error["message"]
    # Recursion through structure is fine: the answer can end it (an optional field).
    tree = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}
    body["response_format"]["json_schema"]["schema"] = tree
    assert check(client, "/v1/chat/completions", body).status_code == 200


@pytest.mark.parametrize("index", range(len(EDGE_TEXTS)))
def test_multiline_and_unicode_edge_prompts_are_answered(client: httpx.Client, index: int) -> None:
    prompt = EDGE_TEXTS[index]
    chat = check(
        client,
        "/v1/chat/completions",
        {
            "model": "kimi-k3.1-pro",
            "messages": [{"role": "system", "content": prompt}, {"role": "user", "content": prompt}],
        },
    )
    responses = check(client, "/v1/responses", {"model": "kimi-k3.1-pro", "input": prompt, "instructions": prompt})
    # Only the lone surrogate is refused; every other text is a prompt like any other.
    expected = 400 if "\ud800" in prompt else 200
    assert (chat.status_code, responses.status_code) == (expected, expected), (chat.text[:200], responses.text[:200])
