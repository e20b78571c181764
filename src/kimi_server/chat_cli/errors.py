"""SDK errors as one line a person can act on (never a traceback)."""

from __future__ import annotations

import openai


def one_line(exc: BaseException, url: str) -> str:
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        reason = f": {cause}" if cause is not None and str(cause) else ""
        if isinstance(exc, openai.APITimeoutError):
            return f"{url} did not answer in time"
        return f"cannot reach {url}{reason} (is the server running? --url sets the address)"
    if isinstance(exc, openai.APIStatusError):
        text = f"{exc.status_code}: {_message(exc)}"
        if exc.status_code == 401:
            text += " (pass the API key with --key or $KIMI_API_KEY)"
        return text
    return " ".join(str(exc).split()) or type(exc).__name__


def _message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return " ".join(error["message"].split())
    return " ".join(exc.message.split())
