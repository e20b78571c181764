"""Strict answers cut short: how many come back invalid.

Strict ``json_schema`` answers and forced strict tool calls on the tiny model, each under an
output cap too small for the model to finish (the schemas of the test corpus, caps from 6 to 64
tokens), plus a share under a generous cap where only the repetition guard can cut. Every
answer is parsed and validated against its schema; the run prints how many were not JSON or
did not validate, per kind and finish reason. A quality count, not a timing.

    python -m benchmarks.strict_cut [--model smollm2-135m] [--requests 100] [--parallel 4]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
from jsonschema import Draft202012Validator
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.shared_params import ResponseFormatJSONSchema
from tests.schema_corpus import corpus

from benchmarks._server import KEY, running_server

CAPS = (6, 8, 12, 16, 24, 32, 48, 64, 1024)  # the last: only the guard or the schema ends it
# Small reasoning budgets keep the run short; the answer is what is under test.
BUDGETS = '{"low": {"floor": 8, "cap": 24}}'


def ask(sdk: openai.OpenAI, i: int, schema: dict[str, Any]) -> tuple[str, str, str | None]:
    """(kind, finish_reason, why invalid or None) for request ``i``."""
    cap = CAPS[i % len(CAPS)]
    common: dict[str, Any] = {
        "model": "kimi-k3.1-pro",
        "reasoning_effort": "low",
        "max_completion_tokens": cap,
        "messages": [{"role": "user", "content": f"Fill in example data for record {i}. Be verbose."}],
    }
    if i % 2 == 0:
        fmt: ResponseFormatJSONSchema = {
            "type": "json_schema",
            "json_schema": {"name": "record", "strict": True, "schema": schema},
        }
        r = sdk.chat.completions.create(**common, response_format=fmt)
        text, finish = r.choices[0].message.content, str(r.choices[0].finish_reason)
        return "json_schema", finish, _invalid(schema, text)
    tool: ChatCompletionFunctionToolParam = {
        "type": "function",
        "function": {"name": "save", "strict": True, "parameters": schema},
    }
    r = sdk.chat.completions.create(**common, tools=[tool], tool_choice="required")
    calls = [c for c in r.choices[0].message.tool_calls or () if c.type == "function"]
    finish = str(r.choices[0].finish_reason)
    if not calls:
        return "tool_call", finish, "no call"
    return "tool_call", finish, _invalid(schema, calls[0].function.arguments)


def _invalid(schema: dict[str, Any], text: str | None) -> str | None:
    try:
        value = json.loads(text or "")
    except ValueError:
        return "not JSON"
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    return "invalid" if any(True for _ in validator.iter_errors(value)) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=4)
    args = parser.parse_args()
    schemas = corpus()
    env = {"KIMI_BUDGETS": BUDGETS}
    with running_server(args.model, "--parallel", str(args.parallel), env=env) as url:
        sdk = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=600)
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda i: ask(sdk, i, schemas[i % len(schemas)]), range(args.requests)))
    tally: Counter[tuple[str, str, str]] = Counter()
    for kind, finish, why in results:
        tally[(kind, finish, why or "valid")] += 1
    for (kind, finish, verdict), n in sorted(tally.items()):
        print(f"{kind:12} finish={finish:10} {verdict:9} {n}")
    bad = sum(1 for _, _, why in results if why)
    print(f"invalid: {bad} of {len(results)}")


if __name__ == "__main__":
    main()
