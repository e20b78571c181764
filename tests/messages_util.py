"""Shared pieces of the Messages tests: plans built as the server builds them, and a request
shaped like the one Claude Code 2.1.328 sends."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pytest

from kimi_server.errors import InvalidRequestError
from kimi_server.policy.profiles import ContractProfile
from kimi_server.protocol.messages import CountTokensRequest, MessagesRequest
from kimi_server.serving.messages_request import MessagesPlan, build_count_tokens_plan, build_messages_plan
from kimi_server.serving.sealing import Sealer
from kimi_server.settings_tables import EffortBudget

SEALER = Sealer(os.urandom(32))
KEY = "key-a"
SERVED = frozenset({"kimi-k3.1-pro", "kimi-k3.1-pro-highspeed", "kimi-k3"})
ALIASES = {"claude-haiku-4-5": "kimi-k3.1-pro-highspeed", "claude-opus-4-1": "kimi-k3.1-pro", "claude-gone": "kimi-x"}
# Levels of a real deployment's size, so thinking.budget_tokens lands on each of them.
BUDGETS = {
    "low": EffortBudget(floor=512, cap=2048),
    "high": EffortBudget(floor=2048, cap=8192),
    "max": EffortBudget(floor=8192, cap=32768),
}


def body(*, content: Any = "Hello", **fields: Any) -> dict[str, Any]:
    return {"model": "kimi-k3.1-pro", "max_tokens": 1000, "messages": [{"role": "user", "content": content}], **fields}


def plan(
    raw: dict[str, Any],
    *,
    images: bool = False,
    key: str = KEY,
    contracts: Mapping[str, ContractProfile] | None = None,
    aliases: Mapping[str, str] = ALIASES,
) -> MessagesPlan:
    return build_messages_plan(
        MessagesRequest.model_validate(raw),
        served=SERVED,
        budgets=BUDGETS,
        key_id=key,
        accepts_images=images,
        sealer=SEALER,
        contracts=contracts,
        aliases=aliases,
    )


def count_plan(raw: dict[str, Any], **kw: Any) -> MessagesPlan:
    return build_count_tokens_plan(
        CountTokensRequest.model_validate(raw),
        served=SERVED,
        budgets=BUDGETS,
        key_id=KEY,
        accepts_images=False,
        sealer=SEALER,
        aliases=ALIASES,
        **kw,
    )


def refused(raw: dict[str, Any], **kw: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        plan(raw, **kw)
    return caught.value


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    }


def _tool(name: str, properties: dict[str, Any], required: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": f"The {name} tool.", "input_schema": _schema(properties, required), **extra}


STRING = {"type": "string"}
NUMBER = {"type": "number"}
BOOLEAN = {"type": "boolean"}


def claude_code_tools() -> list[dict[str, Any]]:
    """Twelve tools in Claude Code's manner: draft-07 schemas, hyphenated property names,
    formats the grammar ignores, nested arrays; one deferred, the last one cache-marked."""
    todo = {
        "type": "object",
        "properties": {
            "content": {"type": "string", "minLength": 1},
            "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
            "activeForm": {"type": "string", "minLength": 1},
        },
        "required": ["content", "status", "activeForm"],
        "additionalProperties": False,
    }
    edit = {
        "type": "object",
        "properties": {
            "old_string": STRING,
            "new_string": STRING,
            "replace_all": {"type": "boolean", "default": False},
        },
        "required": ["old_string", "new_string"],
        "additionalProperties": False,
    }
    grep = {
        "pattern": STRING,
        "path": STRING,
        "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
        "-i": BOOLEAN,
        "-n": BOOLEAN,
        "-A": NUMBER,
        "head_limit": NUMBER,
    }
    return [
        _tool("Task", {"description": STRING, "prompt": STRING, "subagent_type": STRING}, ["description", "prompt"]),
        _tool("Bash", {"command": STRING, "timeout": NUMBER, "run_in_background": BOOLEAN}, ["command"]),
        _tool("Glob", {"pattern": STRING, "path": STRING}, ["pattern"]),
        _tool("Grep", grep, ["pattern"]),
        _tool("Read", {"file_path": STRING, "offset": NUMBER, "limit": NUMBER}, ["file_path"]),
        _tool("Edit", {"file_path": STRING, "old_string": STRING, "new_string": STRING}, ["file_path"]),
        _tool(
            "MultiEdit", {"file_path": STRING, "edits": {"type": "array", "items": edit, "minItems": 1}}, ["file_path"]
        ),
        _tool("Write", {"file_path": STRING, "content": STRING}, ["file_path", "content"]),
        _tool("WebFetch", {"url": {"type": "string", "format": "uri"}, "prompt": STRING}, ["url", "prompt"]),
        _tool("TodoWrite", {"todos": {"type": "array", "items": todo}}, ["todos"]),
        _tool("WebSearch", {"query": {"type": "string", "minLength": 2}}, ["query"], defer_loading=True),
        _tool("ExitPlanMode", {"plan": STRING}, ["plan"], cache_control={"type": "ephemeral"}),
    ]


def claude_code_body() -> dict[str, Any]:
    """What Claude Code 2.1.328 sends on a default ``--print`` run, in shape."""
    mark = {"type": "ephemeral"}
    return {
        "model": "claude-opus-4-1",
        "max_tokens": 32000,
        "stream": True,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "metadata": {"user_id": '{"device_id":"d1","account_uuid":"","session_id":"s1"}'},
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328", "cache_control": mark},
            {"type": "text", "text": "You are Claude Code, a CLI for coding.", "cache_control": mark},
            {"type": "text", "text": "Follow the user's instructions. " * 400, "cache_control": mark},
        ],
        "messages": [
            {"role": "system", "content": "The working directory is /work/project."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>Context.</system-reminder>"},
                    {"type": "text", "text": "Write hello.txt", "cache_control": mark},
                ],
            },
        ],
        "tools": claude_code_tools(),
    }
