"""Constrained vs unconstrained decoding: time per generated token, as a ratio.

Same model, same process, same prompt; the runs alternate so that load from elsewhere on the
machine hits both sides alike. The constrained side decodes under the grammars the server
builds (a strict JSON schema, and a tool-call grammar); the schemas never let the answer
finish early, so both sides generate the same number of tokens.

    python -m benchmarks.structured_decode [--model PATH] [--tokens 96] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

from kimi_server.engines.llamacpp.grammar import BARE_SYNTAX, calls_grammar, schema_grammar
from kimi_server.engines.types import ToolSpec

DEFAULT_MODEL = Path.home() / ".cache/kimi-server/models/smollm2-135m-instruct-q4_1.gguf"
PROMPT = "<|im_start|>user\nList some short words.<|im_end|>\n<|im_start|>assistant\n"
# Long enough that the grammar never completes within the token budget.
LIST_SCHEMA = {
    "type": "object",
    "properties": {"words": {"type": "array", "minItems": 500,
                             "items": {"type": "string", "maxLength": 12}}},
    "required": ["words"],
    "additionalProperties": False,
}


def load(path: Path, threads: int) -> Any:
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_ctx = 4096
    params.n_parallel = 1
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.warmup = False
    params.verbosity = -1
    params.api_keys = [os.urandom(16).hex()]
    return xllamacpp.Server(params)


def ms_per_token(server: Any, tokens: int, grammar: str | None) -> float:
    body: dict[str, Any] = {"prompt": PROMPT, "n_predict": tokens, "temperature": 0.7,
                            "seed": 1, "ignore_eos": True, "cache_prompt": True}
    if grammar is not None:
        body["grammar"] = grammar
    result = server.handle_completions(body)
    timings = result["timings"]
    if timings["predicted_n"] < tokens * 0.9:
        raise RuntimeError(f"generation ended early: {timings['predicted_n']} tokens")
    return float(timings["predicted_per_token_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    server = load(args.model, args.threads)
    tool = ToolSpec("save_words", parameters=LIST_SCHEMA, strict=True)
    sides: dict[str, str | None] = {
        "unconstrained": None,
        "json_schema": schema_grammar(LIST_SCHEMA, strict=True).text(),
        "tool_call": calls_grammar(BARE_SYNTAX, (tool,), parallel=False).text(),
    }
    for grammar in sides.values():  # warm-up: first-use costs (tokenizer tables) excluded
        ms_per_token(server, 8, grammar)
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, grammar in sides.items():
            samples[name].append(ms_per_token(server, args.tokens, grammar))
    base = statistics.median(samples["unconstrained"])
    print(f"model {args.model.name}, {args.tokens} tokens x {args.rounds} rounds, "
          f"{args.threads} threads; medians:")
    for name, values in samples.items():
        med = statistics.median(values)
        print(f"  {name:14s} {med:7.2f} ms/token   ratio vs unconstrained {med / base:5.2f}x")


if __name__ == "__main__":
    main()
