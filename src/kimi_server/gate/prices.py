"""Cost of a request from its usage and the configured prices, exact, in integer nano-dollars.

A price is USD per million tokens, so ``tokens * price`` is micro-dollars; prices with at most
3 decimals (checked in settings) make every cost a whole number of nano-dollars.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from kimi_server.engines.types import Usage
from kimi_server.settings import ModelPrice

_NANOS_PER_MICRO = 1000


@dataclass(frozen=True)
class Billable:
    usage: Usage
    cache_ttl: str = "5m"
    web_search_calls: int = 0


@dataclass(frozen=True)
class _NanoPrice:
    """A model's prices in whole nano-dollars per token (per call for web search): exact,
    since a price per million tokens has at most 3 decimals, and plain integer arithmetic."""

    input: int
    cache_read: int
    cache_write_5m: int
    cache_write_1h: int
    output: int
    web_search: int

    @classmethod
    def of(cls, price: ModelPrice) -> _NanoPrice:
        def nanos(per_million: Decimal) -> int:
            return int((per_million * _NANOS_PER_MICRO).to_integral_value())

        return cls(
            nanos(price.input),
            nanos(price.cache_read),
            nanos(price.cache_write_5m),
            nanos(price.cache_write_1h),
            nanos(price.output),
            nanos(price.web_search * 1_000_000),
        )


class PriceBook:
    def __init__(self, prices: Mapping[str, ModelPrice]) -> None:
        self._nanos = {model: _NanoPrice.of(price) for model, price in prices.items()}

    def cost_nanos(self, model: str, bill: Billable) -> int:
        price = self._nanos.get(model)
        if price is None:
            return 0
        u = bill.usage
        regular = max(0, u.prompt_tokens - u.cached_tokens - u.cache_write_tokens)
        write = price.cache_write_1h if bill.cache_ttl == "1h" else price.cache_write_5m
        return (
            regular * price.input
            + u.cached_tokens * price.cache_read
            + u.cache_write_tokens * write
            + u.completion_tokens * price.output
            + bill.web_search_calls * price.web_search
        )

    def worst_case_nanos(self, model: str, prompt_tokens: int, output_tokens: int, ttl: str) -> int:
        """The most a request can cost: every prompt token at the dearest input class."""
        price = self._nanos.get(model)
        if price is None:
            return 0
        dearest = max(price.input, price.cache_write_1h if ttl == "1h" else price.cache_write_5m)
        return prompt_tokens * dearest + output_tokens * price.output
