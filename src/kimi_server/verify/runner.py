"""Runs the chosen checks, a few at a time (most wait on the endpoint, and a server batches
concurrent requests), then the serial checks alone; results keep the registry's order. Each
check runs under its wall-clock deadline (``verify/deadline.py``): one that runs out fails
naming the deadline that ended it. A check that raises anything else unexpected (a refused
connection, a body the SDK cannot parse) fails with that as its reason."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai

from kimi_server.verify.deadline import DeadlinePassed, check_deadline, timed_out_reason
from kimi_server.verify.outcome import Failed, Info, Result, Skipped, Status
from kimi_server.verify.registry import Check, load
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

    together = [n for n, j in enumerate(jobs) if not j[0].alone]
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        results = dict(zip(together, pool.map(lambda n: one(jobs[n]), together), strict=True))
    results.update((n, one(j)) for n, j in enumerate(jobs) if j[0].alone)
    return [results[n] for n in range(len(jobs))]


TIMED_OUT = (httpx.TimeoutException, openai.APITimeoutError, DeadlinePassed)


def run_one(target: Target, chk: Check, model: str, name: str) -> Result:
    started = time.monotonic()
    with check_deadline(target.check_timeout) as deadline:
        result = _outcome(target, chk, model)
    status, detail = result if result is not None else (Status.FAIL, timed_out_reason(deadline, target.timeout))
    return Result(chk.group, name, status, one_line(detail), time.monotonic() - started)


def _outcome(target: Target, chk: Check, model: str) -> tuple[Status, str] | None:
    """The check's status and detail; None when a deadline ended it."""
    try:
        note = chk.fn(target, model)
    except Failed as exc:
        return Status.FAIL, str(exc)
    except Skipped as exc:
        return Status.SKIP, str(exc)
    except Info as exc:
        return Status.INFO, str(exc)
    except TIMED_OUT:
        return None
    except openai.APIStatusError as exc:
        return Status.FAIL, f"HTTP {exc.status_code}: {exc.message}"
    except (httpx.HTTPError, openai.APIError) as exc:
        return Status.FAIL, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a body the check could not read is the endpoint's failure too
        return Status.FAIL, f"unexpected answer ({type(exc).__name__}: {exc})"
    return Status.PASS, note or ""


def one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
