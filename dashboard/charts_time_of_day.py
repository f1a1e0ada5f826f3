"""Plotly figures for a run's Time of day and Stragglers pages, as plain dicts (see dashboard.charts).

Every trace is small by construction: 24 hours, one line of 24 per local day (at most
``time_of_day.MAX_OVERLAY_DAYS``), one bar per rank (min/max-downsampled past
``MAX_POINTS_PER_TRACE`` ranks so a straggler's bar survives), and a pre-binned histogram."""

from __future__ import annotations

import math
from typing import Any

from collectors.analysis.stragglers import StragglerReport
from collectors.analysis.time_of_day import TimeOfDay
from dashboard.charts import MAX_POINTS_PER_TRACE, _layout, downsample_minmax

Figure = dict[str, Any]

HOURS = list(range(24))
HOUR_TICKS = {"tickmode": "array", "tickvals": list(range(0, 24, 3)),
              "ticktext": [f"{h:02d}:00" for h in range(0, 24, 3)], "range": [-0.6, 23.6]}
SLOW_COLOR = "#e15759"
FAST_COLOR = "#59a14f"
TEMP_COLOR = "#f28e2b"
NEUTRAL_COLOR = "#4e79a7"
HISTOGRAM_BINS = 40
CATEGORY_AXIS_MAX_RANKS = 128


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def hourly_figure(result: TimeOfDay) -> Figure:
    """Bars: throughput per local hour as % from the run median (red below, green above); line:
    mean GPU temperature on the right axis."""
    deviation = [_round(v) for v in result.hourly_deviation_pct]
    data: list[dict[str, Any]] = [{
        "type": "bar", "name": "throughput vs median (%)", "x": HOURS, "y": deviation,
        "marker": {"color": [SLOW_COLOR if (v or 0) < 0 else FAST_COLOR for v in deviation]},
        "customdata": [[_round(r, 1), n] for r, n in zip(result.hourly_rate, result.hourly_minutes,
                                                        strict=True)],
        "hovertemplate": ("%{x}:00 · %{y:+.2f}% (%{customdata[0]:,} " + result.unit
                          + ", %{customdata[1]} min)<extra></extra>"),
    }]
    if any(t is not None for t in result.hourly_temp_c):
        data.append({
            "type": "scatter", "mode": "lines+markers", "name": "mean GPU temperature (°C)",
            "x": HOURS, "y": [_round(t, 2) for t in result.hourly_temp_c], "yaxis": "y2",
            "line": {"color": TEMP_COLOR, "width": 2}, "marker": {"size": 5},
            "hovertemplate": "%{x}:00 · %{y:.1f} °C<extra></extra>"})
    layout = _layout(f"Throughput by hour of the day ({result.timezone})", "local hour",
                     "% from run median", x_is_time=False)
    layout["xaxis"].update(HOUR_TICKS)
    layout["yaxis"].update(zeroline=True, zerolinecolor="#9aa3b2", ticksuffix="%")
    layout["yaxis2"] = {**{k: v for k, v in layout["yaxis"].items() if k != "zeroline"},
                        "title": {"text": "GPU temperature"}, "overlaying": "y", "side": "right",
                        "showgrid": False, "ticksuffix": " °C", "tickformat": ".1f"}
    layout["margin"]["r"] = 56
    layout["hovermode"] = "x unified"
    layout["height"] = 320
    return {"data": data, "layout": layout}


def overlay_figure(result: TimeOfDay) -> Figure:
    """One thin line per local day, the all-days median on top: does every day dip, or one?"""
    data: list[dict[str, Any]] = []
    last = len(result.days) - 1
    for i, day in enumerate(result.days):
        # Older days fade, so the latest stands out when there are many.
        opacity = 0.35 + 0.5 * (i / last if last else 1)
        data.append({
            "type": "scatter", "mode": "lines", "name": day.day.isoformat(), "x": HOURS,
            "y": [_round(v) for v in day.deviation_pct], "opacity": round(opacity, 2),
            "line": {"width": 1.2, "color": NEUTRAL_COLOR}, "connectgaps": False,
            "hovertemplate": day.day.isoformat() + " %{x}:00 · %{y:+.2f}%<extra></extra>"})
    data.append({
        "type": "scatter", "mode": "lines", "name": "all days (median)", "x": HOURS,
        "y": [_round(v) for v in result.hourly_deviation_pct],
        "line": {"width": 3, "color": "#2b303b"},
        "hovertemplate": "all days %{x}:00 · %{y:+.2f}%<extra></extra>"})
    layout = _layout("Each local day", "local hour", "% from run median", x_is_time=False)
    layout["xaxis"].update(HOUR_TICKS)
    layout["yaxis"].update(zeroline=True, zerolinecolor="#9aa3b2", ticksuffix="%")
    layout["hovermode"] = "closest"
    layout["showlegend"] = len(result.days) <= 8
    layout["height"] = 320
    return {"data": data, "layout": layout}


