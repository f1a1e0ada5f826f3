"""Plotly figures for a run's Power page, as plain dicts (see dashboard.charts): cluster power over
time with its swings marked, and the distribution of swing sizes.

Every line is downsampled with collectors.analysis.downsample (each bucket's min and max kept), so
the 40-second dip of a checkpoint on a three-day chart is as deep as it was."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collectors.analysis.downsample import break_gaps, downsample
from collectors.analysis.power import PowerSeries, Swing, SwingHistogram
from dashboard.charts import MAX_POINTS_PER_TRACE, _layout

Figure = dict[str, Any]

CAUSE_COLORS = {
    "checkpoint": "#4e79a7",
    "interruption": "#e15759",
    "restart": "#f28e2b",
    "stall": "#b07aa1",
    None: "#9aa3b2",
}
LINE_COLOR = "#2b303b"
DETAIL_COLOR = "#59a14f"


def series_trace(series: PowerSeries, name: str, color: str, *, width: float = 1.2,
                 max_points: int = MAX_POINTS_PER_TRACE) -> dict[str, Any]:
    """A line of the series, downsampled, broken where telemetry stopped for longer than 3
    grid steps (a gap is drawn as a gap, not as a straight line)."""
    x_ms = series.times * 1000.0
    xs, ys = downsample(x_ms, series.kw, max_points)
    xs, ys = break_gaps(xs, ys, max_gap=3 * series.step_s * 1000.0 + 1.0)
    return {
        "type": "scattergl" if len(xs) > 5000 else "scatter", "mode": "lines", "name": name,
        "x": xs, "y": [None if v is None else round(v, 3) for v in ys],
        "line": {"color": color, "width": width},
        "hovertemplate": "%{y:.1f} kW<extra>" + name + "</extra>",
    }


def power_figure(series: PowerSeries, swings: Sequence[Swing], *,
                 detail: Sequence[PowerSeries] = (), per_minute: bool = False) -> Figure:
    """Cluster power (kW) against time, one marker per swing at its end, coloured by cause.
    ``detail``: per-second series around the swings, drawn over a per-minute line."""
    name = "mean per minute" if per_minute else "per second"
    data = [series_trace(series, f"cluster power ({name})", LINE_COLOR)]
    if detail:
        data.append(_detail_trace(detail))
    by_cause: dict[str | None, list[Swing]] = {}
    for swing in swings:
        by_cause.setdefault(swing.cause, []).append(swing)
    for cause, found in by_cause.items():
        data.append({
            "type": "scatter", "mode": "markers", "name": f"swing: {cause or 'no known cause'}",
            "x": [s.end * 1000.0 for s in found], "y": [round(s.to_kw, 2) for s in found],
            "marker": {"color": CAUSE_COLORS.get(cause, CAUSE_COLORS[None]), "size": 10,
                       "symbol": ["triangle-up" if s.delta_kw > 0 else "triangle-down" for s in found],
                       "line": {"color": "#ffffff", "width": 1}},
            "customdata": [[round(s.delta_kw, 1), round(s.rate_kw_s, 2), round(s.duration_s, 1),
                            _what(s)] for s in found],
            "hovertemplate": ("%{customdata[0]:+.1f} kW in %{customdata[2]} s "
                              "(%{customdata[1]:+.2f} kW/s)<br>%{customdata[3]}<extra></extra>"),
        })
    layout = _layout("Cluster power (sum over GPUs, samples carried forward)", "time (UTC)", "kW",
                     x_is_time=True)
    layout["height"] = 320
    layout["hovermode"] = "closest"
    return {"data": data, "layout": layout}


def histogram_figure(histogram: SwingHistogram, *, per_minute: bool = False) -> Figure:
    """Counts of rises and falls by size, side by side on shared bins."""
    edges = histogram.edges_kw
    centers = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:], strict=False)]
    width = (edges[1] - edges[0]) if len(edges) > 1 else 1.0
    labels = [f"{a:.0f}–{b:.0f} kW" for a, b in zip(edges[:-1], edges[1:], strict=False)]
    data = [
        {"type": "bar", "name": "falls", "x": centers, "y": histogram.falls, "width": width * 0.45,
         "offset": -width * 0.45, "marker": {"color": "#e15759"}, "customdata": labels,
         "hovertemplate": "%{y} falls of %{customdata}<extra></extra>"},
        {"type": "bar", "name": "rises", "x": centers, "y": histogram.rises, "width": width * 0.45,
         "offset": 0, "marker": {"color": "#59a14f"}, "customdata": labels,
         "hovertemplate": "%{y} rises of %{customdata}<extra></extra>"},
    ]
    title = "Swing sizes" + (" (per-minute means, whole run)" if per_minute else "")
    layout = _layout(title, "|swing| (kW)", "swings", x_is_time=False)
    layout["hovermode"] = "closest"
    layout["barmode"] = "overlay"
    return {"data": data, "layout": layout}


def _what(swing: Swing) -> str:
    if not swing.happenings:
        return "nothing reported at that time"
    return "; ".join(h.label or h.kind for h in swing.happenings[:3])


def _detail_trace(parts: Sequence[PowerSeries]) -> dict[str, Any]:
    """Per-second pieces as one trace, each downsampled on its own budget (so a five-minute piece
    keeps its shape on a three-day axis), with a break between pieces."""
    budget = max(100, MAX_POINTS_PER_TRACE // max(1, len(parts)))
    xs: list[float | None] = []
    ys: list[float | None] = []
    for part in sorted(parts, key=lambda p: p.start):
        trace = series_trace(part, "", DETAIL_COLOR, max_points=budget)
        if xs:
            xs.append(xs[-1])
            ys.append(None)
        xs.extend(trace["x"])
        ys.extend(trace["y"])
    name = "per second around swings"
    return {"type": "scatter", "mode": "lines", "name": name, "x": xs, "y": ys,
            "line": {"color": DETAIL_COLOR, "width": 1.0},
            "hovertemplate": "%{y:.1f} kW<extra>" + name + "</extra>"}
