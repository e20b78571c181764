"""The README's first request, old code against new: how long a default-effort answer takes.

Two real servers on the same model and machine: one runs this checkout, the other the code of an
earlier commit (by default the one the engine's speed targets were set against), unpacked from
git into a temporary folder and run with this checkout's virtual environment. Each round sends
the same seeded request to each (old, new, old, new, ...), after a pause in which the machine
settles; each side reports the median wall time of the whole non-streamed request and its
spread, and the ratio of the medians.

    python -m benchmarks.default_latency [--baseline bdd4cbb] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import openai
from openai import omit

from benchmarks._measure import interleave, machine_note, ratio, spread
from benchmarks._server import KEY, running_server
from kimi_server.models.registry import DEFAULT_MODEL

# The landed code when the target "a default answer in half the time" was set.
TARGET_BASELINE = "bdd4cbb"
PROMPT = "Name three colours."
SETTLE_S = 1.0
REPO = Path(__file__).resolve().parent.parent


def unpack_source(commit: str, into: Path) -> Path:
    """The ``src`` folder of ``commit``, written under ``into``; returns it."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit, "src"], check=True, capture_output=True
    ).stdout
    tar_path = into / "src.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def timed_request(base_url: str, seed: int | None, sizes: list[int], effort: str | None = None) -> float:
    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=600)
    start = time.perf_counter()
    resp = client.chat.completions.create(
        model="kimi-k3.1-pro",
        messages=[{"role": "user", "content": PROMPT}],
        seed=seed if seed is not None else omit,
        reasoning_effort=effort if effort is not None else omit,  # type: ignore[arg-type]
    )
    took = time.perf_counter() - start
    sizes.append(resp.usage.completion_tokens if resp.usage else 0)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default=TARGET_BASELINE, help="the old side's commit")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--effort", default=None, help="reasoning_effort (default: the model's own)")
    parser.add_argument("--seeded", action="store_true", help="a seed per round, the same to both sides")
    args = parser.parse_args()
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        old_src = unpack_source(args.baseline, folder)
        old_env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(old_src), os.environ.get("PYTHONPATH")]))}
        old_url = stack.enter_context(running_server(args.model, env=old_env))
        new_url = stack.enter_context(running_server(args.model))
        sizes: dict[str, list[int]] = {"old": [], "new": []}
        for url in (old_url, new_url):
            timed_request(url, 0, [])  # warm-up: the first request loads what later ones reuse
        seeds = iter(range(1, 10_000))
        round_seed = {"seed": 0}

        def measured(url: str, name: str) -> Callable[[], float]:
            def measure() -> float:
                if name == "old":  # the old side runs first in each round: a new seed per round
                    round_seed["seed"] = next(seeds)
                time.sleep(SETTLE_S)
                return timed_request(url, round_seed["seed"] if args.seeded else None, sizes[name], args.effort)

            return measure

        samples = interleave(args.rounds, {"old": measured(old_url, "old"), "new": measured(new_url, "new")})
    print(
        f'model {args.model}, "{PROMPT}" at {args.effort or "the default"} effort, non-streamed, '
        f"{args.rounds} interleaved {'seeded ' if args.seeded else ''}rounds; "
        f"old = {args.baseline}, new = this checkout; {machine_note()}"
    )
    for name in ("old", "new"):
        print(f"  {name}: {spread(samples[name], ' s')}, completion_tokens {sizes[name]}")
    print(f"default request: new / old = {ratio(samples['new'], samples['old']):.2f}x the time")


if __name__ == "__main__":
    main()
