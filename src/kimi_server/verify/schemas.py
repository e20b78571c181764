"""A small corpus of strict function schemas: each shape a constrained decoder must get right
(enums, booleans, bounded numbers, a pattern, nesting, a nullable union, a bounded array), with
a prompt that gives the model something to fill in."""

from __future__ import annotations

from typing import Any

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}

TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "Europe/Paris", "Asia/Tokyo"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


# (name, prompt, parameters): three requests cover the shapes, the arguments kept short.
CORPUS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "set_lamp",
        "Switch the lamp to night mode and dim it.",
        _obj(
            {"mode": {"type": "string", "enum": ["day", "night", "off"]}, "dim": {"type": "boolean"}}, ["mode", "dim"]
        ),
    ),
    (
        "book_table",
        "Book a table for 4 people at 19:30, budget 45.5 euros.",
        _obj(
            {
                "people": {"type": "integer", "minimum": 1, "maximum": 12},
                "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                "budget": {"type": "number", "minimum": 0, "maximum": 500},
            },
            ["people", "time", "budget"],
        ),
    ),
    (
        "add_contact",
        "Add Ada Lovelace, ada@example.com, to my contacts as a friend.",
        _obj(
            {
                "person": _obj(
                    {
                        "name": {"type": "string", "maxLength": 24},
                        "email": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]},
                    },
                    ["name", "email"],
                ),
                "tags": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["friend", "work", "family"]},
                    "maxItems": 2,
                },
            },
            ["person", "tags"],
        ),
    ),
]


def tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')}.",
            "parameters": parameters,
            "strict": True,
        },
    }