def rank_step_figure(report: StragglerReport) -> Figure:
    """Mean step time of every rank (bars, stragglers in red) against the median over ranks."""
    ranks = [r.rank for r in report.ranks]
    means = [r.mean_step_s for r in report.ranks]
    xs, ys = downsample_minmax(ranks, means, MAX_POINTS_PER_TRACE)
    flagged = report.flagged_ranks
    median = report.median_rank_step_s
    data: list[dict[str, Any]] = [{
        "type": "bar", "name": "mean step time", "x": xs, "y": [round(y, 4) for y in ys],
        "marker": {"color": [SLOW_COLOR if x in flagged else NEUTRAL_COLOR for x in xs]},
        "hovertemplate": "rank %{x}: %{y:.3f} s<extra></extra>"}]
    if median is not None and ranks:
        data.append({
            "type": "scatter", "mode": "lines", "name": f"median {median:.3f} s",
            "x": [min(ranks) - 0.5, max(ranks) + 0.5], "y": [median, median],
            "line": {"color": "#2b303b", "dash": "dash", "width": 1.5}, "hoverinfo": "skip"})
    layout = _layout("Step time by rank (mean over the run)", "rank", "seconds", x_is_time=False)
    layout["hovermode"] = "closest"
    layout["bargap"] = 0.1 if len(xs) < 100 else 0
    if len(xs) <= CATEGORY_AXIS_MAX_RANKS:
        # Ranks that report steps are often a sample (one per host): no gaps between their bars.
        layout["xaxis"].update(type="category")
        data[0]["x"] = [str(x) for x in xs]
        if len(data) > 1:
            data[1]["x"] = [str(xs[0]), str(xs[-1])]
    if means:
        low, high = min(means), max(means)
        pad = max((high - low) * 0.15, high * 0.01)
        # Bars from zero would flatten a 5% difference into nothing; start near the fastest rank.
        layout["yaxis"]["range"] = [max(0.0, low - pad), high + pad]
    layout["height"] = 300
    return {"data": data, "layout": layout}


def excess_histogram_figure(report: StragglerReport, bins: int = HISTOGRAM_BINS) -> Figure:
    """How many ranks sit how far above (or below) the minute medians, binned on the server so the
    trace has ``bins`` bars whatever the number of ranks; the straggler line marks the threshold."""
    excess = [r.excess_pct for r in report.ranks]
    data: list[dict[str, Any]] = []
    if excess:
        low, high = min(excess + [0.0]), max(excess + [report.slow_pct])
        width = (high - low) / bins or 1.0
        counts = [0] * bins
        for value in excess:
            counts[min(bins - 1, int(math.floor((value - low) / width)))] += 1
        centers = [round(low + (i + 0.5) * width, 4) for i in range(bins)]
        data.append({
            "type": "bar", "name": "ranks", "x": centers, "y": counts, "width": width * 0.95,
            "marker": {"color": [SLOW_COLOR if c >= report.slow_pct else NEUTRAL_COLOR
                                 for c in centers]},
            "hovertemplate": "%{x:.2f}% above median: %{y} ranks<extra></extra>"})
    layout = _layout("Ranks by mean excess over the minute median", "% above the minute median",
                     "ranks", x_is_time=False)
    layout["xaxis"]["ticksuffix"] = "%"
    layout["hovermode"] = "closest"
    layout["showlegend"] = False
    layout["shapes"] = [{"type": "line", "xref": "x", "yref": "paper", "x0": report.slow_pct,
                         "x1": report.slow_pct, "y0": 0, "y1": 1,
                         "line": {"color": SLOW_COLOR, "dash": "dot", "width": 1.5}}]
    layout["height"] = 300
    return {"data": data, "layout": layout}
