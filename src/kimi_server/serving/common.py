"""Request-building pieces shared by the Chat Completions and Responses endpoints."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kimi_server.engines.base import Engine
from kimi_server.errors import InvalidRequestError, NotFoundError
from kimi_server.policy.catalogue import ModelSpec
from kimi_server.policy.rules import CacheOptions
from kimi_server.serving.types import (
    CachePolicy,
    OutputFormat,
    ReasoningBudget,
    ToolChoice,
    ToolSpec,
)

TTL_SECONDS = {"5m": 300, "1h": 3600}
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


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


def check_tools(
    tools: list[ToolSpec], param: str, where: Sequence[str] | None = None
) -> None:
    """``where`` names each tool's place when it is not ``param[i]`` (flattened namespaces)."""
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.kind == "web_search":
            continue
        at = where[i] if where is not None else f"{param}[{i}]"
        if not TOOL_NAME.match(tool.name):
            raise InvalidRequestError(
                f"Invalid '{at}' name {tool.name!r}: use 1-64 letters, digits, '_' or '-'.",
                param=f"{at}.name",
            )
        if tool.name in seen:
            raise InvalidRequestError(
                f"Duplicate tool name {tool.name!r} in '{param}'.", param=f"{at}.name"
            )
        seen.add(tool.name)
        params = tool.parameters
        if params is not None and params.get("type", "object") != "object":
            raise InvalidRequestError(
                f"'{at}' parameters must be a JSON Schema of type 'object'.",
                param=f"{at}.parameters",
            )


def check_web_search(tools: list[ToolSpec], param: str) -> None:
    for i, tool in enumerate(tools):
        if tool.kind == "web_search":
            raise InvalidRequestError(
                f"'{param}[{i}]' asks for web search, which is not enabled on this server: it "
                "fetches pages from the internet, which an operator must allow first.",
                param=f"{param}[{i}]",
                code="unsupported_tool",
            )


def check_tool_choice(choice: ToolChoice, tools: list[ToolSpec], param: str) -> None:
    names = {t.name for t in tools if t.kind != "web_search"}
    if choice.mode == "required" and not tools:
        raise InvalidRequestError(
            f"'{param}' is 'required' but no tools were given.", param=param
        )
    if choice.mode == "named" and choice.name not in names:
        raise InvalidRequestError(
            f"'{param}' names the function {choice.name!r}, which is not among the tools.",
            param=param,
        )


def check_output_format(fmt: OutputFormat, param: str) -> None:
    if fmt.kind == "json_schema":
        schema = fmt.schema
        if not isinstance(schema, dict):
            raise InvalidRequestError(f"'{param}' needs a 'schema' object.", param=param)


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())
