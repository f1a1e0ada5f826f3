"""Plotly figures for the run page, as plain dicts ready for JSON and `Plotly.react`.

Every trace is downsampled server-side so a refresh costs the same at step 100 and at step 10^6.
The downsampler keeps each bucket's minimum and maximum rather than a mean or every n-th point:
the spike a training engineer is looking for (a loss blow-up, a step that took 40 s) survives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

MAX_POINTS_PER_TRACE = 2000
# Two rows of charts under the run header fit a laptop screen (1280x800).
CHART_HEIGHT_PX = 250

# Colour per rank, the same on every chart so rank 3 is one colour everywhere (Tableau 10).
_PALETTE = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)

Figure = dict[str, Any]
Series = tuple[Sequence[Any], Sequence[float | None]]


def rank_color(rank: int) -> str:
    return _PALETTE[rank % len(_PALETTE)]


def downsample_minmax(
    x: Sequence[Any], y: Sequence[float | None], max_points: int = MAX_POINTS_PER_TRACE
) -> tuple[list[Any], list[float]]:
    """At most ``max_points`` points of (x, y), keeping each bucket's min and max in x order.

    Points without a finite y are dropped first (they would not be drawn anyway). The rest are cut
    into max_points // 2 buckets of consecutive points; each bucket contributes its lowest and
    highest point, in their original order, so the line still passes through every extreme."""
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    points = [(xi, yi) for xi, yi in zip(x, y, strict=True) if _finite(yi)]
    if len(points) <= max_points:
        return [p[0] for p in points], [float(p[1]) for p in points]
    buckets = max_points // 2
    out_x: list[Any] = []
    out_y: list[float] = []
    n = len(points)
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        chunk = range(lo, hi)
        i_min = min(chunk, key=lambda i: points[i][1])
        i_max = max(chunk, key=lambda i: points[i][1])
        for i in sorted({i_min, i_max}):
            out_x.append(points[i][0])
            out_y.append(float(points[i][1]))
    return out_x, out_y


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def epoch_ms(ts: datetime) -> float:
    # Plotly reads numbers on a date axis as milliseconds since the epoch, in UTC; numbers are
    # a third of the size of ISO strings in the JSON.
    return ts.timestamp() * 1000.0


def rank_traces(
    series_by_rank: Mapping[int, Series], max_points: int = MAX_POINTS_PER_TRACE
) -> list[dict[str, Any]]:
    """One line trace per rank, in rank order, each downsampled to ``max_points``."""
    traces = []
    for rank in sorted(series_by_rank):
        x, y = series_by_rank[rank]
        xs, ys = downsample_minmax(x, y, max_points)
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"rank {rank}",
                "x": xs,
                "y": ys,
                "line": {"color": rank_color(rank), "width": 1.5},
                "hovertemplate": "%{y:.4~g}",
            }
        )
    return traces


def _layout(title: str, x_title: str, y_title: str, *, x_is_time: bool) -> dict[str, Any]:
    axis = {
        "gridcolor": "#e6e9ef",
        "zeroline": False,
        "linecolor": "#c9ced8",
        "ticks": "outside",
        "tickcolor": "#c9ced8",
        "automargin": True,
    }
    return {
        "title": {"text": title, "x": 0, "xanchor": "left", "font": {"size": 13}},
        "xaxis": {**axis, "title": {"text": x_title}, **({"type": "date"} if x_is_time else {})},
        "yaxis": {**axis, "title": {"text": y_title}},
        "margin": {"l": 56, "r": 16, "t": 32, "b": 36},
        "height": CHART_HEIGHT_PX,
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "font": {
            "family": "-apple-system, BlinkMacSystemFont, 'Segoe UI', Roboto, sans-serif",
            "size": 11,
            "color": "#2b303b",
        },
        "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 1, "xanchor": "right"},
        "hovermode": "x unified",
        # A refresh must not undo the user's zoom or hidden ranks.
        "uirevision": title,
    }


def loss_figure(loss_by_rank: Mapping[int, Series]) -> Figure:
    """Loss against step, one trace per rank."""
    return {
        "data": rank_traces(loss_by_rank),
        "layout": _layout("Loss", "step", "loss", x_is_time=False),
    }


def throughput_figure(rate_by_rank: Mapping[int, Series], unit: str) -> Figure:
    """Per-step throughput against wall-clock time, one trace per rank; x values are datetimes."""
    in_ms = {
        rank: ([epoch_ms(t) for t in x], y) for rank, (x, y) in rate_by_rank.items()
    }
    return {
        "data": rank_traces(in_ms),
        "layout": _layout(f"Throughput per rank ({unit})", "time (UTC)", unit, x_is_time=True),
    }


def step_duration_figure(duration_by_rank: Mapping[int, Series]) -> Figure:
    """Step duration against step, one trace per rank: stragglers and slow steps stand out."""
    return {
        "data": rank_traces(duration_by_rank),
        "layout": _layout("Step duration", "step", "seconds", x_is_time=False),
    }
