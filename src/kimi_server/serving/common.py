"""Request-building pieces shared by the Chat Completions and Responses endpoints."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kimi_server.engines.base import Engine
from kimi_server.engines.types import (
    CachePolicy,
    Finish,
    OutputFormat,
    ReasoningBudget,
    ToolChoice,
    ToolSpec,
)
from kimi_server.errors import InvalidRequestError, NotFoundError
from kimi_server.policy import rules
from kimi_server.policy.catalogue import ModelSpec
from kimi_server.policy.profiles import DEFAULT_PROFILE, ContractProfile
from kimi_server.policy.rules import CacheOptions
from kimi_server.serving.schema_check import (
    MAX_TOTAL_SCHEMA_BYTES,
    check_schema,
    schema_size,
)

TTL_SECONDS = {"5m": 300, "1h": 3600}


@dataclass(frozen=True)
class EngineSet:
    """Which engine serves each public model id."""

    by_model: Mapping[str, Engine]

    def served(self) -> frozenset[str]:
        return frozenset(self.by_model)

    def for_model(self, model_id: str) -> Engine:
        engine = self.by_model.get(model_id)
        if engine is None:
            raise NotFoundError(
                f"The model '{model_id}' does not exist or you do not have access to it.",
                param="model",
            )
        return engine

    def unique(self) -> list[Engine]:
        seen: dict[int, Engine] = {}
        for engine in self.by_model.values():
            seen.setdefault(id(engine), engine)
        return list(seen.values())


def budget_for(budgets: Mapping[str, Any], effort: str) -> ReasoningBudget:
    b = budgets[effort]
    return ReasoningBudget(floor=b.floor, cap=b.cap)


def cache_policy(spec: ModelSpec, options: CacheOptions, namespace: str) -> CachePolicy:
    return CachePolicy(
        ttl_seconds=TTL_SECONDS[options.ttl],
        namespace=namespace,
        separate_writes=spec.separates_cache_writes,
        ttl_label=options.ttl,
    )


MAX_TOOLS = 128
# The one custom (freeform) tool whose input grammar this server knows; see grammar docs.
CUSTOM_TOOLS = frozenset({"apply_patch"})
SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_tools(
    tools: list[ToolSpec],
    param: str,
    where: Sequence[str] | None = None,
    *,
    profile: ContractProfile = DEFAULT_PROFILE,
    schema_field: str = "parameters",
) -> None:
    """All the tools in force: the request's and those system messages declare. ``where``
    names each tool's place when it is not ``tool.where`` or ``param[i]`` (namespaces);
    ``schema_field``: the wire name of a tool's schema (Messages: ``input_schema``)."""
    places = [
        where[i] if where is not None and i < len(where) else tool.where or f"{param}[{i}]"
        for i, tool in enumerate(tools)
    ]
    if len(tools) > MAX_TOOLS:
        raise InvalidRequestError(
            f"At most {MAX_TOOLS} tools may be in force (the request's and those its system "
            f"messages declare); {len(tools)} were given.",
            param=param if places[MAX_TOOLS].startswith(param) else places[MAX_TOOLS],
        )
    seen: dict[str, str] = {}
    total = 0
    for tool, at in zip(tools, places, strict=True):
        if tool.kind == "web_search":
            continue
        rules.check_tool_name(profile, tool.name, param=f"{at}.name")
        if tool.name in seen:
            raise InvalidRequestError(
                f"Duplicate tool name {tool.name!r}: '{at}' declares it again after '{seen[tool.name]}'.",
                param=f"{at}.name",
            )
        seen[tool.name] = at
        if not isinstance(tool.strict, bool):
            raise InvalidRequestError(f"'{at}.strict' must be a boolean.", param=f"{at}.strict")
        if tool.kind == "custom":
            if tool.name not in CUSTOM_TOOLS:
                raise InvalidRequestError(
                    f"Custom tool {tool.name!r} in '{at}' is not supported: the only "
                    f"custom tool is {', '.join(sorted(CUSTOM_TOOLS))}.",
                    param=f"{at}.name",
                    code="unsupported_tool",
                )
            continue
        if tool.parameters is not None:
            check_schema(tool.parameters, f"{at}.{schema_field}", strict=tool.strict, root_object=True)
            total += schema_size(tool.parameters)
    if total > MAX_TOTAL_SCHEMA_BYTES:
        raise InvalidRequestError(
            f"The tool parameter schemas in '{param}' add up to more than {MAX_TOTAL_SCHEMA_BYTES} bytes.",
            param=param,
            code="invalid_schema",
        )


def check_tool_choice(choice: ToolChoice, tools: list[ToolSpec], param: str) -> None:
    """``tools``: every tool in force, system-message declarations included."""
    names = {t.name for t in tools if t.kind != "web_search"}
    if choice.mode == "required" and not tools:
        raise InvalidRequestError(
            f"'{param}' is 'required' but no tools were given (in 'tools' or a system message).",
            param=param,
        )
    if choice.mode == "named" and choice.name not in names:
        raise InvalidRequestError(
            f"'{param}' names the function {choice.name!r}, which is not among the tools.",
            param=param,
        )


def check_output_format(fmt: OutputFormat, param: str) -> None:
    """``param`` names the object holding ``name``/``schema``/``strict`` (for example
    ``response_format.json_schema`` in chat, ``text.format`` in Responses)."""
    if fmt.kind != "json_schema":
        return
    if not fmt.name:
        raise InvalidRequestError(f"Missing required parameter: '{param}.name'.", param=f"{param}.name")
    if not SCHEMA_NAME.match(fmt.name):
        raise InvalidRequestError(
            f"Invalid '{param}.name': use 1-64 letters, digits, '_' or '-'.", param=f"{param}.name"
        )
    if not isinstance(fmt.strict, bool):
        raise InvalidRequestError(f"'{param}.strict' must be a boolean.", param=f"{param}.strict")
    if not isinstance(fmt.schema, dict):
        raise InvalidRequestError(
            f"Missing required parameter: '{param}.schema' (a JSON Schema object).",
            param=f"{param}.schema",
        )
    check_schema(fmt.schema, f"{param}.schema", strict=fmt.strict)


def stopped_by(finish: Finish) -> dict[str, str]:
    """The field a door sets beside its "length" ending where the repetition guard caused it,
    so a client can tell a looping answer from one the output cap cut (raising the cap would
    not help it). The reason fields keep the values the official SDKs know."""
    return {"stopped_by": "repetition_guard"} if finish.looped else {}


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())
