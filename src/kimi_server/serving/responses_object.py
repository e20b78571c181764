"""The Responses response object: output, usage and the request's settings echoed back.

Fields the stateless server never varies are fixed here: ``store`` and ``background`` false,
``previous_response_id`` and ``conversation`` null (the Kimi contract), and the Open Responses
fields this server has no knob for at their neutral values.
"""

from __future__ import annotations

from typing import Any

from kimi_server.engines.types import Usage
from kimi_server.serving.responses_request import ResponsesPlan


def usage_dict(usage: Usage) -> dict[str, Any]:
    """The same accounting as chat, under the Responses names."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def response_object(
    response_id: str,
    created_at: int,
    status: str,
    plan: ResponsesPlan,
    *,
    output: list[dict[str, Any]],
    completed_at: int | None = None,
    incomplete_details: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    echo = plan.echo
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "completed_at": completed_at,
        "status": status,
        "incomplete_details": incomplete_details,
        "model": plan.gen.model,
        "previous_response_id": None,
        "instructions": echo["instructions"],
        "output": output,
        "error": error,
        "tools": echo["tools"],
        "tool_choice": echo["tool_choice"],
        "truncation": "disabled",
        "parallel_tool_calls": echo["parallel_tool_calls"],
        "text": echo["text"],
        "top_p": echo["top_p"],
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": 0,
        "temperature": echo["temperature"],
        "reasoning": echo["reasoning"],
        "usage": usage,
        "max_output_tokens": echo["max_output_tokens"],
        "max_tool_calls": None,
        "store": False,
        "background": False,
        "service_tier": "default",
        "metadata": echo["metadata"],
        "safety_identifier": echo["safety_identifier"],
        "prompt_cache_key": echo["prompt_cache_key"],
        "conversation": None,
        "prompt_cache_options": echo["prompt_cache_options"],
    }
