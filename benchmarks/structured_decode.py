"""Constrained vs unconstrained decoding: time per generated token, as a ratio.

Same model, same process, same prompt; the runs alternate (unconstrained, json_schema,
tool_call, unconstrained, ...) so that load from elsewhere on the machine hits every side alike.
The constrained sides decode under the grammars the server builds (a strict JSON schema, and a
tool-call grammar); the schemas never let the answer finish early, so every side generates the
same number of tokens. Each side prints its median time per token and spread; the comparison
is the ratio of the medians.

    python -m benchmarks.structured_decode [--model smollm2-135m] [--tokens 96] [--rounds 5]
    python -m benchmarks.structured_decode --quick      # small sizes, for a smoke run
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks._measure import interleave, machine_note, ratio, spread
from kimi_server.engines.llamacpp.grammar import BARE_SYNTAX, calls_grammar, schema_grammar
from kimi_server.engines.types import ToolSpec
from kimi_server.models.pull import resolve_model
from kimi_server.models.store import ModelStore, default_models_dir

PROMPT = "<|im_start|>user\nList some short words.<|im_end|>\n<|im_start|>assistant\n"
# Long enough that the grammar never completes within the token budget.
LIST_SCHEMA = {
    "type": "object",
    "properties": {"words": {"type": "array", "minItems": 500, "items": {"type": "string", "maxLength": 12}}},
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
    body: dict[str, Any] = {
        "prompt": PROMPT,
        "n_predict": tokens,
        "temperature": 0.7,
        "seed": 1,
        "ignore_eos": True,
        "cache_prompt": True,
    }
    if grammar is not None:
        body["grammar"] = grammar
    result = server.handle_completions(body)
    timings = result["timings"]
    if timings["predicted_n"] < tokens * 0.9:
        raise RuntimeError(f"generation ended early: {timings['predicted_n']} tokens")
    return float(timings["predicted_per_token_ms"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="catalogue name or GGUF path")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="32 tokens, 3 rounds")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.rounds = 32, 3
    path = resolve_model(args.model, ModelStore(default_models_dir()), auto_pull=True)
    server = load(path, args.threads)
    tool = ToolSpec("save_words", parameters=LIST_SCHEMA, strict=True)
    grammars: dict[str, str | None] = {
        "unconstrained": None,
        "json_schema": schema_grammar(LIST_SCHEMA, strict=True).text(),
        "tool_call": calls_grammar(BARE_SYNTAX, (tool,), parallel=False).text(),
    }
    for grammar in grammars.values():  # warm-up: first-use costs (tokenizer tables) excluded
        ms_per_token(server, 8, grammar)
    sides: dict[str, Callable[[], float]] = {
        name: partial(ms_per_token, server, args.tokens, g) for name, g in grammars.items()
    }
    samples = interleave(args.rounds, sides)
    base = samples["unconstrained"]
    print(
        f"model {Path(path).name}, {args.tokens} tokens x {args.rounds} interleaved rounds, "
        f"{args.threads} threads; {machine_note()}"
    )
    print("ms per generated token, median [min-max]:")
    for name, values in samples.items():
        print(f"  {name:14s} {spread(values)}   ratio of medians vs unconstrained {ratio(values, base):.2f}x")


if __name__ == "__main__":
    main()
