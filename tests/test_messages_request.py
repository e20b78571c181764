"""The Messages request mapped onto the internal GenerationRequest, field by field: the contract
rules as every door applies them, each 400 naming its field, and Claude Code's own request."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from kimi_server.engines.types import ToolChoice
from kimi_server.engines.web_search_tool import WEB_SEARCH_NAME
from kimi_server.errors import InvalidRequestError, NotFoundError
from kimi_server.http.errors import validation_error
from kimi_server.policy.profiles import MOONSHOT
from kimi_server.protocol.messages import MessagesRequest
from tests.messages_util import (
    BUDGETS,
    KEY,
    body,
    claude_code_body,
    claude_code_tools,
    count_plan,
    plan,
    refused,
)

MOONSHOT_EVERYWHERE = {m: MOONSHOT for m in ("kimi-k3.1-pro", "kimi-k3.1-pro-highspeed", "kimi-k3")}


def wire_error(raw: dict[str, Any]) -> InvalidRequestError:
    """The 400 the HTTP layer makes of a body that does not parse."""
    with pytest.raises(ValidationError) as caught:
        MessagesRequest.model_validate(raw)
    return validation_error(RequestValidationError(caught.value.errors(), body=raw))


def tool(name: str = "get_weather", **extra: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    return {"name": name, "description": "Weather.", "input_schema": schema, **extra}


# --- Claude Code ------------------------------------------------------------------------------


def test_claude_codes_request_builds() -> None:
    p = plan(claude_code_body())
    gen = p.gen
    assert p.model == gen.model == "kimi-k3.1-pro"  # claude-opus-4-1, through the aliases
    assert gen.effort == "high" and gen.budget.cap == BUDGETS["high"].cap
    assert gen.reasoning and not p.show_thinking  # adaptive, display omitted
    assert p.stream and p.user_id is not None and '"session_id":"s1"' in p.user_id
    assert gen.max_output_tokens == 32000 and gen.prompt_param == "messages"
    assert [m.role for m in gen.messages] == ["system", "system", "user"]
    assert (
        gen.messages[0].text.startswith("x-anthropic-billing-header") and "You are Claude Code" in gen.messages[0].text
    )
    assert gen.messages[1].text == "The working directory is /work/project."
    assert gen.messages[2].text == "<system-reminder>Context.</system-reminder>\nWrite hello.txt"
    assert [t.name for t in gen.tools] == [t["name"] for t in claude_code_tools()]
    assert "WebSearch" in [t.name for t in gen.tools]  # deferred loading: in force from the start
    assert gen.cache.ttl_label == "5m" and gen.cache.namespace == KEY


def test_the_same_request_by_alias_reaches_the_served_model() -> None:
    assert plan({**body(), "model": "claude-haiku-4-5"}).model == "kimi-k3.1-pro-highspeed"
    with pytest.raises(NotFoundError) as caught:
        plan({**body(), "model": "claude-gone"})  # an alias of a model not served
    assert caught.value.param == "model" and "'claude-gone'" in caught.value.message
    with pytest.raises(NotFoundError):
        plan({**body(), "model": "claude-unknown"})


# --- thinking and effort ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("budget", "level"),
    [(1024, "low"), (2048, "low"), (2049, "high"), (8192, "high"), (20000, "max"), (99000, "max")],
)
def test_thinking_budget_maps_onto_the_lowest_level_whose_cap_covers_it(budget: int, level: str) -> None:
    p = plan(body(max_tokens=100_000, thinking={"type": "enabled", "budget_tokens": budget}))
    assert p.gen.effort == level and p.gen.reasoning and p.show_thinking


@pytest.mark.parametrize(
    ("thinking", "message"),
    [({"type": "enabled", "budget_tokens": 1023}, "at least 1024"), ({"type": "enabled", "budget_tokens": 1000}, "")],
)
def test_thinking_budget_follows_anthropics_rules(thinking: dict[str, Any], message: str) -> None:
    error = refused(body(max_tokens=1000, thinking=thinking))
    assert error.param == "thinking.budget_tokens" and message in error.message
    error = refused(body(max_tokens=1500, thinking={"type": "enabled", "budget_tokens": 1500}))
    assert error.param == "thinking.budget_tokens" and "less than 'max_tokens'" in error.message


@pytest.mark.parametrize(("effort", "level"), [("low", "low"), ("medium", "high"), ("high", "high"), ("xhigh", "max")])
def test_output_config_effort_goes_through_the_effort_aliases(effort: str, level: str) -> None:
    thinking = {"type": "enabled", "budget_tokens": 30000}  # effort wins over the budget
    assert plan(body(max_tokens=50000, output_config={"effort": effort}, thinking=thinking)).gen.effort == level


def test_an_unknown_effort_names_output_config_effort() -> None:
    assert refused(body(output_config={"effort": "turbo"})).param == "output_config.effort"


@pytest.mark.parametrize("effort", ["low", "medium", "high", "xhigh", "max"])
def test_a_level_the_model_lacks_is_its_nearest(effort: str) -> None:
    # Claude Code sets the effort itself, turn by turn: kimi-k3 (max only) runs them all at max.
    assert plan({**body(output_config={"effort": effort}), "model": "kimi-k3"}).gen.effort == "max"


def test_adaptive_or_no_thinking_is_the_models_default_effort() -> None:
    assert plan(body()).gen.effort == plan(body(thinking={"type": "adaptive"})).gen.effort == "max"
    assert plan(body(thinking={"type": "adaptive", "display": "summarized"})).show_thinking


def test_disabled_thinking_follows_the_contract_profile() -> None:
    off = body(thinking={"type": "disabled"})
    assert plan(off).gen.reasoning  # evolink: reasoning is always on
    assert not plan(off, contracts=MOONSHOT_EVERYWHERE).gen.reasoning
    assert plan(body(thinking={"type": "adaptive"}), contracts=MOONSHOT_EVERYWHERE).gen.reasoning


# --- sampling ---------------------------------------------------------------------------------


def test_sampling_under_each_models_rules() -> None:
    plan(body(temperature=0.2, top_p=0.5, top_k=5))  # K3.1 ignores all three
    k3 = {**body(), "model": "kimi-k3"}
    plan({**k3, "temperature": 1.0, "top_p": 0.95})  # its fixed values
    assert refused({**k3, "temperature": 0.2}).param == "temperature"
    assert refused({**k3, "top_p": 0.5}).param == "top_p"
    error = refused({**k3, "top_k": 5})
    assert error.param == "top_k" and "fixed" in error.message
    assert refused({**k3, "top_k": 5}, contracts=MOONSHOT_EVERYWHERE).param == "top_k"


# --- tools and tool_choice --------------------------------------------------------------------


def test_custom_tools_become_function_tools() -> None:
    gen = plan(body(tools=[tool(), tool("strict_one", strict=True)])).gen
    assert [(t.name, t.kind, t.strict) for t in gen.tools] == [
        ("get_weather", "function", False),
        ("strict_one", "function", True),
    ]
    assert gen.tools[0].parameters == tool()["input_schema"] and gen.tools[0].description == "Weather."


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([tool(input_schema={"type": "object", "properties": {"a": {"type": "nope"}}})], "tools[0].input_schema"),
        ([tool(), tool()], "tools[1].name"),
        ([tool("1bad")], "tools[0].name"),
        ([tool(), {"type": "bash_20250124", "name": "bash"}], "tools[1].type"),
        ([{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}], "tools[0].type"),
    ],
)
def test_bad_tools_name_their_field(tools: list[dict[str, Any]], param: str) -> None:
    assert (refused(body(tools=tools)).param or "").startswith(param)


def test_a_strict_tool_with_unenforceable_keywords_names_its_input_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": "uri"}}}
    assert (
        refused(body(tools=[tool(input_schema=schema, strict=True)])).param
        == "tools[0].input_schema.properties.a.format"
    )
    plan(body(tools=[tool(input_schema=schema)]))  # not strict: the format is ignored


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        (None, ToolChoice("auto"), True),
        ({"type": "auto"}, ToolChoice("auto"), True),
        ({"type": "auto", "disable_parallel_tool_use": True}, ToolChoice("auto"), False),
        ({"type": "any"}, ToolChoice("required"), True),
        (
            {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            ToolChoice("named", "get_weather"),
            False,
        ),
        ({"type": "none"}, ToolChoice("none"), True),
    ],
)
def test_tool_choice(choice: dict[str, Any] | None, expected: ToolChoice, parallel: bool) -> None:
    gen = plan(body(tools=[tool()], tool_choice=choice)).gen
    assert gen.tool_choice == expected and gen.parallel_tool_calls is parallel
    assert len(gen.tools) == (0 if expected.mode == "none" else 1)


def test_tool_choice_must_name_a_tool_in_force() -> None:
    assert refused(body(tools=[tool()], tool_choice={"type": "tool", "name": "other"})).param == "tool_choice"
    assert refused(body(tool_choice={"type": "any"})).param == "tool_choice"


def test_the_web_search_tool() -> None:
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2, "allowed_domains": ["Example.com/"]}
    p = plan(body(tools=[tool(), search]))
    assert [(t.name, t.kind) for t in p.gen.tools] == [("get_weather", "function"), (WEB_SEARCH_NAME, "web_search")]
    assert p.web_search is not None and p.web_search.where == "tools[1]" and p.web_search.max_uses == 2
    assert p.web_search.allowed_domains == ("example.com",)
    assert plan(body(tools=[search], tool_choice={"type": "none"})).web_search is None
    both = {**search, "blocked_domains": ["b.com"]}
    assert refused(body(tools=[both])).param == "tools[0].blocked_domains"
    assert (
        refused(body(tools=[{**search, "allowed_domains": ["https://a.com"]}])).param == "tools[0].allowed_domains[0]"
    )
    assert refused(body(tools=[search, search])).param == "tools[1].name"
    assert wire_error(body(tools=[{**search, "max_uses": 0}])).param == "tools[0].max_uses"


# --- cache_control ----------------------------------------------------------------------------

ONE_HOUR = {"type": "ephemeral", "ttl": "1h"}


@pytest.mark.parametrize(
    "marked",
    [
        body(cache_control=ONE_HOUR),
        body(
            system=[
                {"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "t", "cache_control": ONE_HOUR},
            ]
        ),
        body(content=[{"type": "text", "text": "hi", "cache_control": ONE_HOUR}]),
        body(tools=[tool(cache_control=ONE_HOUR)]),
        body(
            content=[
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "r", "cache_control": ONE_HOUR}],
                }
            ]
        ),
    ],
)
def test_the_longest_cache_ttl_asked_anywhere_wins(marked: dict[str, Any]) -> None:
    assert plan(marked).gen.cache.ttl_label == "1h" and plan(marked).gen.cache.ttl_seconds == 3600


def test_cache_control_defaults_and_kimi_k3() -> None:
    assert plan(body()).gen.cache.ttl_label == "5m"
    assert plan(body(cache_control={"type": "ephemeral"})).gen.cache.ttl_label == "5m"
    k3 = plan({**body(cache_control=ONE_HOUR), "model": "kimi-k3"})  # no cache options: accepted, ignored
    assert k3.gen.cache.ttl_label == "5m" and not k3.gen.cache.separate_writes
    assert wire_error(body(cache_control={"type": "ephemeral", "ttl": "2h"})).param == "cache_control.ttl"


# --- fields this server cannot honour ----------------------------------------------------------


def test_fields_that_would_change_the_answer_are_refused_and_hints_ignored() -> None:
    assert refused(body(mcp_servers=[{"type": "url", "url": "https://m", "name": "m"}])).param == "mcp_servers"
    assert refused(body(container="cnt_1")).param == "container"
    plan(body(service_tier="auto", speed="fast", inference_geo="us", diagnostics={}, metadata={"user_id": "u", "x": 1}))


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (
            [{"type": "document", "source": {"type": "text", "data": "d", "media_type": "text/plain"}}],
            "messages[0].content[0].type",
        ),
        ([{"type": "search_result", "source": "s", "title": "t", "content": []}], "messages[0].content[0].type"),
        (
            [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "document"}]}],
            "messages[0].content[0].content[0].type",
        ),
        ([{"type": "frobnicate"}], "messages[0].content[0].type"),
        ([{"text": "no type"}], "messages[0].content[0].type"),
        ([{"type": "thinking", "thinking": "t", "signature": "s"}], "messages[0].content[0].type"),
        ([{"type": "image", "source": {"type": "file", "file_id": "f"}}], "messages[0].content[0].source"),
    ],
)
def test_unsupported_blocks_name_their_place(content: list[dict[str, Any]], param: str) -> None:
    assert refused(body(content=content), images=True).param == param


def test_other_400s_name_their_field() -> None:
    ask = {"role": "user", "content": "hi"}
    assert refused({**body(), "messages": []}).param == "messages"
    tool_use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    prefill = {**body(), "messages": [ask, {"role": "assistant", "content": [tool_use]}]}
    assert refused(prefill).param == "messages[1].content[0]"
    assert refused(body(stop_sequences=["a"] * 17)).param == "stop_sequences"
    assert refused(body(stop_sequences=["a", ""])).param == "stop_sequences[1]"
    assert refused({**body(), "max_tokens": 0}).param == "max_tokens"
    assert wire_error({"model": "kimi-k3.1-pro", "messages": [ask]}).param == "max_tokens"
    assert wire_error(body(max_tokens="10")).param == "max_tokens"
    assert wire_error(body(content=[{"type": "text", "text": 5}])).param == "messages[0].content[0].text"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "x"}}
    assert wire_error(body(content=[image])).param == "messages[0].content[0].source.media_type"
    assert wire_error(body(thinking={"type": "enabled"})).param == "thinking.budget_tokens"
    assert wire_error(body(tool_choice={"type": "tool"})).param == "tool_choice.name"
    assert wire_error(body(tools=[tool(input_schema=5)])).param == "tools[0].input_schema"


def test_images_need_a_model_that_sees() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    error = refused(body(content=[{"type": "text", "text": "what is it"}, image]))
    assert error.param == "messages[0].content[1]" and "cannot see images" in error.message


# --- output_config.format ---------------------------------------------------------------------


def test_output_config_format_is_structured_output() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    fmt = plan(body(output_config={"format": {"type": "json_schema", "schema": schema}})).gen.output_format
    assert fmt.kind == "json_schema" and fmt.schema == schema and fmt.strict
    k3 = {**body(output_config={"format": {"type": "json_schema", "schema": schema}}), "model": "kimi-k3"}
    assert refused(k3).param == "output_config.format"
    bad = {"type": "object", "properties": {"a": {"type": "string", "format": "uri"}}}
    error = refused(body(output_config={"format": {"type": "json_schema", "schema": bad}}))
    assert (error.param or "").startswith("output_config.format.schema")


# --- count_tokens -----------------------------------------------------------------------------


def test_count_tokens_builds_the_prompt_create_would() -> None:
    raw = claude_code_body()
    created = plan(raw).gen
    counted = count_plan({k: v for k, v in raw.items() if k not in ("max_tokens", "stream", "metadata")}).gen
    assert dataclasses.replace(counted, max_output_tokens=created.max_output_tokens) == created
    # Create's own rule on budget_tokens needs max_tokens, which count_tokens does not have.
    count_plan(
        {
            "model": "kimi-k3.1-pro",
            "messages": [{"role": "user", "content": "hi"}],
            "thinking": {"type": "enabled", "budget_tokens": 5000},
        }
    )
