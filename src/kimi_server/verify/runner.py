"""Runs the chosen checks, a few at a time (most wait on the endpoint, and a server batches
concurrent requests), then the serial groups alone; results keep the registry's order. A check
that raises anything unexpected (a timeout, a refused connection, a body the SDK cannot parse)
fails with that as its reason."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from kimi_server.verify.outcome import Failed, Info, Result, Skipped, Status
from kimi_server.verify.registry import SERIAL, Check, load
from kimi_server.verify.target import Target

Job = tuple[Check, str, str]  # the check, the model, the name printed


def select(only: Iterable[str], skip: Iterable[str]) -> list[Check]:
    chosen, skipped = set(only), set(skip)
    return [c for c in load() if (not chosen or c.group in chosen) and c.group not in skipped]


def run(
    target: Target, checks: list[Check], on_result: Callable[[Result], None] | None = None, *, concurrency: int = 4
) -> list[Result]:
    jobs: list[Job] = [
        (chk, model, f"{chk.name} [{model}]" if chk.per_model else chk.name)
        for chk in checks
        for model in (target.models if chk.per_model else [target.model])
    ]

    def one(job: Job) -> Result:
        result = run_one(target, *job)
        if on_result is not None:
            on_result(result)
        return result

    together = [j for j in jobs if j[0].group not in SERIAL]
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = list(pool.map(one, together))
    results += [one(j) for j in jobs if j[0].group in SERIAL]
    return results


def run_one(target: Target, chk: Check, model: str, name: str) -> Result:
    started = time.monotonic()

    def done(status: Status, detail: str) -> Result:
        return Result(chk.group, name, status, one_line(detail), time.monotonic() - started)

    try:
        note = chk.fn(target, model)
    except Failed as exc:
        return done(Status.FAIL, str(exc))
    except Skipped as exc:
        return done(Status.SKIP, str(exc))
    except Info as exc:
        return done(Status.INFO, str(exc))
    except (httpx.TimeoutException, openai.APITimeoutError):
        return done(Status.FAIL, f"no answer within {target.timeout:g} s (client timeout)")
    except openai.APIStatusError as exc:
        return done(Status.FAIL, f"HTTP {exc.status_code}: {exc.message}")
    except (httpx.HTTPError, openai.APIError) as exc:
        return done(Status.FAIL, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # a body the check could not read is the endpoint's failure too
        return done(Status.FAIL, f"unexpected answer ({type(exc).__name__}: {exc})")
    return done(Status.PASS, note or "")


def one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
