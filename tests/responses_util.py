"""Helpers shared by the Responses tests: reading an SSE body back into events."""

from __future__ import annotations

import json
from typing import Any


def parse_sse(body: str) -> list[dict[str, Any]]:
    """Each frame must be exactly ``event: <type>`` then one ``data:`` line whose type matches."""
    events: list[dict[str, Any]] = []
    for frame in body.split("\n\n"):
        if not frame.strip() or frame.startswith(":"):
            continue  # an empty frame, or a comment (a keep-alive), which SSE clients skip
        lines = frame.split("\n")
        assert len(lines) == 2, f"a frame is one event line and one data line: {frame!r}"
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        event = json.loads(lines[1].removeprefix("data: "))
        assert event["type"] == lines[0].removeprefix("event: ")
        events.append(event)
    return events


BASE: dict[str, Any] = {"model": "kimi-k3.1-pro", "reasoning": {"effort": "low"}}


def body(**fields: Any) -> dict[str, Any]:
    return {**BASE, "input": "Say hello.", **fields}


def weather_tool(name: str = "get_weather") -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
