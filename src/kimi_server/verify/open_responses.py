"""Validation against the Open Responses specification shipped with the package."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC = Path(__file__).resolve().parent / "spec" / "open-responses.openapi.json"
URN = "urn:open-responses"


@cache
def _document() -> tuple[Registry, dict[str, Any]]:
    doc: dict[str, Any] = json.loads(SPEC.read_text())
    fmt = doc["components"]["schemas"]["JsonSchemaResponseFormat"]["properties"]
    if fmt.get("schema") == {"anyOf": [{"type": "null"}]}:
        # The document's response side lost the schema's object type (its request side has
        # it); an echoed schema object is what every client expects.
        fmt["schema"] = {"type": "object"}
    resource = Resource.from_contents(doc, default_specification=DRAFT202012)
    return Registry().with_resource(URN, resource), doc


@cache
def _validator(schema: str) -> Draft202012Validator:
    registry, _ = _document()
    return Draft202012Validator({"$ref": f"{URN}#/components/schemas/{schema}"}, registry=registry)


@cache
def event_schemas() -> dict[str, str]:
    """Streaming event type -> its schema name, from the document's union of events."""
    _, doc = _document()
    schemas = doc["components"]["schemas"]
    content = doc["paths"]["/responses"]["post"]["responses"]["200"]["content"]
    out: dict[str, str] = {}
    for ref in content["text/event-stream"]["schema"]["oneOf"]:
        name = ref["$ref"].rsplit("/", 1)[-1]
        out[schemas[name]["properties"]["type"]["enum"][0]] = name
    return out


def problems(instance: Any, schema: str) -> list[str]:
    """Where ``instance`` breaks the named schema, shortest paths first (empty: it is valid)."""
    errors = sorted(_validator(schema).iter_errors(instance), key=lambda e: len(e.absolute_path))
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:100]}" for e in errors]
