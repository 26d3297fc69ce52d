"""Server-rendered SVG charts for the admin dashboard: no JavaScript, nothing fetched
from a CDN, so the page works offline and behind any content security policy.

Each chart is built from escaped text only (``format_html``); a tooltip (``<title>``)
on every bar or point gives the exact figure.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH = 700
HEIGHT = 200
LEFT = 60  # room for the y-axis labels (LABEL_CHARS at the chart's 11 px font)
#: Longest y-axis label: "1.7 min", "250 ms", "2.5k".
LABEL_CHARS = 7
RIGHT = 12
TOP = 12
BOTTOM = 26  # room for the time labels


@dataclass(frozen=True)
class Series:
    """One coloured set of values, one per time slot (None: no value)."""

    label: str
    values: Sequence[float | None]
    color: str
    dashed: bool = False


def _n(value: float) -> str:
    """A coordinate, as text (format_html escapes its arguments, so no format specs)."""
    return f"{value:.1f}"


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 x 10^k at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        candidate = step * 10**exponent
        if candidate >= value:
            return float(candidate)
    return float(10 ** (exponent + 1))


def count_label(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def short_number(value: float) -> str:
    """At most one decimal, none from 10 up: '1.7', '25', '250' (an axis label, not
    a measurement: the tooltips give the exact figure)."""
    return (f"{value:.0f}" if value >= 10 else f"{value:.1f}").removesuffix(".0")


def seconds_label(value: float, *, exact: bool = False) -> str:
    """A duration in its largest whole unit: short for an axis, ``exact`` (six
    significant digits) for a tooltip."""
    number = (lambda v: f"{v:g}") if exact else short_number
    if value >= 3600:
        return f"{number(value / 3600)} h"
    if value >= 60:
        return f"{number(value / 60)} min"
    if value >= 1 or value == 0:
        return f"{number(value)} s"
    return f"{number(value * 1000)} ms"


def _frame(
    times: Sequence[dt.datetime],
    top: float,
    y_label: Callable[[float], str],
    title: str,
    body: SafeString,
    height: int,
) -> SafeString:
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = height - TOP - BOTTOM
    # Fewer grid lines on a short chart.
    steps = 4 if height >= 150 else 2
    grid = []
    for i in range(steps + 1):
        y = TOP + plot_h - plot_h * i / steps
        grid.append(
            (LEFT, _n(y), WIDTH - RIGHT, _n(y), LEFT - 6, _n(y + 4), y_label(top * i / steps))
        )
    grid_svg = format_html_join(
        "",
        '<line x1="{}" y1="{}" x2="{}" y2="{}" class="grid"/>'
        '<text x="{}" y="{}" text-anchor="end">{}</text>',
        grid,
    )
    ticks = []
    slot = plot_w / max(1, len(times))
    for i, when in enumerate(times):
        if when.minute % 10 == 0 or i == len(times) - 1:
            x = LEFT + slot * (i + 0.5)
            ticks.append((x, height - 8, when.strftime("%H:%M")))
    # Keep the last label clear of the one before it.
    if len(ticks) >= 2 and ticks[-1][0] - ticks[-2][0] < 40:
        ticks.pop(-2)
    tick_svg = format_html_join(
        "",
        '<text x="{}" y="{}" text-anchor="middle">{}</text>',
        ((_n(x), y, label) for x, y, label in ticks),
    )
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" class="pgqueue-chart" role="img" '
        'viewBox="0 0 {w} {h}" width="{w}" height="{h}" aria-label="{title}">'
        "<title>{title}</title>{grid}{body}"
        '<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" class="axis"/>{ticks}</svg>',
        w=WIDTH,
        h=height,
        title=title,
        grid=grid_svg,
        body=body,
        left=LEFT,
        right=WIDTH - RIGHT,
        base=TOP + plot_h,
        ticks=tick_svg,
    )


def stacked_bars(
    times: Sequence[dt.datetime],
    series: Sequence[Series],
    *,
    title: str,
    height: int = HEIGHT,
    lower_bounds: Sequence[bool] = (),
) -> SafeString:
    """One bar per time slot, the series stacked bottom to top (e.g. finished, failed).
    A slot whose ``lower_bounds`` entry is true holds counts that stopped at their cap:
    its bars are hatched and its tooltip says "at least"."""
    totals = [sum(s.values[i] or 0 for s in series) for i in range(len(times))]
    top = nice_ceiling(max(totals, default=0))
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = height - TOP - BOTTOM
    slot = plot_w / max(1, len(times))
    bars = []
    hatched: set[str] = set()
    for i, when in enumerate(times):
        base: float = TOP + plot_h
        x = LEFT + slot * i + slot * 0.12
        bound = i < len(lower_bounds) and lower_bounds[i]
        tip = (
            when.strftime("%H:%M")
            + ": "
            + ("at least " if bound else "")
            + ", ".join(f"{count_label(s.values[i] or 0)} {s.label}" for s in series)
        )
        for s in series:
            value = s.values[i] or 0
            if value <= 0:
                continue
            bar = max(1.0, plot_h * value / top)
            base -= bar
            fill = s.color
            if bound:
                fill = f"url(#{_hatch_id(s.color)})"
                hatched.add(s.color)
            bars.append((_n(x), _n(base), _n(slot * 0.76), _n(bar), fill, bound, tip))
    body = format_html(
        "{}{}",
        _hatches(sorted(hatched)),
        format_html_join(
            "",
            '<rect x="{}" y="{}" width="{}" height="{}" fill="{}" data-lower-bound="{}">'
            "<title>{}</title></rect>",
            bars,
        ),
    )
    return _frame(times, top, count_label, title, body, height)


def _hatch_id(color: str) -> str:
    return "pgqueue-hatch-" + "".join(c for c in color if c.isalnum())


def _hatches(colors: Sequence[str]) -> SafeString:
    """The diagonal hatch of each colour: the fill of a bar that is a lower bound."""
    if not colors:
        return SafeString("")
    patterns = format_html_join(
        "",
        '<pattern id="{}" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="{}" '
        'fill-opacity="0.35"/><line x1="0" y1="0" x2="0" y2="6" stroke="{}" '
        'stroke-width="3"/></pattern>',
        ((_hatch_id(c), c, c) for c in colors),
    )
    return format_html("<defs>{}</defs>", patterns)


def lines(
    times: Sequence[dt.datetime],
    series: Sequence[Series],
    *,
    title: str,
    y_label: Callable[[float], str] = seconds_label,
    height: int = HEIGHT,
) -> SafeString:
    """One polyline per series (gaps where a value is None), a dot on each point."""
    values = [v for s in series for v in s.values if v is not None]
    top = nice_ceiling(max(values, default=0))
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = height - TOP - BOTTOM
    slot = plot_w / max(1, len(times))
    parts: list[SafeString] = []
    for s in series:
        runs: list[list[tuple[float, float]]] = [[]]
        dots = []
        for i, value in enumerate(s.values):
            if value is None:
                runs.append([])
                continue
            x = LEFT + slot * (i + 0.5)
            y = TOP + plot_h - plot_h * min(value, top) / top
            runs[-1].append((x, y))
            tip = f"{times[i]:%H:%M}: {s.label} {seconds_label(value, exact=True)}"
            dots.append((_n(x), _n(y), s.color, tip))
        dash = ' stroke-dasharray="4 3"' if s.dashed else ""
        for run in runs:
            if len(run) < 2:
                continue
            points = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
            parts.append(
                format_html(
                    '<polyline points="{}" fill="none" stroke="{}" stroke-width="2"{}/>',
                    points,
                    s.color,
                    mark_safe(dash),  # noqa: S308 - a constant
                )
            )
        parts.append(
            format_html_join(
                "",
                '<circle cx="{}" cy="{}" r="2.5" fill="{}"><title>{}</title></circle>',
                dots,
            )
        )
    body = format_html_join("", "{}", ((p,) for p in parts))
    return _frame(times, top, y_label, title, body, height)
