"""Plotly figures for a run's Failures and Checkpoints pages, as plain dicts (see dashboard.charts):
where each attempt's time went, interruptions by root cause, and checkpoint saves over the run."""

from __future__ import annotations

from typing import Any

from collectors.analysis.checkpoints import CheckpointHistory
from collectors.analysis.goodput import BUCKET_LABELS, BUCKETS, RunGoodput
from collectors.analysis.root_causes import RootCauseTable
from dashboard.charts import _layout

Figure = dict[str, Any]

# Productive is green; each kind of badput has its own warm or grey colour, the same everywhere.
BUCKET_COLORS = {
    "productive": "#59a14f",
    "startup": "#9aa3b2",
    "checkpoint_save": "#4e79a7",
    "lost_progress": "#e15759",
    "restart_downtime": "#f28e2b",
    "stall": "#b07aa1",
}
COMPONENT_COLORS = {
    "GPU": "#e15759", "Network": "#f28e2b", "Host": "#edc948", "Storage": "#76b7b2",
    "Software": "#4e79a7", "Planned": "#9aa3b2", "Unknown": "#bab0ac",
}


def attempts_timeline_figure(goodput: RunGoodput) -> Figure:
    """One row per attempt, its wall clock cut into labelled segments (a Gantt chart): where the
    time went. Bars are placed on a date axis by their start (``base``) and length (ms)."""
    rows = {bucket: {"x": [], "base": [], "y": [], "customdata": []} for bucket in BUCKETS}
    for attempt in goodput.attempts:
        for bucket, start, end in attempt.segments:
            trace = rows[bucket]
            trace["x"].append((end - start) * 1000.0)
            trace["base"].append(start * 1000.0)
            trace["y"].append(f"attempt {attempt.number}")
            trace["customdata"].append(round(end - start, 1))
    data = [
        {"type": "bar", "orientation": "h", "name": BUCKET_LABELS[bucket],
         "x": rows[bucket]["x"], "base": rows[bucket]["base"], "y": rows[bucket]["y"],
         "customdata": rows[bucket]["customdata"],
         "marker": {"color": BUCKET_COLORS[bucket]},
         "hovertemplate": BUCKET_LABELS[bucket] + ": %{customdata} s<extra>%{y}</extra>"}
        for bucket in BUCKETS if rows[bucket]["x"]
    ]
    layout = _layout("Where the time went, per attempt", "time (UTC)", "", x_is_time=True)
    layout["barmode"] = "overlay"
    layout["hovermode"] = "closest"
    layout["yaxis"]["autorange"] = "reversed"
    layout["yaxis"]["title"] = {"text": ""}
    layout["height"] = max(160, 80 + 22 * len(goodput.attempts))
    return {"data": data, "layout": layout}


def root_cause_figure(table: RootCauseTable) -> Figure:
    """Interruptions per category, coloured by component, longest bar on top."""
    rows = list(reversed(table.rows))
    data = [{
        "type": "bar", "orientation": "h",
        "x": [r.count for r in rows], "y": [r.label for r in rows],
        "marker": {"color": [COMPONENT_COLORS.get(r.component, "#bab0ac") for r in rows]},
        "customdata": [[r.component, r.pct_of_unexpected, round(r.time_lost_s / 60, 1)]
                       for r in rows],
        "hovertemplate": ("%{y} (%{customdata[0]}): %{x} interruptions, "
                          "%{customdata[1]:.1f}% of unexpected, %{customdata[2]} min lost"
                          "<extra></extra>"),
        "name": "interruptions",
    }]
    layout = _layout("Interruptions by root cause", "interruptions", "", x_is_time=False)
    layout["showlegend"] = False
    layout["hovermode"] = "closest"
    if max((r.count for r in rows), default=0) <= 10:
        layout["xaxis"]["dtick"] = 1  # whole interruptions, not 0.5 of one
    layout["height"] = max(160, 60 + 26 * len(rows))
    return {"data": data, "layout": layout}


def checkpoint_figure(history: CheckpointHistory) -> Figure:
    """Two panels on one time axis: the interval since the previous save (top) and each save's
    blocking time, with restores' load times (bottom). Slow saves and irregular intervals stand
    out; a gap in the top line is a restart (the first save of an attempt has no interval)."""
    saves = history.saves
    x = [s.ts * 1000.0 for s in saves]
    data = [
        {"type": "bar", "name": "blocking save (s)", "x": x,
         "y": [s.duration_s for s in saves], "marker": {"color": "#4e79a7"},
         "hovertemplate": "save at step %{customdata}: %{y:.1f} s<extra></extra>",
         "customdata": [s.step for s in saves]},
        {"type": "scatter", "mode": "lines+markers", "name": "interval (min)", "x": x,
         "y": [s.interval_s / 60.0 if s.interval_s is not None else None for s in saves],
         "yaxis": "y2", "connectgaps": False, "line": {"color": "#f28e2b", "width": 1.5},
         "marker": {"size": 5},
         "hovertemplate": "interval: %{y:.1f} min<extra></extra>"},
    ]
    restores = history.restores
    if restores:
        data.append({
            "type": "scatter", "mode": "markers", "name": "restore (load s)",
            "x": [r.ts * 1000.0 for r in restores], "y": [r.duration_s or 0 for r in restores],
            "marker": {"color": "#e15759", "size": 9, "symbol": "triangle-up"},
            "customdata": [[r.step, r.steps_lost] for r in restores],
            "hovertemplate": "restore of step %{customdata[0]}, %{customdata[1]} steps lost"
                             "<extra></extra>"})
    layout = _layout("Checkpoints over the run", "time (UTC)", "blocking (s)", x_is_time=True)
    layout["yaxis"].update(domain=[0, 0.46], rangemode="tozero")
    layout["yaxis2"] = {**layout["yaxis"], "title": {"text": "interval (min)"},
                        "domain": [0.56, 1], "anchor": "x", "rangemode": "tozero"}
    layout["hovermode"] = "closest"
    layout["height"] = 320
    return {"data": data, "layout": layout}
