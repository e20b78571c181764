"""Whether decoding the reasoning attempts together would pay on this machine.

The prompted reasoning decodes its attempts one after another. llama.cpp can decode several
completions of one prompt as parallel sequences in one batch (``n_cmpl``: the prompt is read
once, then each step decodes every sequence); where a CPU is bound by memory bandwidth that
costs little more than one sequence, where it is bound by compute it costs as much as decoding
them in turn. This measures which, with the embedded engine's own library and settings (one
thread per core, the slots sharing one context), interleaved round by round:

- ``sequential``: N completions of the same prompt, one after another, each ``--tokens`` long;
- ``batched``: the same N completions as one ``n_cmpl`` call.

Prints each side's median seconds with its spread and ``batched / sequential = R x`` (below 1.0x
the batch pays; at 1.0x it does not, and attempts decoded together would not answer sooner).

    python -m benchmarks.batched_attempts [--model qwen2.5-coder-0.5b] [--attempts 3] [--rounds 5]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks._measure import interleave, machine_note, ratio, spread

PROMPT = "What is 17 times 23? Think it through step by step."


def load(model: str, attempts: int) -> Any:
    from kimi_server.engines.llamacpp.cpu_wait import apply_wait_level

    apply_wait_level(0)  # the engine's default, before llama.cpp is loaded
    import xllamacpp

    from kimi_server.engines.llamacpp.embedded_config import threads_for
    from kimi_server.models.store import ModelStore

    path = ModelStore().path_for(model)
    if path is None:
        raise SystemExit(f"{model} is not pulled: kimi-server models pull {model}")
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_parallel = attempts + 1
    params.kv_unified = True
    params.n_ctx = 4096
    for cpu in (params.cpuparams, params.cpuparams_batch):
        cpu.n_threads = threads_for(0)
    return xllamacpp.Server(params)


def timed(server: Any, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    server.handle_completions({**body, "stream": True}, lambda _chunk: False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    server = load(args.model, args.attempts)
    prompt = f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    body = {"prompt": prompt, "n_predict": args.tokens, "ignore_eos": True, "temperature": 0.8, "id_slot": 0}

    def sequential() -> float:
        return sum(timed(server, {**body, "seed": n}) for n in range(args.attempts))

    def batched() -> float:
        return timed(server, {**body, "seed": 0, "n_cmpl": args.attempts})

    timed(server, body)  # warm: the prompt in the slot, the weights in memory
    samples = interleave(args.rounds, {"sequential": sequential, "batched": batched})
    print(f"{args.model}: {args.attempts} attempts of {args.tokens} tokens, {machine_note()}")
    for name, values in samples.items():
        print(f"  {name:<10} {spread(values, ' s')}")
    print(f"batched / sequential = {ratio(samples['batched'], samples['sequential']):.2f} x")


if __name__ == "__main__":
    main()
