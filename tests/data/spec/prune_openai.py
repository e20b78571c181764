"""Rebuilds ``openai-responses.openapi.json`` from OpenAI's full OpenAPI document: only the
component schemas reachable from ``Response`` and ``ResponseStreamEvent`` (what the tests
validate against), so the copy kept here is a fifth of the size.

    python tests/data/spec/prune_openai.py PATH/TO/openai.openapi.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOTS = ("Response", "ResponseStreamEvent")
REF = re.compile(r'"#/components/schemas/([^"]+)"')


def prune(doc: dict[str, Any]) -> dict[str, Any]:
    schemas = doc["components"]["schemas"]
    seen: set[str] = set()
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(REF.findall(json.dumps(schemas[name])))
    return {
        "openapi": doc["openapi"],
        "info": doc["info"],
        "components": {"schemas": {k: schemas[k] for k in sorted(seen)}},
    }


if __name__ == "__main__":
    full = json.loads(Path(sys.argv[1]).read_text())
    out = Path(__file__).with_name("openai-responses.openapi.json")
    out.write_text(json.dumps(prune(full), indent=1) + "\n")
