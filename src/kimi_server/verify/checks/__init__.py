"""One module per group; importing this package registers every check."""

from kimi_server.verify.checks import (  # noqa: F401
    cache,
    dynamic_tools,
    effort,
    errors,
    latency,
    media,
    params,
    responses,
    streaming,
    structured,
    tools,
    usage,
    web_search,
)
