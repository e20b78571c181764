"""Health of upstreams: breaker state; with a probe, whether ``GET {base_url}/models`` answers
(every OpenAI-compatible server has it), how fast, and whether it lists the model this server
will ask for; optionally one real call of one output token.

A failed check carries ``problem`` (a code) and ``reason`` (words, no URL: ``/health?deep=1``
shows it to any key); ``advice`` says what to do about it, for the operator's command line.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import httpx

from kimi_server.engines.upstream.forced_calls import kept_by
from kimi_server.engines.upstream.relay import Upstream

LISTED = 20  # model ids named in a report: enough to choose from, short for a huge catalogue
PROBE_PROMPT = "Reply with OK."
CALL_TIMEOUT = 10.0  # the one-token call's bound, below the read timeout: a health check is short

REASONS = {
    "unreachable": "could not connect",
    "timeout": "no answer in time",
    "auth": "the upstream refused this server's key",
    "no_models_route": "the base URL has no /models (it should end in /v1)",
    "http_status": "the upstream answered GET /models with an error",
    "not_a_model_list": "the answer to GET /models is not an OpenAI model list",
    "model_not_served": "the upstream does not serve the model",
    "call_failed": "the one-token call failed",
}


def upstream_names(up: Upstream, public_ids: Sequence[str]) -> list[str]:
    """The model names this server sends the upstream: its ``model``, else the public ids."""
    return [up.cfg.model] if up.cfg.model else list(public_ids)


# timeout: the HTTP client's bound on the model-list call, passed through (not the caller's).
async def check_upstream(
    up: Upstream,
    public_ids: Sequence[str] = (),
    *,
    call: bool = False,
    timeout: float | None = None,  # noqa: ASYNC109
) -> dict[str, Any]:
    """``public_ids``: the ids a client asks this upstream for (its route's, or the catalogue
    for ``--upstream``); with none, the model list is not checked. ``call``: also ask for one
    output token of the first served model."""
    started = time.monotonic()
    limit = timeout or up.cfg.connect_timeout
    names = upstream_names(up, public_ids)
    report: dict[str, Any] = {
        "name": up.name,
        "dialect": up.cfg.dialect,
        "state": up.breaker.state,
        # How tool_choice "required" / a named function is kept there (forced_calls.py).
        "forced_tool_calls": kept_by(up.dialect, up.cfg.capabilities),
        "transport": up.transport.name,
    }
    if names:
        report["upstream_models"] = names
    problem: str | None = None
    try:
        resp = await up.client.get(f"{up.base}/models", headers=up.headers, timeout=limit)
    except httpx.TimeoutException:
        problem = "timeout"
    except httpx.HTTPError as exc:
        problem = "unreachable"
        report["detail"] = _os_reason(exc)
    else:
        report["status"] = resp.status_code
        problem = _listing_problem(up, resp, names, report)
    report["reachable"] = "status" in report
    if problem is None and call and names:
        problem = await _one_token(up, first_served(names, report.get("served")), report)
    report["ok"] = problem is None
    if problem is not None:
        report["problem"] = problem
        report["reason"] = REASONS[problem]
    report["latency_ms"] = round((time.monotonic() - started) * 1000, 1)
    return report


def _listing_problem(up: Upstream, resp: httpx.Response, names: list[str], report: dict[str, Any]) -> str | None:
    if resp.status_code in (401, 403):
        return "auth"
    if resp.status_code == 404:
        return "no_models_route"
    if resp.status_code != 200:
        return "http_status"
    served = _model_ids(resp)
    if served is None:
        return "not_a_model_list"
    report["served"] = served[:LISTED]
    missing = [n for n in names if n not in served]
    if missing:
        report["not_served"] = missing
    # llama.cpp's server answers with its one model whatever name a request gives.
    if names and len(missing) == len(names) and up.cfg.dialect != "llamacpp":
        return "model_not_served"
    return None


def _model_ids(resp: httpx.Response) -> list[str] | None:
    try:
        data = resp.json().get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]


def first_served(names: list[str], served: list[str] | None) -> str:
    return next((n for n in names if served is None or n in served), names[0])


async def _one_token(up: Upstream, model: str, report: dict[str, Any]) -> str | None:
    """A real completion of one output token: the model loads, and answers."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROBE_PROMPT}],
        up.dialect.max_tokens_field: 1,
        "stream": False,
    }
    report["called"] = model
    try:
        resp = await up.client.post(
            f"{up.base}/chat/completions", json=body, headers=up.headers, timeout=min(up.cfg.read_timeout, CALL_TIMEOUT)
        )
    except httpx.TimeoutException:
        report["call_status"] = None
        return "timeout"
    except httpx.HTTPError as exc:
        report["detail"] = _os_reason(exc)
        return "unreachable"
    report["call_status"] = resp.status_code
    if resp.status_code in (401, 403):
        return "auth"
    try:
        choices = resp.json().get("choices")
    except (ValueError, AttributeError):
        choices = None
    return None if resp.status_code == 200 and choices else "call_failed"


def _os_reason(exc: httpx.HTTPError) -> str:
    """The operating system's words for a failed connection ("Connection refused"), never a
    class name."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno and cause.errno > 0:
            return os.strerror(cause.errno)  # asyncio's own text quotes the address: this does not
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror  # a name lookup's failure
        cause = cause.__cause__ or cause.__context__
    text = str(exc).strip()
    return text or "the connection failed"


def advice(report: dict[str, Any], up: Upstream, model_option: str) -> str:
    """What to do about a failed check, in words, for the operator. ``model_option``: where this
    upstream's model name is set (``--upstream-model``, or the route's ``model``)."""
    problem = report.get("problem")
    base = up.base
    if problem == "unreachable":
        return f"cannot connect ({report.get('detail', 'no answer')}): is the server running at {base}?"
    if problem == "timeout":
        return f"{base} did not answer in time: is the address right, and is the server up and not overloaded?"
    if problem == "auth":
        return _auth_advice(report, up)
    if problem == "no_models_route":
        return f"{base}/models answered 404: the base URL should end in /v1 (e.g. http://host:8000/v1)"
    if problem == "http_status":
        return f"{base}/models answered HTTP {report.get('status')}: see the upstream server's log"
    if problem == "not_a_model_list":
        return f"{base}/models did not answer with a model list: is {base} an OpenAI-compatible API?"
    if problem == "model_not_served":
        wanted = ", ".join(report.get("upstream_models") or [])
        served = ", ".join(report.get("served") or []) or "no models"
        return f"the upstream does not serve {wanted}; it serves {served}: set {model_option}"
    if problem == "call_failed":
        return (
            f"a one-token call to {report.get('called')} answered HTTP {report.get('call_status')}: "
            "see the upstream server's log"
        )
    return ""


def _auth_advice(report: dict[str, Any], up: Upstream) -> str:
    """Advice for a refused request: no key configured, its variable unset, or a wrong key."""
    base, env = up.base, up.cfg.api_key_env
    status = report.get("call_status") or report.get("status")
    if not env:
        return (
            f"{base} refused the request (HTTP {status}): it wants an API key; name the environment "
            "variable holding it with api_key_env (or KIMI_UPSTREAM_API_KEY_ENV for --upstream)"
        )
    if "Authorization" not in up.headers:
        return f"{base} refused the request (HTTP {status}): the environment variable ${env} is not set"
    return f"{base} refused the key (HTTP {status}): check the key in ${env}"
