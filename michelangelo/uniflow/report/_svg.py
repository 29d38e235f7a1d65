"""Plots as inline SVG, drawn in Python: a run report needs no script and no network."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#17becf")
STATE_COLOURS = {
    "succeeded": "#2ca02c",
    "failed": "#d62728",
    "running": "#ff7f0e",
    "pending": "#bbbbbb",
    "cached": "#17becf",
    "reused": "#17becf",
}


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round numbers spanning ``[low, high]``."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 0.5 and len(ticks) < 50:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.2g}"
    return f"{value:.4g}"


def line_chart(series: dict[str, Sequence[tuple[float, float]]], *, title: str,
               x_label: str = "step", width: int = 640, height: int = 260) -> str:
    """One SVG line chart; each series is ``[(x, y), ...]``."""
    left, right, top, bottom = 64, 16, 28, 40
    points = [p for values in series.values() for p in values]
    if not points:
        return ""
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x_ticks, y_ticks = nice_ticks(min(xs), max(xs)), nice_ticks(min(ys), max(ys))
    x0, x1 = x_ticks[0], x_ticks[-1]
    y0, y1 = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(x: float) -> float:
        return left + (x - x0) / ((x1 - x0) or 1) * plot_w

    def sy(y: float) -> float:
        return top + plot_h - (y - y0) / ((y1 - y0) or 1) * plot_h

    out = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="{html.escape(title)}">',
           f'<text x="{left}" y="16" class="title">{html.escape(title)}</text>',
           f'<rect class="plot" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" '
           'fill="#fafafa" stroke="#cccccc"/>']
    for tick in y_ticks:
        y = sy(tick)
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                   'stroke="#e4e4e4"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" '
                   f'class="tick">{_label(tick)}</text>')
    for tick in x_ticks:
        x = sx(tick)
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
                   f'class="tick">{_label(tick)}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle" '
               f'class="axis">{html.escape(x_label)}</text>')
    for index, (name, values) in enumerate(series.items()):
        colour = PALETTE[index % len(PALETTE)]
        ordered = sorted(values)
        if len(ordered) == 1:
            x, y = ordered[0]
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{colour}"/>')
        else:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ordered)
            out.append(f'<polyline class="series" fill="none" stroke="{colour}" '
                       f'stroke-width="2.5" points="{path}"/>')
            if len(ordered) <= 30:
                out += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}"/>'
                        for x, y in ordered]
        legend_y = top + 14 + 16 * index
        out.append(f'<rect x="{left + plot_w - 150}" y="{legend_y - 9}" width="10" height="10" '
                   f'fill="{colour}"/><text x="{left + plot_w - 136}" y="{legend_y}" '
                   f'class="legend">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def timeline(rows: Sequence[dict], *, start: float, end: float, width: int = 900) -> str:
    """A Gantt chart: one bar per task call from its start to its end, coloured by state.

    Each row is ``{"label", "start", "end", "state", "note"}`` (times in epoch seconds).
    """
    if not rows:
        return ""
    left, right, top, row_h = 170, 24, 24, 26
    span = max(end - start, 1e-3)
    plot_w = width - left - right
    height = top + row_h * len(rows) + 34
    ticks = nice_ticks(0.0, span)

    def sx(t: float) -> float:
        return left + min(max(t - start, 0.0), ticks[-1]) / (ticks[-1] or 1) * plot_w

    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
           'aria-label="task timeline">']
    for tick in ticks:
        x = left + tick / (ticks[-1] or 1) * plot_w
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top - 6}" '
                   f'y2="{top + row_h * len(rows)}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x:.1f}" y="{top + row_h * len(rows) + 16}" '
                   f'text-anchor="middle" class="tick">{_label(tick)}s</text>')
    for index, row in enumerate(rows):
        y = top + index * row_h
        colour = STATE_COLOURS.get(row.get("state", ""), "#888888")
        x0 = sx(row["start"]) if row.get("start") else left
        x1 = sx(row["end"]) if row.get("end") else x0
        bar_w = max(x1 - x0, 3.0)
        out.append(f'<text x="{left - 8}" y="{y + 17}" text-anchor="end" '
                   f'class="rowlabel">{html.escape(row["label"])}</text>')
        out.append(f'<rect class="bar" x="{x0:.1f}" y="{y + 4}" width="{bar_w:.1f}" '
                   f'height="{row_h - 8}" rx="3" fill="{colour}">'
                   f'<title>{html.escape(row.get("note", ""))}</title></rect>')
        note = row.get("note", "")
        if note:
            out.append(f'<text x="{x0 + bar_w + 6:.1f}" y="{y + 17}" '
                       f'class="note">{html.escape(note)}</text>')
    out.append("</svg>")
    return "\n".join(out)
