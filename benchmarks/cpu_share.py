"""The embedded engine on a CPU shared with other work: decode speed beside a CPU hog.

Starts one worker process per ``cpu_poll`` level (``--levels``; default ``auto``, the current
default, then 0 and 50, llama.cpp's own default), each with the embedded engine
loaded (one thread per core the process may use) and idle between measurements. Each round
measures every worker's decode tokens/s alone, then beside each hog, interleaved, so load from
elsewhere falls on all alike. The hogs, started before and stopped (by PID) after each
measurement, both bounded in time:
- ``busy``: a busy loop in one process pinned to one core: one of the cores is taken;
- ``engine``: another embedded engine (llama.cpp's default polling) decoding without pause in a
  process of its own, as another server or test run on the same machine would.
Each measurement generates up to ``--tokens`` tokens from a short prompt and stops after
``--seconds`` (tokens/s is what it made by then), so a collapsed setting cannot stall the run.

Prints each side's median tokens/s with its spread, each level's ratio beside a hog / alone
(target for the first level beside the busy hog: >= 0.5x with one of two cores taken) and the
first level against the others beside each hog.

    python -m benchmarks.cpu_share [--model smollm2-135m] [--rounds 5] [--levels auto,0,50]
    python -m benchmarks.cpu_share --quick      # 3 short rounds, the busy hog only: about a minute
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO

from benchmarks._measure import interleave, machine_note, ratio, spread

PROMPT = "Write a long story about a lighthouse keeper and the ships she watched over.\n"
HOG_LIMIT_S = 120  # a hog ends by itself after this, should this process die first
SETTLE_S = 1.0  # before each measurement: long enough for cpu_poll auto to see the machine
BUSY_LOOP = f"import time\nend = time.monotonic() + {HOG_LIMIT_S}\nwhile time.monotonic() < end: pass\n"


async def decode_rate(engine: object, tokens: int, seconds: float) -> float:
    """Tokens/s of one generation from a fresh prompt, cut off after ``seconds``."""
    from kimi_server.engines.llamacpp.engine import EmbeddedEngine
    from kimi_server.engines.llamacpp.runner import CompletionResult

    assert isinstance(engine, EmbeddedEngine)
    runner = engine._runner  # raw completion calls: no reasoning phase, no prompt cache
    assert runner is not None
    body = {
        "prompt": PROMPT,
        "n_predict": tokens,
        "ignore_eos": True,
        "cache_prompt": False,
        "temperature": 0.7,
        "id_slot": 0,
    }
    made = 0
    start = time.perf_counter()
    stream = runner.stream(body)
    assert isinstance(stream, AsyncGenerator)  # closed below, whether it ended or not
    try:
        async with asyncio.timeout(seconds):  # also when no token comes at all
            async for item in stream:
                if isinstance(item, CompletionResult):
                    break
                made += 1
    except TimeoutError:
        pass
    finally:
        await stream.aclose()
    return made / (time.perf_counter() - start)


def worker(model: Path, threads: int, poll: int | str, forever: bool) -> None:
    """Loads the engine; then answers each stdin line ``TOKENS SECONDS`` with a rate, or (a
    hog) decodes without pause until ``HOG_LIMIT_S``."""
    from kimi_server.engines.llamacpp.embedded_config import EmbeddedConfig
    from kimi_server.engines.llamacpp.engine import EmbeddedEngine

    config = EmbeddedConfig(
        model_path=model,
        n_ctx=2048,
        n_parallel=1,
        n_threads=threads,
        cpu_poll="auto" if poll == "auto" else int(poll),
        cache_entries=1,
        cache_enabled=False,
    )
    engine = EmbeddedEngine(config)  # sets the process's wait level before llama.cpp loads
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    loop.run_until_complete(decode_rate(engine, 4, 10))  # warm-up
    if forever:
        end = time.monotonic() + HOG_LIMIT_S
        while time.monotonic() < end:
            loop.run_until_complete(decode_rate(engine, 256, 60))
        return
    print("ready", flush=True)
    for line in sys.stdin:
        tokens, seconds = line.split()
        print(loop.run_until_complete(decode_rate(engine, int(tokens), float(seconds))), flush=True)


def _spawn(model: Path, threads: int, poll: int | str, *, forever: bool = False) -> subprocess.Popen[str]:
    """A worker: answering on its pipes, or (``forever``) a hog that decodes without pause."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.cpu_share",
        "--model",
        str(model),
        "--threads",
        str(threads),
        "--worker",
        str(poll),
        *(["--forever"] if forever else []),
    ]
    # Each worker's own wait level: no inherited OpenMP variables.
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "OMP_THREAD_LIMIT")}
    pipe = subprocess.DEVNULL if forever else subprocess.PIPE
    return subprocess.Popen(cmd, env=env, stdin=pipe, stdout=pipe, stderr=subprocess.DEVNULL, text=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()


@contextmanager
def hog(kind: str, model: Path, threads: int, core: int | None) -> Iterator[None]:
    if kind == "alone":
        # The machine as it is when nothing else runs, not the moment after the last hog or
        # worker stopped: cpu_poll auto reads the machine every 0.2 s.
        time.sleep(SETTLE_S)
        yield
        return
    proc: subprocess.Popen[str] | subprocess.Popen[bytes]
    if kind == "busy":
        pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
        proc = subprocess.Popen([sys.executable, "-c", BUSY_LOOP], preexec_fn=pin)
        settle = SETTLE_S
    else:
        proc = _spawn(model, threads, 50, forever=True)
        settle = 4.0  # loaded and decoding
    try:
        time.sleep(settle)
        yield
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--levels", default="auto,0,50", help="cpu_poll levels compared; the first is the one judged")
    parser.add_argument("--hogs", default=None, help="busy, engine or busy,engine (default; --quick: busy)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per measurement at most")
    parser.add_argument("--seconds", type=float, default=20.0, help="time limit per measurement")
    parser.add_argument("--threads", type=int, default=0, help="0: one per core this process may use")
    parser.add_argument("--quick", action="store_true", help="3 rounds of 32 tokens, 5 s limit, the busy hog only")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--forever", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(Path(args.model), args.threads, args.worker, args.forever)
        return
    if args.quick:
        args.rounds, args.tokens, args.seconds = 3, 32, 5.0
    hog_kinds = args.hogs or ("busy" if args.quick else "busy,engine")
    from kimi_server.models.pull import resolve_model
    from kimi_server.models.store import ModelStore, default_models_dir

    model = Path(resolve_model(args.model, ModelStore(default_models_dir()), auto_pull=True))
    levels = args.levels.split(",")
    hogs = ["alone", *hog_kinds.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    core = cores[-1] if len(cores) > 1 else None
    samples = _measure_all(args, model, levels, hogs, core)
    threads = args.threads or len(cores)
    print(
        f"{model.name}, {threads} thread(s) on {len(cores)} usable core(s), busy hog pinned to "
        f"core {core}; {args.rounds} interleaved rounds; up to {args.tokens} tokens or "
        f"{args.seconds:g} s per measurement; {machine_note()}"
    )
    for kind in hogs:
        for level in levels:
            label = f"cpu_poll {level}, {'alone' if kind == 'alone' else 'beside the ' + kind + ' hog'}"
            print(f"  {label:<36} {spread(samples[f'{level}|{kind}'], ' tok/s', 1)}")
    for kind in hogs[1:]:
        for level in levels:
            r = _ratio(samples[f"{level}|{kind}"], samples[f"{level}|alone"])
            print(f"  cpu_poll {level}: beside the {kind} hog / alone = {r}")
        for level in levels[1:]:
            r = _ratio(samples[f"{levels[0]}|{kind}"], samples[f"{level}|{kind}"])
            print(f"  beside the {kind} hog: cpu_poll {levels[0]} / cpu_poll {level} = {r}")
    print(f"  target: cpu_poll {levels[0]} beside the busy hog / alone >= 0.5x")


def _measure_all(
    args: argparse.Namespace, model: Path, levels: list[str], hogs: list[str], core: int | None
) -> dict[str, list[float]]:
    """One worker per cpu_poll level, each measured alone and beside each hog, interleaved."""
    with ExitStack() as stack:
        workers: dict[str, subprocess.Popen[str]] = {}
        for level in levels:
            proc = _spawn(model, args.threads, level)
            stack.callback(_stop, proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            workers[level] = proc

        def measure(level: str, kind: str) -> Callable[[], float]:
            def run() -> float:
                proc = workers[level]
                stdin, stdout = proc.stdin, proc.stdout
                assert stdin is not None and stdout is not None
                with hog(kind, model, args.threads, core):
                    return _ask(stdin, stdout, f"{args.tokens} {args.seconds}")

            return run

        sides = {(level, kind): measure(level, kind) for kind in hogs for level in levels}
        return interleave(args.rounds, {f"{level}|{kind}": f for (level, kind), f in sides.items()})


def _ratio(variant: list[float], baseline: list[float]) -> str:
    if statistics.median(baseline) == 0:
        return "inf (the baseline made no token in time)"
    return f"{ratio(variant, baseline):.2f}x"


def _ask(stdin: IO[str], stdout: IO[str], line: str) -> float:
    stdin.write(line + "\n")
    stdin.flush()
    return float(stdout.readline())


if __name__ == "__main__":
    main()
