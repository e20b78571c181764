"""One module per group; importing this package registers every check."""

from kimi_server.verify.checks import (  # noqa: F401
    balance,
    cache,
    contract,
    dynamic_tools,
    effort,
    errors,
    estimate,
    files,
    latency,
    media,
    messages,
    messages_door,
    params,
    partial,
    responses,
    streaming,
    structured,
    tools,
    usage,
    web_search,
)
