"""A corpus of varied strict JSON Schemas, generated from a fixed seed, and a runner that checks
model output against them.

Every schema is an object at the root (so it also serves as tool parameters), strict-compatible
and bounded (strings, arrays and numbers have limits) so that the tiny test model finishes its
answers within a small token budget. The runner does not know about endpoints: it takes a
function that performs one request, so a Responses variant is a few lines.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

Schema = dict[str, Any]
WORDS = ["alpha", "beta", "gamma", "delta", "red", "green", "blue", "north", "south", "small"]
NAMES = ["name", "title", "city", "count", "score", "tags", "active", "kind", "size", "note",
         "owner", "level", "items", "point", "ratio", "code", "when", "id", "extra", "meta"]


def _string(rng: random.Random) -> Schema:
    pick = rng.randrange(6)
    if pick == 0:
        return {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2}$"}
    if pick == 1:
        return {"type": "string", "format": rng.choice(["date", "time", "uuid", "ipv4"])}
    if pick == 2:
        return {"type": "string", "minLength": 2, "maxLength": rng.randint(3, 12)}
    return {"type": "string", "maxLength": rng.randint(4, 16), "description": "short text"}


def _leaf(rng: random.Random) -> Schema:
    pick = rng.randrange(9)
    if pick == 0:
        return {"type": "integer", "minimum": rng.randint(-50, 0), "maximum": rng.randint(1, 500)}
    if pick == 1:
        low = rng.randint(0, 5)
        return {"type": "number", "minimum": low, "exclusiveMaximum": low + rng.randint(1, 10)}
    if pick == 2:
        return {"type": "boolean"}
    if pick == 3:
        return {"enum": rng.sample(WORDS, rng.randint(2, 4))}
    if pick == 4:
        return {"const": rng.choice(WORDS)}
    if pick == 5:
        return {"type": ["string", "null"], "maxLength": 8}
    if pick == 6:
        return {"type": "integer", "exclusiveMinimum": 0, "maximum": 9}
    return _string(rng)


def _array(rng: random.Random, depth: int) -> Schema:
    if rng.random() < 0.2:
        return {"type": "array", "prefixItems": [_leaf(rng), _leaf(rng)], "items": False}
    item = _leaf(rng) if depth > 1 or rng.random() < 0.6 else _object(rng, depth + 1)
    low = rng.randint(0, 1)
    return {"type": "array", "items": item, "minItems": low, "maxItems": low + rng.randint(1, 2)}


def _any_of(rng: random.Random) -> Schema:
    return {"anyOf": [_leaf(rng), {"type": "object", "properties": {"v": _leaf(rng)},
                                   "required": ["v"], "additionalProperties": False}]}


def _value(rng: random.Random, depth: int) -> Schema:
    pick = rng.random()
    if depth < 2 and pick < 0.2:
        return _object(rng, depth + 1)
    if depth < 3 and pick < 0.35:
        return _array(rng, depth)
    if pick < 0.42:
        return _any_of(rng)
    return _leaf(rng)


def _object(rng: random.Random, depth: int, size: int | None = None) -> Schema:
    names = rng.sample(NAMES, size or rng.randint(1, 3))
    props = {n: _value(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.7] or names[:1]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


def _with_defs(rng: random.Random) -> Schema:
    unit = {"enum": ["cm", "m", "km"]}
    point = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0,
             "maximum": 99}, "unit": {"$ref": "#/$defs/unit"}}, "required": ["x", "unit"],
             "additionalProperties": False}
    root = _object(rng, 1, size=1)
    root["$defs"] = {"unit": unit, "point": point}
    root["properties"]["where"] = {"$ref": "#/$defs/point"}
    if rng.random() < 0.5:
        root["properties"]["path"] = {"type": "array", "items": {"$ref": "#/$defs/point"},
                                      "maxItems": 2}
    root["required"] = [*root["required"], "where"]
    return root


def corpus(n: int = 120, seed: int = 20261129) -> list[Schema]:
    """``n`` schemas; every fifth uses ``$defs``/``$ref``, the rest mix objects, arrays, enums,
    bounded numbers, patterns, formats, unions and optional fields."""
    rng = random.Random(seed)
    out: list[Schema] = []
    for i in range(n):
        schema = _with_defs(rng) if i % 5 == 4 else _object(rng, 0, size=rng.randint(1, 4))
        out.append(schema)
    return out


def features(schema: Any) -> set[str]:
    """The keywords, types and formats a schema uses anywhere (property names excluded)."""
    found: set[str] = set()
    if isinstance(schema, list):
        for item in schema:
            found |= features(item)
    elif isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("properties", "$defs"):
                for sub in value.values():
                    found |= features(sub)
                continue
            if key == "type":
                found.add(f"type:{json.dumps(value)}")
            elif key == "format":
                found.add(f"format:{value}")
            elif key == "items" and isinstance(value, dict) and value.get("type") == "object":
                found.add("items:object")
            found.add(key)
            found |= features(value)
    return found


def representative(schemas: list[Schema], size: int = 16) -> list[Schema]:
    """A subset that uses every feature the whole corpus uses (greedy cover, lowest index first
    on ties), topped up with evenly spaced schemas to ``size``; in corpus order."""
    wanted = set().union(*(features(s) for s in schemas))
    chosen: list[int] = []
    while wanted:
        best = max(range(len(schemas)), key=lambda i: (len(features(schemas[i]) & wanted), -i))
        chosen.append(best)
        wanted -= features(schemas[best])
    step = max(1, len(schemas) // size)
    for i in range(0, len(schemas), step):
        if len(chosen) >= size:
            break
        if i not in chosen:
            chosen.append(i)
    return [schemas[i] for i in sorted(chosen)]


@dataclass(frozen=True)
class Outcome:
    index: int
    text: str | None  # the JSON text the endpoint returned (an answer or call arguments)
    finish: str
    error: str | None = None


def check(schema: Schema, outcome: Outcome) -> str | None:
    """Why the outcome fails its schema, or None."""
    if outcome.error:
        return outcome.error
    if outcome.text is None:
        return f"no output (finish {outcome.finish})"
    try:
        value = json.loads(outcome.text)
    except ValueError as exc:
        return f"not JSON ({exc}; finish {outcome.finish}): {outcome.text[:200]!r}"
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    errors = [e.message for e in validator.iter_errors(value)]
    return f"invalid: {errors[:3]} in {outcome.text[:200]!r}" if errors else None


def run_corpus(
    schemas: list[Schema], request: Callable[[int, Schema], Outcome], workers: int = 8
) -> list[str]:
    """Runs every schema through ``request`` (concurrently) and returns the failures."""
    with ThreadPoolExecutor(workers) as pool:
        outcomes = list(pool.map(lambda pair: request(*pair), enumerate(schemas)))
    failures = []
    for outcome in outcomes:
        why = check(schemas[outcome.index], outcome)
        if why:
            failures.append(f"schema #{outcome.index}: {why}")
    return failures
