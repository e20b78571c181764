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
NAMES = [
    "name",
    "title",
    "city",
    "count",
    "score",
    "tags",
    "active",
    "kind",
    "size",
    "note",
    "owner",
    "level",
    "items",
    "point",
    "ratio",
    "code",
    "when",
    "id",
    "extra",
    "meta",
]


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
    return {
        "anyOf": [
            _leaf(rng),
            {"type": "object", "properties": {"v": _leaf(rng)}, "required": ["v"], "additionalProperties": False},
        ]
    }


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
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def _with_defs(rng: random.Random) -> Schema:
    unit = {"enum": ["cm", "m", "km"]}
    point = {
        "type": "object",
        "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "unit": {"$ref": "#/$defs/unit"}},
        "required": ["x", "unit"],
        "additionalProperties": False,
    }
    root = _object(rng, 1, size=1)
    root["$defs"] = {"unit": unit, "point": point}
    root["properties"]["where"] = {"$ref": "#/$defs/point"}
    if rng.random() < 0.5:
        root["properties"]["path"] = {"type": "array", "items": {"$ref": "#/$defs/point"}, "maxItems": 2}
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


def run_corpus(schemas: list[Schema], request: Callable[[int, Schema], Outcome], workers: int = 8) -> list[str]:
    """Runs every schema through ``request`` (concurrently) and returns the failures."""
    with ThreadPoolExecutor(workers) as pool:
        outcomes = list(pool.map(lambda pair: request(*pair), enumerate(schemas)))
    failures = []
    for outcome in outcomes:
        why = check(schemas[outcome.index], outcome)
        if why:
            failures.append(f"schema #{outcome.index}: {why}")
    return failures


# Hostile input, for the fuzz tests: schemas a client may send to stall the grammar or the
# answer, and prompt texts that break naive line or character handling.
CATASTROPHIC_PATTERNS = (
    "^(a+)+$",
    "^(a|a)*$",
    "^(a*)*b$",
    "^((a+)+)+$",
    "^(\\w+\\s?)*$",
    "^(.*){50}$",
    "^(a?){30}a{30}$",
    "^[ab]*a[ab]{30}$",
    "(.*a){25}",
    "^(a{1000}){1000}$",
    "^\\p{L}{1000,4096}$",
    "^[\\s\\S]{4096}$",
    "^([a-zA-Z0-9])(([\\-.]|[_]+)?([a-zA-Z0-9]+))*(@){1}[a-z0-9]+[.]{1}(([a-z]{2,3})|([a-z]{2,3}[.]{1}[a-z]{2,3}))$",
)


def _holding(value: Schema, **extra: Any) -> Schema:
    return {"type": "object", "properties": {"v": value}, "required": ["v"], "additionalProperties": False, **extra}


REF_LOOPS: tuple[Schema, ...] = (
    # Recursion the answer can end (optional, or an empty array) and recursion it cannot.
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "additionalProperties": False},
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["kids"]},
    {
        "type": "object",
        "properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "minItems": 1}},
        "required": ["kids"],
        "additionalProperties": False,
    },
    {"type": "object", "additionalProperties": {"$ref": "#"}},
    _holding(
        {"$ref": "#/$defs/n"},
        **{
            "$defs": {
                "n": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {"n": {"$ref": "#/$defs/n"}},
                            "required": ["n"],
                            "additionalProperties": False,
                        },
                        {"type": "null"},
                    ]
                }
            }
        },
    ),
    # References that only lead to each other and never to a value.
    _holding({"$ref": "#/$defs/a"}, **{"$defs": {"a": {"$ref": "#/$defs/a"}}}),
    _holding(
        {"$ref": "#/$defs/a"},
        **{"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/c"}, "c": {"$ref": "#/$defs/a"}}},
    ),
    _holding({"$ref": "#/$defs/a"}, **{"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}}),
    _holding(
        {"$ref": "#/$defs/a"},
        **{
            "$defs": {
                "a": {"anyOf": [{"$ref": "#/$defs/b"}, {"$ref": "#/$defs/a"}]},
                "b": {"oneOf": [{"$ref": "#/$defs/a"}]},
            }
        },
    ),
)


def hostile_schemas() -> list[Schema]:
    """Every ``$ref`` loop above, and an object holding each catastrophic pattern."""
    patterns = [_holding({"type": "string", "pattern": p}) for p in CATASTROPHIC_PATTERNS]
    return [*REF_LOOPS, *patterns]


EDGE_TEXTS = (
    "line one\nline two\nline three",
    "windows\r\nline\r\nendings\r\n",
    "a lone\rcarriage return\r",
    "a\nb\nc\n" * 40,  # one token a character: many more tokens than characters / 4
    "\n\n\n",
    "e\u0301\u0301\u0301\u0301\u0301 combining marks" + "\u0301" * 50,
    "\u05e9\u05dc\u05d5\u05dd \u202eRTL override\u202c and \u0627\u0644\u0633\u0644\u0627\u0645",
    "zero\u200bwidth\u200c\u200d\ufeffjoiners\u2060",
    "astral \U0001f600\U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001d54f\U00010348",
    "controls \x01\x02\x07\x08\x0b\x0c\x1b[31m\x7f\x85 around",
    "\x00NUL first",  # NUL itself: JSON carries it as \u0000
    "\ud800 lone surrogate",  # travels as the \ud800 escape: a 400, never a crash
)
