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

import numpy as np

MAX_POINTS_PER_TRACE = 2000
MIN_POINTS_PER_TRACE = 400
CHART_POINT_BUDGET = 12_000
SIGNIFICANT_DIGITS = 9
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
    highest point, in their original order, so the line still passes through every extreme.
    Buckets hold equal counts, not equal x spans, because x may go backwards (step numbers
    repeat after a restart resumes from a checkpoint). Lists or NumPy arrays; lists come back."""
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    values = np.array([np.nan if v is None else v for v in y], dtype=np.float64) if not (
        isinstance(y, np.ndarray)) else y.astype(np.float64, copy=False)
    valid = np.flatnonzero(np.isfinite(values))
    if len(valid) > max_points:
        buckets = max_points // 2
        bucket = np.arange(len(valid)) * buckets // len(valid)
        # Sorted by (bucket, y, position), each bucket's first entry is its minimum and its last
        # its maximum.
        order = np.lexsort((np.arange(len(valid)), values[valid], bucket))
        edges = np.flatnonzero(np.diff(bucket[order])) + 1
        firsts = order[np.concatenate(([0], edges))]
        lasts = order[np.concatenate((edges - 1, [len(order) - 1]))]
        valid = valid[np.union1d(firsts, lasts)]
    xs = x[valid].tolist() if isinstance(x, np.ndarray) else [x[i] for i in valid.tolist()]
    return xs, values[valid].tolist()


def points_per_trace(traces: int) -> int:
    """The points each of ``traces`` lines on one chart may have: the chart's budget shared out,
    between MIN_POINTS_PER_TRACE and MAX_POINTS_PER_TRACE. Sixteen ranks of 2,000 points made
    a 2.7 MB run page that took seconds to draw; the chart is under 1,000 pixels wide anyway."""
    if traces <= 0:
        return MAX_POINTS_PER_TRACE
    return max(MIN_POINTS_PER_TRACE, min(MAX_POINTS_PER_TRACE, CHART_POINT_BUDGET // traces))


def _rounded(values: list[float], digits: int = SIGNIFICANT_DIGITS) -> list[float]:
    """``values`` to ``digits`` significant digits of the largest one: the JSON of a point
    shrinks by about a third, and no chart can show the difference."""
    if not values:
        return values
    array = np.asarray(values, dtype=np.float64)
    largest = float(np.max(np.abs(array)))
    if largest == 0:
        return values
    decimals = digits - 1 - math.floor(math.log10(largest))
    return np.round(array, decimals).tolist()


def epoch_ms(ts: datetime) -> float:
    # Plotly reads numbers on a date axis as milliseconds since the epoch, in UTC; numbers are
    # a third of the size of ISO strings in the JSON.
    return ts.timestamp() * 1000.0


def rank_traces(
    series_by_rank: Mapping[int, Series], max_points: int | None = None
) -> list[dict[str, Any]]:
    """One line trace per rank, in rank order, each downsampled to ``max_points`` (by default
    the chart's point budget shared between its ranks)."""
    if max_points is None:
        max_points = points_per_trace(len(series_by_rank))
    traces = []
    for rank in sorted(series_by_rank):
        x, y = series_by_rank[rank]
        xs, ys = downsample_minmax(x, y, max_points)
        ys = _rounded(ys)
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


def _layout(title: str, x_title: str, y_title: str, *, x_is_time: bool,
            note: str = "") -> dict[str, Any]:
    axis = {
        "gridcolor": "#e6e9ef",
        "zeroline": False,
        "linecolor": "#c9ced8",
        "ticks": "outside",
        "tickcolor": "#c9ced8",
        "automargin": True,
    }
    return {
        "title": {"text": f"{title} <span style='font-size:11px;color:#6b7280'>{note}</span>"
                  if note else title, "x": 0, "xanchor": "left", "font": {"size": 13}},
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


def loss_figure(loss_by_rank: Mapping[int, Series], note: str = "") -> Figure:
    """Loss against step, one trace per rank. ``note`` says what a point is when it is not one
    step (a minute's mean, on long runs)."""
    return {
        "data": rank_traces(loss_by_rank),
        "layout": _layout("Loss", "step", "loss", x_is_time=False, note=note),
    }


def throughput_figure(rate_by_rank: Mapping[int, Series], unit: str, note: str = "") -> Figure:
    """Throughput against wall-clock time, one trace per rank; x values are datetimes, or Unix
    seconds as a NumPy array."""
    in_ms = {
        # Whole milliseconds: a date axis shows nothing finer, and integers are short in JSON.
        rank: (np.round(x * 1000.0).astype(np.int64) if isinstance(x, np.ndarray)
               else [round(epoch_ms(t)) for t in x], y)
        for rank, (x, y) in rate_by_rank.items()
    }
    return {
        "data": rank_traces(in_ms),
        "layout": _layout(f"Throughput per rank ({unit})", "time (UTC)", unit, x_is_time=True,
                          note=note),
    }


def step_duration_figure(duration_by_rank: Mapping[int, Series], note: str = "") -> Figure:
    """Step duration against step, one trace per rank: stragglers and slow steps stand out."""
    return {
        "data": rank_traces(duration_by_rank),
        "layout": _layout("Step duration", "step", "seconds", x_is_time=False, note=note),
    }
