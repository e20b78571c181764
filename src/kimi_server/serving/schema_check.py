"""Checks a client's JSON Schema before any grammar is built from it.

Engines constrain decoding with a grammar compiled from the schema. Two things can go wrong
there, and both must become a 400 that names the offending field instead of a stall or an
answer that silently ignores the schema:

- size: compile time and grammar size grow with the schema, so the limits below bound them;
- meaning: a ``strict`` schema promises that every answer validates, so it may only use the
  keywords the grammar can enforce. A non-strict schema may use others; they are ignored.

The limits are documented in ``docs/tools-and-structured-output.md``; keep the two in step.
"""

from __future__ import annotations

import json
import re
from typing import Any

import regex

from kimi_server.errors import InvalidRequestError

MAX_SCHEMA_BYTES = 32 * 1024  # one schema, serialized
MAX_TOTAL_SCHEMA_BYTES = 256 * 1024  # all schemas of one request
MAX_DEPTH = 12  # nested subschemas, counted through properties/items/anyOf/...
MAX_PROPERTIES = 128  # per object
MAX_ENUM = 256  # values in one enum
MAX_ALTERNATIVES = 32  # members of one anyOf/oneOf/allOf/prefixItems
MAX_COUNT = 4096  # minItems/maxItems/minLength/maxLength
MAX_PATTERN = 512  # characters in one pattern
MAX_REF_STEPS = 10_000  # references and combinator members followed to check for loops

TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
# Keywords that say nothing about valid values: allowed everywhere, strict or not.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$anchor",
        "contentMediaType",
    }
)
# Keywords the grammar enforces; a strict schema may use these and nothing else.
ENFORCED = frozenset(
    {
        "type",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "minLength",
        "maxLength",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties")
_COUNTS = ("minItems", "maxItems", "minLength", "maxLength")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# Constructs the grammar's regex engine (Rust ``regex``) lacks; Python's ``re`` would accept them.
_UNSUPPORTED_REGEX = re.compile(r"\(\?<?[=!]|\\[1-9]|\\k<")


def _bad(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid schema at '{param}': {message}", param=param, code="invalid_schema")


def schema_size(schema: Any) -> int:
    return len(json.dumps(schema, ensure_ascii=False, separators=(",", ":")))


def check_schema(schema: Any, param: str, *, strict: bool, root_object: bool = False) -> None:
    """Raises ``InvalidRequestError`` naming the first problem found, or returns."""
    if not isinstance(schema, dict):
        raise _bad(param, "a JSON Schema must be an object.")
    if schema_size(schema) > MAX_SCHEMA_BYTES:
        raise _bad(param, f"the schema is larger than {MAX_SCHEMA_BYTES} bytes.")
    if root_object and schema.get("type", "object") != "object":
        raise _bad(f"{param}.type", "the schema must describe a JSON object ('type': 'object').")
    _Walker(schema, strict).walk(schema, param, 0)


class _Walker:
    def __init__(self, root: dict[str, Any], strict: bool) -> None:
        self.root = root
        self.strict = strict
        self.ref_steps = 0
        self.grounded: set[int] = set()  # nodes known to describe a value, whatever the path

    def walk(self, node: Any, path: str, depth: int) -> None:
        if isinstance(node, bool):
            return  # true / false are valid schemas
        if not isinstance(node, dict):
            raise _bad(path, "a subschema must be an object or a boolean.")
        if depth > MAX_DEPTH:
            raise _bad(path, f"schemas may nest at most {MAX_DEPTH} levels deep.")
        for key in node:
            if key not in ENFORCED and key not in ANNOTATIONS and self.strict:
                raise _bad(
                    f"{path}.{key}",
                    f"'{key}' cannot be enforced while decoding, so it is not allowed with "
                    "'strict': true. Remove it, or set 'strict': false to have it ignored.",
                )
        self._type(node, path)
        self._values(node, path)
        self._counts(node, path)
        self._bounds(node, path)
        self._strings(node, path)
        self._ref(node, path)
        self._children(node, path, depth)

    def _type(self, node: dict[str, Any], path: str) -> None:
        if "type" not in node:
            return
        kind = node["type"]
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or not all(isinstance(k, str) and k in TYPES for k in kinds):
            raise _bad(f"{path}.type", f"unknown type {kind!r}; use one of {sorted(TYPES)}.")

    def _values(self, node: dict[str, Any], path: str) -> None:
        if "enum" in node:
            values = node["enum"]
            if not isinstance(values, list) or not values:
                raise _bad(f"{path}.enum", "'enum' must be a non-empty array.")
            if len(values) > MAX_ENUM:
                raise _bad(f"{path}.enum", f"'enum' may list at most {MAX_ENUM} values.")
        if "required" in node:
            req = node["required"]
            if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
                raise _bad(f"{path}.required", "'required' must be an array of strings.")

    def _counts(self, node: dict[str, Any], path: str) -> None:
        for key in _COUNTS:
            if key in node:
                value = node[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise _bad(f"{path}.{key}", f"'{key}' must be a non-negative integer.")
                if value > MAX_COUNT:
                    raise _bad(f"{path}.{key}", f"'{key}' may be at most {MAX_COUNT}.")
        for low, high in (("minItems", "maxItems"), ("minLength", "maxLength")):
            if node.get(low, 0) > node.get(high, MAX_COUNT):
                raise _bad(f"{path}.{low}", f"'{low}' is larger than '{high}'.")

    def _bounds(self, node: dict[str, Any], path: str) -> None:
        for key in _BOUNDS:
            if key in node:
                value = node[key]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise _bad(f"{path}.{key}", f"'{key}' must be a number.")
        lo = node.get("minimum", node.get("exclusiveMinimum"))
        hi = node.get("maximum", node.get("exclusiveMaximum"))
        if isinstance(lo, int | float) and isinstance(hi, int | float) and lo > hi:
            raise _bad(path, "the lower bound is above the upper bound; no number fits.")

    def _strings(self, node: dict[str, Any], path: str) -> None:
        if "pattern" in node:
            pattern = node["pattern"]
            where = f"{path}.pattern"
            if not isinstance(pattern, str):
                raise _bad(where, "'pattern' must be a string.")
            if len(pattern) > MAX_PATTERN:
                raise _bad(where, f"'pattern' may be at most {MAX_PATTERN} characters.")
            if _UNSUPPORTED_REGEX.search(pattern):
                raise _bad(where, "lookarounds and backreferences are not supported.")
            # The grammar engine (LLGuidance) reads Rust-regex syntax, Unicode classes such as
            # \p{L} included; the ``regex`` module reads those too, where Python's ``re`` does not.
            # What it accepts and the grammar engine still refuses fails the grammar probe (400).
            try:
                regex.compile(pattern)
            except regex.error as exc:
                raise _bad(where, f"the regular expression does not compile: {exc}.") from None
            except (RecursionError, OverflowError, ValueError):
                raise _bad(where, "the regular expression does not compile.") from None
        if "format" in node and self.strict and node["format"] not in FORMATS:
            raise _bad(
                f"{path}.format",
                f"format {node['format']!r} is not supported; use one of {sorted(FORMATS)}.",
            )

    def _ref(self, node: dict[str, Any], path: str) -> None:
        if "$ref" not in node:
            return
        ref = node["$ref"]
        where = f"{path}.$ref"
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise _bad(where, "only local references ('#/$defs/...') are supported.")
        target = self._resolve(ref)
        if target is None:
            raise _bad(where, f"the reference {ref!r} does not resolve within the schema.")
        # A reference that only leads back to itself (through other references, allOf, or
        # anyOf/oneOf members that all loop) describes no value: the grammar cannot end it.
        if not self._grounded(target, {id(node)}, where):
            raise _bad(where, f"the reference {ref!r} loops back to itself without describing a value.")

    def _resolve(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        target: Any = self.root
        for raw in ref[1:].split("/")[1:]:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            else:
                return None
        return target

    def _grounded(self, node: Any, path: set[int], where: str) -> bool:
        """Whether ``node`` describes some value without following a reference back onto
        ``path`` (the nodes being resolved). Structure (properties, items) ends the search:
        recursion through it nests values, and the grammar bounds that."""
        if not isinstance(node, dict) or id(node) in self.grounded:
            return True
        self.ref_steps += 1
        if self.ref_steps > MAX_REF_STEPS:
            raise _bad(where, "the references are too entangled to check; simplify them.")
        if id(node) in path:
            return False
        path = path | {id(node)}
        if "$ref" in node:
            target = self._resolve(node["$ref"])
            if target is not None and not self._grounded(target, path, where):
                return False
        members = node.get("allOf")
        if isinstance(members, list) and not all(self._grounded(m, path, where) for m in members):
            return False
        for key in ("anyOf", "oneOf"):
            members = node.get(key)
            if isinstance(members, list) and members and not any(self._grounded(m, path, where) for m in members):
                return False
        self.grounded.add(id(node))  # a finite way to a value exists: it holds on any path
        return True

    def _children(self, node: dict[str, Any], path: str, depth: int) -> None:
        for key in _SUBSCHEMA_MAPS:
            if key in node:
                self._schema_map(node[key], key, path, depth)
        for key in _SUBSCHEMA_LISTS:
            if key in node:
                self._schema_list(node[key], key, path, depth)
        for key in _SUBSCHEMA_ONE:
            if key in node:
                self.walk(node[key], f"{path}.{key}", depth + 1)

    def _schema_map(self, children: Any, key: str, path: str, depth: int) -> None:
        """``properties``, ``$defs`` or ``definitions``: subschemas by name."""
        if not isinstance(children, dict):
            raise _bad(f"{path}.{key}", f"'{key}' must be an object of schemas.")
        if key == "properties" and len(children) > MAX_PROPERTIES:
            raise _bad(f"{path}.{key}", f"an object may have at most {MAX_PROPERTIES} properties.")
        for name, child in children.items():
            self.walk(child, f"{path}.{key}.{name}", depth + 1)

    def _schema_list(self, members: Any, key: str, path: str, depth: int) -> None:
        """``anyOf``, ``oneOf``, ``allOf`` or ``prefixItems``: subschemas by position."""
        if not isinstance(members, list) or not members:
            raise _bad(f"{path}.{key}", f"'{key}' must be a non-empty array of schemas.")
        if len(members) > MAX_ALTERNATIVES:
            raise _bad(f"{path}.{key}", f"'{key}' may have at most {MAX_ALTERNATIVES} members.")
        for i, child in enumerate(members):
            self.walk(child, f"{path}.{key}[{i}]", depth + 1)
