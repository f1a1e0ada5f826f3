"""Plotly figures for a run's GPU health page, as plain dicts (see dashboard.charts): heatmaps of
temperature and power per GPU over time. Rows are GPUs (``host:gpu``), columns time buckets sized so
that the grid stays within some 50,000 cells however many GPUs the run has."""

from __future__ import annotations

from typing import Any

from collectors.analysis.gpu_health import Heatmap
from dashboard.charts import _layout

Figure = dict[str, Any]

ROW_PX = 6
MIN_HEIGHT_PX = 260
MAX_HEIGHT_PX = 900


def heatmap_figure(grid: Heatmap, which: str) -> Figure:
    """``which``: "temp" (°C) or "power" (W)."""
    if which not in ("temp", "power"):
        raise ValueError("which must be 'temp' or 'power'.")
    z = grid.temp_c if which == "temp" else grid.power_w
    unit = "°C" if which == "temp" else "W"
    title = ("GPU temperature" if which == "temp" else "GPU power") + \
        f" (mean per {_width(grid.bucket_s)})"
    data = [{
        "type": "heatmap",
        "x": [b * 1000.0 for b in grid.buckets],
        "y": grid.gpus,
        "z": z,
        "colorscale": "YlOrRd" if which == "temp" else "Viridis",
        # Plotly's YlOrRd runs red to yellow; hot must be red.
        "reversescale": which == "temp",
        "colorbar": {"title": {"text": unit}, "thickness": 12},
        "hoverongaps": False,
        "hovertemplate": "%{y}<br>%{x}<br>%{z:.1f} " + unit + "<extra></extra>",
    }]
    layout = _layout(title, "time (UTC)", "", x_is_time=True)
    layout["height"] = max(MIN_HEIGHT_PX, min(MAX_HEIGHT_PX, 80 + ROW_PX * len(grid.gpus)))
    layout["yaxis"]["autorange"] = "reversed"  # first GPU of the order at the top
    layout["yaxis"]["type"] = "category"
    layout["hovermode"] = "closest"
    layout["showlegend"] = False
    return {"data": data, "layout": layout}


def _width(seconds: float) -> str:
    if seconds % 86_400 == 0:
        return f"{int(seconds // 86_400)} d"
    if seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 60)} min"
