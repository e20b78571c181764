"""Charts as inline SVG, drawn on the server: no chart library, nothing to fetch, and the
numbers a test reads are in the markup (``data-*`` attributes) beside the shapes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from markupsafe import Markup, escape

WIDTH, HEIGHT = 560, 200
LEFT, BOTTOM, TOP = 56, 28, 12


@dataclass(frozen=True)
class Series:
    name: str
    css: str  # a class of console.css: the colour


# How the ledger splits a request's tokens, as stacked parts that add up to all of them:
# the prompt is cached + not cached; the output is reasoning + answer.
TOKEN_SERIES = (
    Series("cached prompt", "s-cached"),
    Series("prompt, not cached", "s-prompt"),
    Series("reasoning", "s-reasoning"),
    Series("answer", "s-answer"),
)


def token_parts(row: dict[str, Any]) -> list[int]:
    prompt, cached = int(row["prompt_tokens"]), int(row["cached_tokens"])
    completion, reasoning = int(row["completion_tokens"]), int(row["reasoning_tokens"])
    return [cached, max(0, prompt - cached), reasoning, max(0, completion - reasoning)]


# Axis tops as a multiple of a power of ten, with how many grid steps make round numbers.
_TOPS = ((1.0, 4), (1.5, 3), (2.0, 4), (2.5, 5), (3.0, 3), (4.0, 4), (5.0, 5), (6.0, 3), (8.0, 4))


def _nice_top(value: float) -> tuple[float, int]:
    """A round axis top at or above ``value``, and its number of grid steps."""
    if value <= 0:
        return 1.0, 4
    power = math.pow(10, math.floor(math.log10(value)))
    for mult, steps in _TOPS:
        if power * mult >= value * 0.999999:
            return power * mult, steps
    return power * 10, 4


CHAR_WIDTH = 6.6  # the axis font's average advance, in the chart's units
MAX_LABEL = 28  # characters of a bar's label shown under it at most


def _fmt(value: float) -> str:
    if 0 < value < 1:
        return f"{value:.2g}" if value >= 1e-4 else f"{value:.6f}".rstrip("0")
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1_000:
        return f"{value / 1_000:g}k"
    return f"{value:g}"


def stacked_bars(
    chart_id: str,
    rows: list[dict[str, Any]],
    label_key: str,
    series: tuple[Series, ...],
    parts: Any,
    title: str,
) -> Markup:
    """One bar per row, stacked from ``parts(row)`` (one number per series)."""
    values = [[float(v) for v in parts(r)] for r in rows]
    top, steps = _nice_top(max((sum(v) for v in values), default=0))
    ticks = [_fmt(top * (steps - i) / steps) for i in range(steps + 1)]
    # Room on the left for the longest number of the axis, so none is cut at the edge.
    left = max(LEFT, math.ceil(len(max(ticks, key=len)) * CHAR_WIDTH) + 10)
    inner_w, inner_h = WIDTH - left - 8, HEIGHT - BOTTOM - TOP
    slot = inner_w / max(1, len(rows))
    bar_w = max(4.0, min(48.0, slot * 0.7))
    out = [
        f'<svg class="chart" id="{escape(chart_id)}" data-chart="{escape(chart_id)}" role="img" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for i, label in enumerate(ticks):  # grid lines and the axis's numbers
        y = TOP + inner_h * i / steps
        out.append(f'<line class="grid" x1="{left}" x2="{WIDTH - 8}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="axis" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    # A label under its bar fits the bar's slot: shortened with an ellipsis where it must be
    # (the whole label is the bar's title, shown on hover).
    fits = max(3, min(MAX_LABEL, int(slot / CHAR_WIDTH) - 1))
    for i, (row, parts_of_row) in enumerate(zip(rows, values, strict=True)):
        x = left + slot * i + (slot - bar_w) / 2
        label = str(row[label_key])
        total = sum(parts_of_row)
        out.append(
            f'<g class="bar" data-label="{escape(label)}" data-total="{total:g}" '
            f'data-requests="{int(row.get("requests", 0))}">'
        )
        y = TOP + inner_h
        for s, v in zip(series, parts_of_row, strict=True):
            h = inner_h * v / top
            y -= h
            out.append(
                f'<rect class="{s.css}" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}">'
                f"<title>{escape(label)}: {escape(s.name)} {v:g}</title></rect>"
            )
        out.append("</g>")
        if len(rows) <= 16 or i % max(1, len(rows) // 12) == 0:
            short = label[5:] if len(label) == 10 and label[4] == "-" else label
            short = short if len(short) <= fits else short[: fits - 1] + "…"
            at = f'x="{x + bar_w / 2:.1f}" y="{HEIGHT - 8}"'
            out.append(f'<text class="axis" {at} text-anchor="middle">{escape(short)}</text>')
    if not rows:
        out.append(f'<text class="axis" x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no requests yet</text>')
    out.append("</svg>")
    return Markup("".join(out))


def legend(series: tuple[Series, ...]) -> Markup:
    items = "".join(f'<span><i class="{s.css}"></i>{escape(s.name)}</span>' for s in series)
    return Markup(f'<div class="legend">{items}</div>')


def tokens_chart(chart_id: str, rows: list[dict[str, Any]], label_key: str, title: str) -> Markup:
    return stacked_bars(chart_id, rows, label_key, TOKEN_SERIES, token_parts, title) + legend(TOKEN_SERIES)


COST_SERIES = (Series("cost (USD)", "s-cost"),)


def cost_chart(chart_id: str, rows: list[dict[str, Any]], label_key: str, title: str) -> Markup:
    return stacked_bars(chart_id, rows, label_key, COST_SERIES, lambda r: [Decimal(r["cost_usd"])], title)


PERIOD_WORDS = {"daily": "today", "weekly": "this week", "monthly": "this month"}


def budget_meter(spent: str | None, budget: str | None, soft: str | None = None, period: str | None = None) -> Markup:
    """Spend against a budget as one horizontal bar, with the soft budget (the webhook's
    threshold) as a mark on it, and the figures in words. ``spent`` is the period's spend for
    a budget that starts over."""
    when = PERIOD_WORDS.get(period or "", "")
    used = Decimal(spent or "0")
    if budget is None:
        words = f"{escape(used)} USD spent{(' ' + when) if when else ''}, no budget"
        return Markup(f'<span class="muted meter" data-spent="{escape(used)}">{words}</span>')
    cap = Decimal(budget)
    share = min(Decimal(1), used / cap) if cap > 0 else Decimal(1)
    css = "over" if share >= 1 else ("near" if share >= Decimal("0.8") else "ok")
    mark = note = ""
    if soft is not None and cap > 0:
        at = float(min(Decimal(1), Decimal(soft) / cap)) * 100
        mark = f'<rect class="soft" x="{at:.1f}" width="1.5" height="8"/>'
        note = f", alert at {escape(soft)}"
    return Markup(
        f'<span class="meter {css}" data-spent="{escape(used)}" data-budget="{escape(cap)}">'
        f'<svg viewBox="0 0 100 8" width="120" height="10" aria-hidden="true"><rect class="track" width="100" '
        f'height="8"/><rect class="fill" width="{float(share) * 100:.1f}" height="8"/>{mark}</svg> '
        f"{escape(used)} of {escape(cap)} USD{(' ' + when) if when else ''}{note}</span>"
    )
