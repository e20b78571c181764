"""Walking a JSON Schema beside a JSON value: the plain schemas a value may match (references
followed, ``anyOf``/``oneOf`` taken apart, ``allOf`` merged), the kinds of value each allows,
and the schema of an object's member or an array's item.

An approximation that serves closing a cut JSON answer (json_closing.py), whose every result is
checked against the whole schema afterwards: it only has to find the likely branch, not prove it.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

MAX_ALTERNATIVES = 16  # plain schemas one position is taken apart into
MAX_DEPTH = 12  # references and combinators followed from one position

_KIND_OF = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def _pointer(root: Any, ref: str) -> Any:
    """The target of a local reference ("#", "#/$defs/x"), or None."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def resolve(node: Any, root: Any, depth: int = 0) -> Schema | None:
    """``node`` with its ``$ref`` followed (merged with the keywords beside it); a boolean
    schema as ``{}`` (anything) or None (nothing)."""
    if node is True:
        return {}
    if not isinstance(node, dict) or depth > MAX_DEPTH:
        return None
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return node
    target = resolve(_pointer(root, ref), root, depth + 1)
    if target is None:
        return None
    rest = {k: v for k, v in node.items() if k != "$ref"}
    return merge(target, rest) if rest else target


def merge(a: Schema, b: Schema) -> Schema:
    """Both schemas at once, roughly: types intersected, properties and required joined."""
    out = dict(a)
    for key, value in b.items():
        if key == "type" and "type" in a:
            both = set(_types(a["type"])) & set(_types(value))
            out["type"] = [t for t in _types(value) if t in both]
        elif key == "properties" and isinstance(a.get(key), dict) and isinstance(value, dict):
            props = dict(a[key])
            for name, sub in value.items():
                props[name] = {"allOf": [props[name], sub]} if name in props else sub
            out[key] = props
        elif key == "required" and isinstance(a.get(key), list) and isinstance(value, list):
            out[key] = [*a[key], *(name for name in value if name not in a[key])]
        else:
            out[key] = value
    return out


def _types(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [t for t in value if isinstance(t, str)]


def alternatives(node: Any, root: Any, depth: int = 0) -> list[Schema]:
    """The plain schemas (no reference or combinator left) a value under ``node`` may match,
    in the schema's own order."""
    plain = resolve(node, root, depth)
    if plain is None or depth > MAX_DEPTH:
        return []
    base = {k: v for k, v in plain.items() if k not in ("anyOf", "oneOf", "allOf")}
    out = [base]
    for sub in plain.get("allOf") or ():
        out = [merge(left, right) for left in out for right in alternatives(sub, root, depth + 1)]
        out = out[:MAX_ALTERNATIVES]
    for word in ("anyOf", "oneOf"):
        options = plain.get(word)
        if isinstance(options, list):
            branches = [alt for sub in options for alt in alternatives(sub, root, depth + 1)]
            out = [merge(left, right) for left in out for right in branches][:MAX_ALTERNATIVES]
    return out


def kinds(node: Schema) -> set[str] | None:
    """The kinds of value (JSON types, "integer" apart) ``node`` allows; None: any."""
    values = allowed_values(node)
    if values is not None:
        return {_kind(v) for v in values}
    if "type" in node:
        return set(_types(node["type"]))
    if any(k in node for k in ("properties", "required", "additionalProperties")):
        return {"object"}
    if any(k in node for k in ("items", "prefixItems", "minItems", "maxItems")):
        return {"array"}
    if any(k in node for k in ("minLength", "maxLength", "pattern", "format")):
        return {"string"}
    if any(k in node for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return {"number"}
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float) and value.is_integer():
        return "integer"
    return _KIND_OF.get(type(value), "null")


def allows(node: Schema, kind: str) -> bool:
    """Whether ``node`` allows a value of ``kind`` (an integer is a number too)."""
    found = kinds(node)
    if found is None:
        return True
    return kind in found or (kind == "integer" and "number" in found) or (kind == "number" and "integer" in found)


def allowed_values(node: Schema) -> list[Any] | None:
    """The values ``const`` or ``enum`` allow; None: no such list."""
    if "const" in node:
        return [node["const"]]
    values = node.get("enum")
    return list(values) if isinstance(values, list) else None


def member(node: Schema, key: str) -> Any:
    """The schema of ``key``'s value in an object under ``node``; None: no such key allowed."""
    props = node.get("properties")
    if isinstance(props, dict) and key in props:
        return props[key]
    extra = node.get("additionalProperties", True)
    return None if extra is False else extra


def item(node: Schema, index: int) -> Any:
    """The schema of an array's item at ``index``; None: no such item allowed."""
    prefix = node.get("prefixItems")
    if isinstance(prefix, list) and index < len(prefix):
        return prefix[index]
    items = node.get("items", True)
    return None if items is False else items


def required(node: Schema) -> list[str]:
    names = node.get("required")
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
